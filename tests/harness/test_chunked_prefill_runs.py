"""Every text task whose context enters a cache (needle, ruler, kvpress, turns, perplexity's prefix): a run at
``--prefill-chunk 16`` writes the rows of the run at ``auto`` (these contexts are prefilled in one piece there)
to float rounding, the baseline and every codec through the same chunking: no forward into an empty cache takes
more than the chunk (the long context never enters one piece; at ``auto`` it does), and every replay into a codec's cache goes in
pieces of it. config.json records the option, model.json the chunk it came to."""
from __future__ import annotations

import json

import pytest
import torch
from helpers.tiny_lm import text_run_config, tiny_causal_lm
from helpers.tolerances import digits_abs

import adapters.hf.causal_lm as causal_lm
from adapters.hf.cache import CompressedCache
from adapters.hf.compat import passed_cache
from harness.run.rows import read_rows
from harness.runner import run

CHUNK = 16
# a chunked prefill's logits are the whole forward's to ~300 U32 = 2e-5 on the tiny model's logits of O(1)
# (tests/adapters/hf/test_chunked_prefill.py); a row's figure built from them (a log-softmax, a KL, a mean NLL,
# each moving by at most twice its inputs' error per term; a perplexity by that relatively) moves by at most
# 4x that, relatively where it exceeds 1, plus the 7 digits rows.jsonl keeps (harness.run.rows)
LOGIT_ATOL = 2e-5
SPEEDLESS = ("speed",)
TEXT = ("It was a bright cold day in April, and the clocks were striking thirteen. Winston Smith, his chin "
        "nuzzled into his breast in an effort to escape the vile wind, slipped quickly through the glass doors. ") * 30


def close(got, want, path="row") -> None:
    """Rows equal: strings, ints, booleans and lists' lengths exactly, floats to the bound above."""
    if isinstance(want, dict):
        assert sorted(got) == sorted(want), path
        for k in want:
            close(got[k], want[k], f"{path}.{k}")
    elif isinstance(want, list):
        assert len(got) == len(want), path
        for i, (g, w) in enumerate(zip(got, want)):
            close(g, w, f"{path}[{i}]")
    elif isinstance(want, float) and not isinstance(want, bool):
        tol = 4 * LOGIT_ATOL * max(1.0, abs(want)) + 2 * digits_abs(want, 7)
        assert isinstance(got, (int, float)) and abs(got - want) <= tol, f"{path}: {got} != {want} (within {tol:.2g})"
    else:
        assert got == want, f"{path}: {got!r} != {want!r}"


@pytest.fixture()
def watched(monkeypatch):
    """(widest forward into an empty cache, chunks the replays were given): every prefill path counted."""
    seen = {"empty": [], "replay": [], "native": []}
    forward = causal_lm.native_prefill

    def native(model, x, padding, chunk=None):
        seen["native"].append(chunk)
        return forward(model, x, padding, chunk)

    replay = CompressedCache.replay

    def replayed(self, i, layer, pads=None, chunk=None):
        seen["replay"].append(chunk)
        return replay(self, i, layer, pads, chunk)

    monkeypatch.setattr(causal_lm, "native_prefill", native)
    monkeypatch.setattr(CompressedCache, "replay", replayed)
    return seen


def _lively():
    """The tiny model, weights x10 (at init it echoes its last token whatever the context: its rows would say
    nothing of the cache)."""
    lm = tiny_causal_lm("qwen2")
    with torch.no_grad():
        for name, p in lm.model.named_parameters():
            if "norm" not in name:
                p.mul_(10)
    return lm


def _kvpress_file(tmp_path):
    rows = [{"context": TEXT[:300 + 60 * i], "question": f"Question {i}: what day was it?", "answer_prefix": "It was",
             "answer": ["April"], "max_new_tokens": 3, "task": "niah_single_1"} for i in range(2)]
    f = tmp_path / "kv.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(f)


CASES = {
    "needle": dict(task_options={"needle": {"contexts": [520], "depths": [0.3, 0.7], "max_new_tokens": 3}}),
    "ruler": dict(task_options={"ruler": {"tasks": ["niah_single_1"], "contexts": [700], "repeats": 1,
                                          "max_new_tokens": 3}}),
    "ruler-context": dict(task_options={"ruler": {"tasks": ["niah_single_1"], "contexts": [700], "repeats": 1,
                                                  "max_new_tokens": 3, "prefill": "context"}}),
    "turns": dict(task_options={"turns": {"contexts": [900], "turns": 2, "repeats": 1, "max_new_tokens": 3}}),
    "perplexity": dict(task_options={"perplexity": {"context": 120, "prefix": 70, "chunk": 10}}),
    "kvpress": dict(task_options={}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_chunked_run_writes_the_unchunked_rows(case, tmp_path, watched):
    task = case.split("-")[0]
    # one prompt a task (kvpress: two of different lengths, a left-padded batch), three configurations
    kw = dict(CASES[case], tasks=(task,), codecs=("kivi", "octopus"), codec_seeds=[0],
              limit=2 if task == "kvpress" else 1, batch_size=2)
    if task == "kvpress":
        kw["prompts"] = _kvpress_file(tmp_path)
    lm, rows, widest = _lively(), {}, {}
    forward = lm.model.forward

    def counted(*args, **kw):  # the model's own forwards into an empty cache (transformers' or ours)
        cache, x = passed_cache(kw), kw.get("input_ids", args[0] if args else None)
        if cache is not None and cache.get_seq_length() == 0:
            widest[chunk] = max(widest.get(chunk, 0), x.shape[1])
        return forward(*args, **kw)

    lm.model.forward = counted
    for chunk in ("auto", CHUNK):
        config = text_run_config(tmp_path, prefill_chunk=chunk, **kw)
        for k in watched:
            watched[k].clear()
        out = run(config, out=tmp_path / str(chunk), model=lm, progress=False, log=lambda *_: None)
        assert json.loads((out / "config.json").read_text())["prefill_chunk"] == chunk
        came_to = json.loads((out / "model.json").read_text())["model"]["prefill_chunk"]
        assert came_to == (None if chunk == "auto" else CHUNK)
        rows[chunk] = [{k: v for k, v in r.items() if k not in SPEEDLESS} for r in read_rows(out / "rows.jsonl")]
        # the baseline's prefill and every codec's replay of it, each in the run's chunk
        assert watched["native"] and set(watched["native"]) == {came_to}
        assert watched["replay"] and set(watched["replay"]) == {came_to}
    # no long context entered a cache in one piece at chunk 16; at auto the whole context did
    assert widest[CHUNK] == CHUNK < widest["auto"]
    assert {r["label"] for r in rows[CHUNK]} == {"none", "kivi@2", "octopus@2"}
    assert len(rows[CHUNK]) == len(rows["auto"]) > 0
    for got, want in zip(rows[CHUNK], rows["auto"]):
        close(got, want)
