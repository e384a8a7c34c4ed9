"""harness/report/summary.py on synthetic run folders: the fields of summary.json version 2 (intervals,
paired deltas, ranking per bit width, the rate-matched front), byte-identical rebuilds, run
folders from before codec seeds, and the headline metric a task declares."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
from helpers.run_folder import summary_of, synthetic_rows, write_run
from scipy.stats import t as student_t
from scipy.stats import ttest_1samp
from helpers.tolerances import U64, digits_rel, sum_rel

from harness.run.rows import dumps, read_rows
from harness.tasks import get_task

CONFIGS = {"octopus@2": (0.10, 2.1, (0, 1, 2)),   # randomized: three codec seeds
           "kivi@2": (0.1001, 2.3, (0,)),         # deterministic: one; as good as octopus@2
           "qjl@2": (0.20, 2.0, (0, 1, 2)),
           "octopus@3": (0.05, 3.1, (0, 1, 2)),
           "turbo@3": (0.30, 3.5, (0, 1, 2))}     # worse than everything that stores less


@pytest.fixture
def headline_kl(monkeypatch):
    """Perplexity ranks by KL (what its class declares, or will)."""
    monkeypatch.setattr(get_task("perplexity"), "headline", "kl", raising=False)


#: a figure of summary.json (7 significant digits) against the same figure by hand in float64 (sums of <= 12 cells)
STORED = digits_rel(7) + sum_rel(12, U64)


def by_hand_t(values: list[float]) -> tuple[float, float, float]:
    x = np.array(values)
    half = student_t.ppf(0.975, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size)
    return x.mean(), x.mean() - half, x.mean() + half


def test_summary_fields(tmp_path, headline_kl):
    out = write_run(tmp_path / "run", synthetic_rows(CONFIGS))
    s = json.loads(dumps(summary_of(out), indent=2))
    assert s["version"] == 4 and s["tasks"]["perplexity"]["against_deployed"] == []  # no engine preset in this run
    t = s["tasks"]["perplexity"]
    assert t["headline"] == "kl" and t["codec_seeds"] == [0, 1, 2] and t["prompts"] == ["p0", "p1", "p2", "p3"]
    groups = {g["label"]: g for g in t["groups"]}
    oct2 = groups["octopus@2"]["metrics"]["kl"]
    assert (oct2["n"], oct2["prompts"], oct2["codec_seeds"]) == (12, 4, [0, 1, 2]) and oct2["interval"] == "crossed"
    assert set(oct2) >= {"mean", "min", "max", "ci95", "delta"} and oct2["ci95"][0] < oct2["mean"] < oct2["ci95"][1]
    assert set(oct2["delta"]) >= {"mean", "ci95", "word"} and oct2["delta"]["word"] == "worse"  # KL above the baseline's 0
    assert groups["none"]["metrics"]["kl"]["delta"] is None
    # the one-seed config: the t-interval over its prompts, by hand from the rows
    rows = read_rows(out / "rows.jsonl")
    kivi = [r["kl"] for r in rows if r["label"] == "kivi@2"]
    mean, lo, hi = by_hand_t(kivi)
    k = groups["kivi@2"]["metrics"]["kl"]
    assert (k["n"], k["codec_seeds"], k["interval"]) == (4, [0], "prompts")
    assert k["mean"] == pytest.approx(mean, rel=STORED) and k["ci95"] == pytest.approx([lo, hi], rel=STORED)
    assert (k["min"], k["max"]) == (min(kivi), max(kivi))
    # its delta against the baseline (KL 0 on every prompt) is the same interval, and its p the one-sample t-test's
    assert k["delta"]["ci95"] == pytest.approx([lo, hi], rel=STORED)
    # p: scipy's float64 t tail (good to ~1e-15) by two routes, then stored
    assert k["delta"]["test"] == "t" and k["delta"]["p"] == pytest.approx(ttest_1samp(kivi, 0).pvalue, rel=STORED)
    # the smallest detectable difference: (t.975 + t.80) standard errors, df = 3
    se = (hi - lo) / 2 / student_t.ppf(0.975, 3)
    assert k["delta"]["mdd"] == pytest.approx((student_t.ppf(0.975, 3) + student_t.ppf(0.8, 3)) * se, rel=STORED)
    # the ranking per bit width: the two as-good configs tie, qjl@2 after both
    r2 = next(b for b in t["ranking"] if b["bits"] == 2)
    assert {c["label"]: c["rank"] for c in r2["configs"]} == {"octopus@2": 1, "kivi@2": 1, "qjl@2": 3}
    assert r2["configs"][-1]["label"] == "qjl@2" and len(r2["pairs"]) == 3
    assert all(set(p) >= {"a", "b", "mean", "ci95", "word", "p", "q", "word_bh"} for p in r2["pairs"])
    # q: Benjamini-Hochberg across every comparison the summary made (the front's too): never below p, and in
    # the order of the p-values
    pairs = sorted((p for b in t["ranking"] for p in b["pairs"]), key=lambda p: p["p"])
    assert t["comparisons"] >= len(pairs) and all(p["q"] >= p["p"] for p in pairs)
    assert [p["q"] for p in pairs] == sorted(p["q"] for p in pairs)
    # the front: turbo@3 is beaten by everything that stores less
    fr = {f["label"]: f for f in t["front"]}
    assert fr["turbo@3"]["front"] is False
    assert fr["turbo@3"]["dominated_by"] == ["qjl@2", "octopus@2", "kivi@2", "octopus@3"]
    assert fr["qjl@2"]["front"] is True and fr["octopus@3"]["front"] is True
    assert fr["octopus@2"]["cache_bits_per_coord"] == pytest.approx(2.1, rel=STORED)  # a mean of 2.1s, stored


def test_summary_is_byte_identical_when_built_twice(tmp_path):
    rows = synthetic_rows(CONFIGS)
    a, b = write_run(tmp_path / "a", rows), write_run(tmp_path / "b", rows)
    assert dumps(summary_of(a), indent=2) == dumps(summary_of(b), indent=2) == dumps(summary_of(a), indent=2)


def test_run_folder_from_before_codec_seeds(tmp_path):
    old = {k: (m, rate, (0,)) for k, (m, rate, _) in CONFIGS.items()}
    rows = synthetic_rows(old, with_seed=False)
    assert not any("codec_seed" in r for r in rows)
    out = write_run(tmp_path / "old", rows)
    t = summary_of(out)["tasks"]["perplexity"]
    q = next(g for g in t["groups"] if g["label"] == "qjl@2")["metrics"]["perplexity"]
    _, lo, hi = by_hand_t([r["perplexity"] for r in read_rows(out / "rows.jsonl") if r["label"] == "qjl@2"])
    # the rows as stored on both sides, float64 (summary_of is not rounded): approx's default rel is far above
    assert t["codec_seeds"] == [0] and q["codec_seeds"] == [0] and q["ci95"] == pytest.approx([lo, hi])


def test_headline_falls_back_to_the_first_metric(tmp_path, monkeypatch):
    cls = get_task("perplexity")
    monkeypatch.setattr(cls, "headline", None, raising=False)
    t = summary_of(write_run(tmp_path / "run", synthetic_rows(CONFIGS)))["tasks"]["perplexity"]
    assert t["headline"] == cls.metrics[0]
    r2 = next(b for b in t["ranking"] if b["bits"] == 2)
    means = {g["label"]: g["metrics"][cls.metrics[0]]["mean"] for g in t["groups"]}
    assert all(c["mean"] == pytest.approx(means[c["label"]]) for c in r2["configs"])  # one float64 figure, twice


def test_one_cell_has_no_interval(tmp_path):
    rows = [r for r in synthetic_rows(CONFIGS, prompts=("p0",)) if r.get("codec_seed", 0) == 0]
    k = next(g for g in summary_of(write_run(tmp_path / "one", rows))["tasks"]["perplexity"]["groups"]
             if g["label"] == "kivi@2")["metrics"]["kl"]
    assert (k["n"], k["ci95"], k["interval"], k["delta"]["word"]) == (1, None, "n = 1", None)
