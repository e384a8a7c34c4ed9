"""Codec seeds apart from the prompt seed: ``--codec-seeds`` redraws what is random inside a codec
(rotation signs, projections), ``--seed`` what is random in the prompts (needles, haystack), and
neither moves the other."""
from __future__ import annotations

import pytest
from helpers.tiny_lm import tiny_causal_lm

from harness.run.config import RunConfig, seeded
from harness.run.rows import read_rows
from harness.runner import run
from harness.tasks import get_task
from kernels import make_codec

TEXT = ("The quick brown fox jumps over the lazy dog. A stitch in time saves nine. " * 60).strip()


@pytest.fixture(scope="module")
def lm():
    return tiny_causal_lm("qwen2")


def _run(lm, tmp_path, name, **kw):
    f = tmp_path / "fox.txt"
    f.write_text(TEXT)
    config = RunConfig(**{**dict(model="hf", model_path="(tiny)", tasks=["needle"], codecs=["octopus", "kivi"],
                                 bits=[2], prompts=str(f), limit=1, residual=8, codec_seeds=[0, 1],
                                 task_options={"needle": {"contexts": [520], "depths": [0.5], "max_new_tokens": 3}}),
                          **kw})
    out = run(config, out=tmp_path / name, model=lm, progress=False, log=lambda *_: None)
    (baseline,) = (out / "baselines" / "needle").iterdir()
    rows = {(r["label"], r["codec_seed"]): r for r in read_rows(out / "rows.jsonl")}
    return rows, get_task("needle")().load_baseline(baseline)


def test_codec_seeds_redraw_the_codec_and_leave_the_prompt(lm, tmp_path):
    rows, baseline = _run(lm, tmp_path, "a")
    # a randomized codec runs once per codec seed; a deterministic one and the baseline once
    assert set(rows) == {("none", 0), ("octopus@2", 0), ("octopus@2", 1), ("kivi@2", 0)}
    o0, o1 = rows[("octopus@2", 0)], rows[("octopus@2", 1)]
    assert (o0["codec_config"]["seed"], o1["codec_config"]["seed"]) == (0, 1)
    # the prompt is the same (one baseline, the same needle and tokens) ...
    assert o0["tokens"] == o1["tokens"] and o0["baseline_exact_match"] == o1["baseline_exact_match"]
    # ... while the codec's draws differ: the two seeds' rotations give other keys, so other scores
    assert o0["kl"] != o1["kl"]

    # another prompt seed: another needle (its value and prompt tokens), the same codec draws
    other, other_baseline = _run(lm, tmp_path, "b", seed=1)
    assert other[("octopus@2", 0)]["codec_config"] == o0["codec_config"]
    assert other_baseline["value"] != baseline["value"] and other_baseline["ids_sha"] != baseline["ids_sha"]


def test_seeded_configs_really_rotate_differently():
    from adapters.cache.config import CacheConfig

    configs = seeded(CacheConfig(codec="octopus", bits=3), [4, 7])
    assert [c.seed for c in configs] == [4, 7]
    signs = [make_codec(c.codec_config(64, 2)).rot.signs for c in configs]
    assert signs[0].shape == signs[1].shape and not (signs[0] == signs[1]).all()
    assert [c.seed for c in seeded(CacheConfig(codec="kivi", bits=3), [4, 7])] == [4]
    # the run's prompt seed never reaches a codec: its config takes the first codec seed
    cfg = RunConfig(codecs=["octopus"], bits=[3], seed=9, codec_seeds=[4, 7]).cache_configs()
    assert [c.seed for c in cfg] == [4, 4]
