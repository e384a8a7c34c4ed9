"""Shards of the tiny video and audio models merge to the single process's bytes (rows.jsonl,
summary.json, report.md) and write the same artifacts. The text model's shards, their baselines and
N = 1 are in test_shard.py; here the shard folders start from the single run's stored baselines
(what a resumed run reads back), so that each shard count costs only the codec rollouts."""
from __future__ import annotations

import shutil

import pytest
from helpers.run_folder import run_bytes

from harness.run.config import RunConfig
from harness.runner import run
from harness.run.plan import read_plan
from harness.scale.shard import Shard, shard_files

FILES = ("rows.jsonl", "summary.json", "report.md")
QUIET = dict(progress=False, log=lambda *_: None)
SCALES = (1, 2, 4, 8)
CONFIGS = {
    "video": dict(model="causvid-tiny", tasks=["video"], task_options={"video": {"stills": "2"}}),
    "audio": dict(model="aar-tiny", tasks=["audio"], prompts="synthetic",
                  task_options={"audio": {"clip_seconds": "1", "top_k": "8", "save_audio": "false"}}),
}


def _model(modality: str):
    if modality == "video":
        from adapters.wan import CAUSVID, build_random, tiny_spec

        return build_random(tiny_spec(CAUSVID, num_frames=6), seed=3)
    from adapters.aar import AARConfig, SATConfig, random_pipeline

    return random_pipeline(AARConfig(depth=2, width=64, num_heads=2, vocab=32, latent_dim=8, scales=SCALES),
                           SATConfig(dimension=8, latent_dim=8, n_filters=2, lstm=1, codebook_size=32, scales=SCALES),
                           seed=0, name="test-aar")


def _config(modality: str) -> RunConfig:
    # two prompts, one codec row each (no 'none' row): three shards leave one shard with nothing to run
    return RunConfig(**CONFIGS[modality], codecs=["octopus"], bits=[2], limit=2, codec_seeds=[0], baseline=False)


def _artifacts(out):
    return sorted(str(p.relative_to(out)) for d in ("video", "audio") if (out / d).exists()
                  for p in (out / d).rglob("*") if p.is_file())


@pytest.mark.slow
@pytest.mark.parametrize("modality", ["video", "audio"])
def test_shards_merge_to_the_single_process_bytes(modality, tmp_path, monkeypatch):
    import harness.tasks.video as video

    # a drift plot (matplotlib, a few tenths of a second a row) is compared by its name only: an empty file
    monkeypatch.setattr(video, "write_drift_plot", lambda path, *a, **k: path.write_bytes(b""))
    model = _model(modality)
    single = run(_config(modality), out=tmp_path / "single", model=model, **QUIET)
    for count in (2, 3):
        out = tmp_path / f"shards-{count}"
        out.mkdir()
        shutil.copy(single / "config.json", out)
        shutil.copytree(single / "baselines", out / "baselines")
        for i in range(count):
            run(_config(modality), out=out, model=model, shard=Shard(i, count), **QUIET)
        assert run_bytes(out, FILES) == run_bytes(single, FILES)
        assert _artifacts(out) == _artifacts(single) and not shard_files(out)
        owners = read_plan(out).owners(count)[0]
        assert sorted(owners) == list(range(min(count, 2)))  # the two prompts went to two different shards
