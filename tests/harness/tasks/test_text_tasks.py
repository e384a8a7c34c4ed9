"""harness/tasks: perplexity (chunked teacher forcing) and needle (RULER-style multi-key) on a tiny model."""
from __future__ import annotations

import pytest
from tiny_lm import tiny_causal_lm

from adapters.kv_cache import CacheConfig
from harness.tasks import get_task
from harness.tasks.text_corpus import default_corpus, load_excerpts
from kernels import list_codecs

CODEC = next(c for c in ("turboquant-mse", "octopus", "quarot") if c in list_codecs())
TEXT = ("It was a bright cold day in April, and the clocks were striking thirteen. " * 40).strip()


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
    row = task.evaluate(lm, prompts[0], CacheConfig(codec=CODEC, bits=2, residual=8), 0, base, tmp_path)
    assert row["kl"] > 0 and row["bits_per_coord"] < 16 and row["cache_bytes"] < row["uncompressed_bytes"]
    assert row["committed_tokens"] == 160 - 8


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
    row = task.evaluate(lm, p, CacheConfig(codec=CODEC, bits=2, residual=8), 0, base, tmp_path)
    assert set(row) >= {"exact_match", "output_match", "kl", "top1_agree", "bits_per_coord", "cache_bytes"}
    assert row["kl"] >= 0 and row["committed_tokens"] > 0


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
