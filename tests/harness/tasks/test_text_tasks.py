"""harness/tasks: perplexity (chunked teacher forcing) and needle (RULER-style multi-key) on a tiny model."""
from __future__ import annotations

import math

import pytest
import torch
from helpers.rate_refs import key_bytes
from helpers.tiny_lm import tiny_causal_lm
from helpers.tolerances import U32, U64, coarse_kl_abs, gamma, log_close, logsoftmax_abs

from adapters.cache.config import CacheConfig
from harness.tasks import get_task
from harness.tasks.text_corpus import default_corpus, load_excerpts
from kernels import list_codecs

CODEC = next(c for c in ("turboquant-mse", "octopus", "quarot") if c in list_codecs())
TEXT = ("It was a bright cold day in April, and the clocks were striking thirteen. " * 40).strip()


def _reference_scores(native: torch.Tensor, comp: torch.Tensor, targets: torch.Tensor, topk: int) -> dict:
    """float64, straight from the definitions: mean KL(native || comp) over {native's top-k tokens, the rest},
    the share of positions whose argmax agrees, and exp(mean NLL of the targets) under each; 'kl_tol' bounds
    what the task's float32 log-softmaxes of the same logits may move the KL by (tests/helpers/tolerances.py), and
    'nll_abs' its mean NLLs (each NLL a float32 log-probability, logsoftmax_abs)."""
    p, q = torch.softmax(native, -1), torch.softmax(comp, -1)
    top = p.topk(topk, -1).indices
    pk, qk = p.gather(-1, top), q.gather(-1, top)
    pb, qb = torch.cat([pk, 1 - pk.sum(-1, keepdim=True)], -1), torch.cat([qk, 1 - qk.sum(-1, keepdim=True)], -1)
    kl = torch.where(pb > 0, pb * (pb.log() - qb.log()), torch.zeros_like(pb)).sum(-1)
    nll = lambda lg: -torch.log_softmax(lg, -1).gather(-1, targets[:, None]).mean()  # noqa: E731
    spread = float(max((x.amax(-1) - x.amin(-1)).max() for x in (native, comp)))
    common, each = logsoftmax_abs(native.shape[-1], spread)
    # the task's KL also rounds each position's KL to float32 (U32 of it) before its float64 mean
    kl_tol = coarse_kl_abs(pb, qb, common, each) + U32 * float(kl.abs().max())
    return {"kl": float(kl.mean()), "top1_agree": float((native.argmax(-1) == comp.argmax(-1)).double().mean()),
            "perplexity": math.exp(float(nll(comp))), "baseline_perplexity": math.exp(float(nll(native))),
            "kl_tol": kl_tol, "nll_abs": common + each + gamma(len(targets), U64)}


@pytest.fixture(scope="module")
def lm():
    return tiny_causal_lm("qwen2")


@pytest.fixture()
def textfile(tmp_path):
    f = tmp_path / "story.txt"
    f.write_text(TEXT)
    return f


def test_default_corpus_is_real_text():
    ex = default_corpus()
    assert ex and len({e.id for e in ex}) == len(ex)
    assert all(len(e.text) > 2000 for e in ex)
    assert any(e.source.startswith("pydoc:") for e in ex)
    assert load_excerpts(None, 1000, 2) == ex[:2]
    with pytest.raises(FileNotFoundError, match="no such file"):
        load_excerpts("/nonexistent/file.txt", 1000, 1)


def test_perplexity_task(lm, textfile, tmp_path):
    task = get_task("perplexity")(context="160", prefix=64, chunk=16)
    prompts = task.prompts(str(textfile), limit=2)
    assert [p.id for p in prompts] == ["story-000", "story-001"]
    base = task.baseline(lm, prompts[0], seed=0)
    assert base["nll"].shape == (160 - 64 - 1,)
    none = task.evaluate(lm, prompts[0], CacheConfig(residual=8), 0, base, tmp_path)
    assert none["kl"] == 0.0 and none["top1_agree"] == 1.0
    assert none["perplexity"] == none["baseline_perplexity"]
    assert none["scored_tokens"] == 95 and none["tokens"] == 160
    cfg = CacheConfig(codec=CODEC, bits=2, residual=8)
    row = task.evaluate(lm, prompts[0], cfg, 0, base, tmp_path)
    d = lm.geometry.head_dim  # the codec's documented bytes per key vector (tests/helpers/rate_refs.py)
    assert row["bits_per_coord"] == 8 * key_bytes(CODEC, 2, d) / d and row["cache_bytes"] < row["uncompressed_bytes"]
    assert row["committed_tokens"] == 160 - 8
    # reference: the uncompressed logits from one plain forward of the whole context (no cache, no chunks), the
    # compressed ones from the same chunks (64, then 16s) through the codec; positions 64..158 predict tokens
    ids = lm.encode(TEXT)[:160]
    with torch.no_grad():
        native = lm.model(torch.tensor([ids])).logits[0].double()
    chunks = []
    lm.teacher_force(ids, [64] + [16] * 6, cfg, lambda start, lg: chunks.append(lg))
    comp = torch.cat(chunks).double()
    scored, targets = slice(64, 159), torch.tensor(ids[65:160])
    want = _reference_scores(native[scored], comp[scored], targets, topk=task.opts.topk)
    # the codec moved the distributions far beyond rounding: a clamped or dropped KL would fail below
    assert want["kl"] > 5 * want["kl_tol"]
    # the logits: chunked against whole forwards of this model agree to float32 rounding (bitwise here, no clean
    # bound); the KL and perplexities then differ by the task's float32 log-softmaxes (perplexities in log space)
    assert abs(row["kl"] - want["kl"]) <= want["kl_tol"]
    assert row["top1_agree"] == want["top1_agree"]
    assert log_close(row["perplexity"], want["perplexity"], want["nll_abs"])
    assert log_close(row["baseline_perplexity"], want["baseline_perplexity"], want["nll_abs"])


def test_perplexity_prompts_of_different_lengths_run_together(lm, tmp_path):
    """Prompts of different token lengths run as one left-padded batch, each on its own chunk plan:
    every row is the row it gets alone (the KL to 1e-3 of itself: a difference of nearly equal
    log-probabilities that float32 rounding of batched matmuls moves; the rest to float rounding)."""
    from harness.tasks.base import Prompt

    task = get_task("perplexity")(context=160, prefix=64, chunk=16)
    prompts = [Prompt(f"p{i}", TEXT[:n]) for i, n in enumerate((160, 131, 97))]  # one token per byte
    assert task.batches(lm, prompts) == [prompts]  # --batch-size left out: 8 on the CPU
    task.batch_size = 2
    assert task.batches(lm, prompts) == [prompts[:2], prompts[2:]]
    cfg = CacheConfig(codec="kivi", bits=2, residual=8)
    rows = task.evaluate_batch(lm, prompts, cfg, 0, task.baseline_batch(lm, prompts, 0), tmp_path)
    for p, row in zip(prompts, rows):
        alone = task.evaluate(lm, p, cfg, 0, task.baseline(lm, p, 0), tmp_path)
        assert row["tokens"] == len(p.data) and row["scored_tokens"] == len(p.data) - 64 - 1
        exact = ("tokens", "scored_tokens", "top1_agree", "cache_bytes", "uncompressed_bytes", "compressed_bytes",
                 "committed_tokens", "bits_per_coord", "value_bits_per_coord", "cache_bits_per_coord")
        assert {k: row[k] for k in exact} == {k: alone[k] for k in exact}
        # batched and single-prompt matmuls round the logits differently (no clean bound; ~1e-6 of logits ~1): the KL,
        # a difference of nearly equal log-probabilities, moves by ~1e-5 of itself (measured), 1e-3 allows 100x that
        assert row["kl"] == pytest.approx(alone["kl"], rel=1e-3) and row["kl"] > 0
        for k in ("perplexity", "baseline_perplexity"):  # exp(mean NLL): those logits' rounding in log space, as above
            assert log_close(row[k], alone[k], 1e-5)


def test_needle_prompts_are_built_as_asked(lm):
    task = get_task("needle")(contexts="700,1000", depths="0,0.5,1", needles=3, max_new_tokens=4)
    prompts = task.prompts()
    assert [p.id for p in prompts][:3] == ["niah-c700-d0", "niah-c700-d0.5", "niah-c700-d1"]
    assert len(prompts) == 6
    for p in prompts:
        b = task.build(lm, p, seed=0)
        text = lm.decode(b["ids"])
        assert f"One of the special magic numbers for {b['key']} is: {b['value']}." in text
        assert text.count("One of the special magic numbers") == 3
        # not rounding but how the haystack is cut: at the last whole word that fits (these fall 1 to 9 tokens
        # short), and a needle at round(depth x sentence slots) / slots (exact here: 2 and 4 slots)
        assert len(b["ids"]) == pytest.approx(p.data["context"], abs=12)
        assert b["needle_depths"][0] == pytest.approx(p.data["depth"], abs=0.05)
        assert len(b["value"]) == 7 and b == task.build(lm, p, seed=0)  # deterministic
    assert task.build(lm, prompts[0], seed=1)["value"] != task.build(lm, prompts[0], seed=0)["value"]


def test_needle_task(lm, tmp_path):
    task = get_task("needle")(contexts=(600,), depths=(0.5,), needles=2, max_new_tokens=5)
    p = task.prompts()[0]
    base = task.baseline(lm, p, seed=0)
    none = task.evaluate(lm, p, CacheConfig(residual=8), 0, base, tmp_path)
    assert none["output_match"] == 1.0 and none["kl"] == 0.0 and none["top1_agree"] == 1.0
    cfg = CacheConfig(codec=CODEC, bits=2, residual=8)
    row = task.evaluate(lm, p, cfg, 0, base, tmp_path)
    assert set(row) >= {"exact_match", "output_match", "kl", "top1_agree", "bits_per_coord", "cache_bytes"}
    # reference: the baseline's answer teacher-forced after the prompt, uncompressed as one plain forward of
    # prompt + answer, compressed as the task documents it (prefill, then the answer on a fork of the cache)
    ids, answer = task.build(lm, p, seed=0)["ids"], base["tokens"]
    with torch.no_grad():
        native = lm.model(torch.tensor([ids + answer[:-1]])).logits[0, len(ids) - 1:].double()
    r = lm.greedy(ids, 5, cfg, force=answer)
    want = _reference_scores(native, r["forced_logits"].double(), torch.tensor(answer), topk=task.opts.topk)
    assert want["kl"] > 5 * want["kl_tol"]
    assert abs(row["kl"] - want["kl"]) <= want["kl_tol"]  # as in test_perplexity_task
    assert row["top1_agree"] == want["top1_agree"]
    assert row["output_match"] == float(r["tokens"] == answer)
    # every token but the last generated one went through the cache; all but the 8-token window are committed
    assert row["committed_tokens"] == len(ids) + len(r["tokens"]) - 1 - 8


def test_unknown_task_lists_what_exists():
    with pytest.raises(ValueError, match=r"Unknown task 'nope'. Available: .*needle.*perplexity"):
        get_task("nope")


def test_wikitext2_and_c4_go_through_datasets(monkeypatch):
    """The dataset sources call datasets.load_dataset with the public names; a local stand-in
    dataset replaces the Hub here (no download in tests)."""
    import datasets

    from harness.tasks.text_corpus import load_excerpts

    seen = []
    para = "The quick brown fox jumps over the lazy dog near the river bank. " * 40

    def fake_load(name, config=None, split=None, streaming=False):
        seen.append((name, config, split, streaming))
        if "wikitext" in name:
            return datasets.Dataset.from_dict({"text": [para, "\n", para]})
        return iter([{"text": para}, {"text": para}, {"text": para}])

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    wt = load_excerpts("wikitext2", 500, 2)
    c4 = load_excerpts("c4", 500, 2)
    assert [e.source for e in wt] == ["wikitext2"] * 2 and len(c4) == 2
    assert all(len(e.text) >= 250 and "fox" in e.text for e in wt + c4)
    assert seen[0][:3] == ("Salesforce/wikitext", "wikitext-2-raw-v1", "test")
    assert seen[-1] == ("allenai/c4", "en", "validation", True)


def test_dataset_without_hub_access_says_what_to_do(monkeypatch):
    import datasets

    from harness.tasks.text_corpus import load_excerpts

    def offline(*a, **k):
        raise ConnectionError("no network")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(RuntimeError, match="could not load 'c4'.*offline default corpus"):
        load_excerpts("c4", 500, 1)
