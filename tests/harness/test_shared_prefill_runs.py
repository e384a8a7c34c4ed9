"""Every task and modality: a run with the shared first step (``share_prefill``) writes rows.jsonl and
summary.json byte-identical to a run that computes it through each configuration's cache, and computes
that step once per prompt batch. The count is of the model's own forwards into an empty cache (the
step no codec can touch), wrapped here: shared, one per batch (its baseline's); unshared, one per
rollout: the baseline's and each configuration's (audio: a free-running and a teacher-forced one)."""
from __future__ import annotations

import json

import pytest
import torch
from helpers.tiny_lm import tiny_causal_lm

from harness.run.config import RunConfig
from harness.run.rows import read_rows
from harness.runner import run
from kernels import codec_class

RANDOMIZED, PLAIN = "octopus", "polarquant-2d"  # two codec seeds of the first, one run of the second
CODEC_SEEDS = [0, 1]
ROLLOUTS = 1 + 1 + len(CODEC_SEEDS)  # per batch: none, kivi, octopus x 2 (the baseline's comes on top)
TEXT = ("It was a bright cold day in April, and the clocks were striking thirteen. Winston Smith, his chin "
        "nuzzled into his breast in an effort to escape the vile wind, slipped quickly through the glass doors. ") * 30


def test_the_codecs_are_one_randomized_and_one_not():
    assert codec_class(RANDOMIZED).randomized and not codec_class(PLAIN).randomized


def _runs(model, config: RunConfig, tmp_path, count: list) -> dict[bool, tuple[bytes, bytes, list, int]]:
    """share_prefill on, then off: (rows.jsonl bytes, summary.json bytes, speed lines, prefills counted)."""
    out = {}
    for share in (True, False):
        model.share_prefill = share
        count.clear()
        folder = run(config, out=tmp_path / f"share-{share}", model=model, progress=False, log=lambda *_: None)
        out[share] = ((folder / "rows.jsonl").read_bytes(), (folder / "summary.json").read_bytes(),
                      read_rows(folder / "speed.jsonl"), len(count))
    model.share_prefill = True
    return out


def _check(runs: dict, batches: int, per_rollout: int, rollouts_per_config: int = 1) -> list[dict]:
    (rows, summary, speed, shared), (rows_off, summary_off, speed_off, unshared) = runs[True], runs[False]
    assert rows == rows_off and summary == summary_off
    assert shared == batches * per_rollout  # the baseline's, replayed by every configuration
    assert unshared == batches * per_rollout * (1 + ROLLOUTS * rollouts_per_config)
    # a timed rollout that replayed the shared step records the step's seconds apart from its own replay
    # (and encode), the step's the same in every rollout of its batch: the batch's cost, paid once
    assert speed and all(s["prefill_s"] > 0 and s["prefill_shared"] and s["shared_forward_s"] > 0 for s in speed)
    by_batch = {}
    for s in speed:
        by_batch.setdefault((s["task"], s["rollout"]), set()).add(s["shared_forward_s"])
    assert all(len(seconds) == 1 for seconds in by_batch.values())
    assert all(s["prefill_s"] > 0 and not s["prefill_shared"] and s["shared_forward_s"] is None for s in speed_off)
    table = [json.loads(line) for line in rows.decode().splitlines()]
    assert {r["label"] for r in table} == {"none", f"{PLAIN}@2", f"{RANDOMIZED}@2"}
    assert len(table) == len(speed) and {r["codec_seed"] for r in table if r["label"] == f"{RANDOMIZED}@2"} == {0, 1}
    return table


# --- text ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def lm():
    return tiny_causal_lm("qwen2")


@pytest.fixture()
def text_prefills(lm):
    """Forwards of the tiny LM into an empty cache (transformers' or ours), as counted calls."""
    calls, forward = [], lm.model.forward

    def counted(*args, **kw):
        cache = kw.get("past_key_values", kw.get("cache"))
        if cache is not None and cache.get_seq_length() == 0:
            calls.append(1)
        return forward(*args, **kw)

    lm.model.forward = counted
    yield calls
    del lm.model.forward


def _text_config(task: str, prompts: str | None, options: dict, limit: int | None = None) -> RunConfig:
    return RunConfig(model="hf", model_path="(tiny)", tasks=[task], codecs=[PLAIN, RANDOMIZED], bits=[2],
                     codec_seeds=CODEC_SEEDS, residual=8, batch_size=2, prompts=prompts, limit=limit,
                     task_options={task: options})


def test_perplexity(lm, text_prefills, tmp_path):
    f = tmp_path / "story.txt"
    f.write_text(TEXT)
    config = _text_config("perplexity", str(f), {"context": "96", "prefix": "48", "chunk": "24"}, limit=3)
    table = _check(_runs(lm, config, tmp_path, text_prefills), batches=2, per_rollout=1)  # prompts 2 + 1
    assert len(table) == 3 * ROLLOUTS and any(r["kl"] > 0 for r in table if r["label"] != "none")


def test_needle(lm, text_prefills, tmp_path):
    config = _text_config("needle", None, {"contexts": "600", "depths": "0.2,0.5,0.8", "max_new_tokens": "3"})
    table = _check(_runs(lm, config, tmp_path, text_prefills), batches=2, per_rollout=1)
    assert len(table) == 3 * ROLLOUTS and any(r["kl"] > 0 for r in table if r["label"] != "none")


def test_kvpress(lm, text_prefills, tmp_path):
    rows = [{"context": TEXT[:150 + 40 * i], "question": f"Question {i}: what day was it?", "answer_prefix": "It was",
             "answer": ["April"], "max_new_tokens": 3, "task": "niah_single_1"} for i in range(2)]
    f = tmp_path / "rows.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    table = _check(_runs(lm, _text_config("kvpress", str(f), {}), tmp_path, text_prefills), batches=2, per_rollout=1)
    assert len(table) == 2 * ROLLOUTS and any(r["kl"] > 0 for r in table if r["label"] != "none")


# --- video --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def wan():
    from adapters.wan import CAUSVID, build_random, tiny_spec

    return build_random(tiny_spec(CAUSVID, num_frames=6), seed=3)  # 2 blocks of 3 latent frames


def test_video(wan, tmp_path, monkeypatch):
    import harness.tasks.video as video

    # the drift plots (matplotlib, a few tenths of a second a row) are not what is compared here: empty files
    monkeypatch.setattr(video, "write_drift_plot", lambda path, *a, **k: path.write_bytes(b""))
    calls, forward = [], wan.transformer.forward

    def counted(*args, **kw):  # a forward of block 0: its self-attention reads an empty cache
        if wan.transformer.blocks[0].attn1.processor.state.cache[0].length == 0:
            calls.append(1)
        return forward(*args, **kw)

    wan.transformer.forward = counted
    try:
        config = RunConfig(model="causvid-tiny", tasks=["video"], codecs=[PLAIN, RANDOMIZED], bits=[2], limit=2,
                           codec_seeds=CODEC_SEEDS,
                           task_options={"video": {"save_video": "false", "lpips": "false"}})
        runs = _runs(wan, config, tmp_path, calls)
    finally:
        del wan.transformer.forward
    steps = len(wan.spec.schedule.timesteps())
    table = _check(runs, batches=2, per_rollout=steps + 1)  # block 0's steps and its commit pass
    assert any(r["latent_cos"] < 1 for r in table if r["label"] != "none")


# --- audio --------------------------------------------------------------------------------------
def test_audio(tmp_path):
    from adapters.aar import AARConfig, SATConfig, random_pipeline

    scales = (1, 2, 4, 8)
    aar = random_pipeline(AARConfig(depth=2, width=64, num_heads=2, vocab=32, latent_dim=8, scales=scales),
                          SATConfig(dimension=8, latent_dim=8, n_filters=2, lstm=1, codebook_size=32, scales=scales),
                          seed=0, name="test-aar")
    calls, step = [], aar.aar.step

    def counted(x, cond, cache):  # scale 0: its self-attention reads an empty cache
        if cache[0].length == 0:
            calls.append(1)
        return step(x, cond, cache)

    aar.aar.step = counted
    config = RunConfig(model="aar-tiny", tasks=["audio"], codecs=[PLAIN, RANDOMIZED], bits=[2], limit=2,
                       prompts="synthetic", codec_seeds=CODEC_SEEDS,
                       task_options={"audio": {"clip_seconds": "1.0", "top_k": "8", "save_audio": "false"}})
    # each configuration runs free and teacher-forced: two rollouts, one scale 0
    table = _check(_runs(aar, config, tmp_path, calls), batches=2, per_rollout=1, rollouts_per_config=2)
    assert any(r["kl"] > 0 for r in table if r["label"] != "none")
    assert torch.is_tensor(aar._shared._entry[1][1])  # the last batch's scale 0 is held until the next one
