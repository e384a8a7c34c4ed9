"""harness/report/markdown.py on a synthetic run folder: mean ± interval with n, the ranking (ties as equal
ranks) first, then the front, the per-metric tables and the paired comparisons; error bars on
the plots; byte-identical rebuilds; an older summary.json is rebuilt."""
from __future__ import annotations

import json

import matplotlib.axes
import pytest
from helpers.run_folder import rebuild, summary_of, synthetic_rows, write_run

from harness.run.rows import dumps
from harness.tasks import get_task

CONFIGS = {"octopus@2": (0.10, 2.1, (0, 1, 2)), "kivi@2": (0.1001, 2.3, (0,)), "qjl@2": (0.20, 2.0, (0, 1, 2)),
           "octopus@3": (0.05, 3.1, (0, 1, 2))}


@pytest.fixture(autouse=True)
def headline_kl(monkeypatch):
    monkeypatch.setattr(get_task("perplexity"), "headline", "kl", raising=False)


def test_report_sections_in_order(tmp_path):
    out = write_run(tmp_path / "run", synthetic_rows(CONFIGS))
    md = rebuild(out).read_text()
    order = ["**Intervals.**", "### Ranking on KL", "### Rate-matched front on KL", "| KL (nats) ↓, mean ± 95% (baseline 0) | 2 bits | 3 bits |",
             "All configurations", "### Paired comparisons on KL", "### Detectable differences from the baseline on KL",
             "Per-prompt values"]
    assert [md.index(s) for s in order] == sorted(md.index(s) for s in order)
    assert "Benjamini–Hochberg adjusted p-value across all of them" in md and "k(k−1)/2 pairs" in md
    # the ranking: the two as-good configs share rank 1, qjl@2 is 3rd; means shown ± half-width with n
    s = summary_of(out)["tasks"]["perplexity"]
    kivi = next(c for c in s["ranking"][0]["configs"] if c["label"] == "kivi@2")
    half = (kivi["ci95"][1] - kivi["ci95"][0]) / 2
    assert "| 2 | 1 | octopus@2 |" in md and "| 2 | 3 | qjl@2 |" in md
    assert f"| 2 | 1 | kivi@2 | {kivi['mean']:.4g} ± {half:.2g} | 4 |" in md
    assert "| octopus@2 | qjl@2 |" in md and "better" in md and "indistinguishable" in md
    assert "(n=12)" in md and "| min | mean | max |" in md


def test_error_bars_are_the_intervals(tmp_path, monkeypatch):
    drawn = {}
    real = matplotlib.axes.Axes.errorbar

    def spy(self, x, y, yerr=None, **kw):
        drawn[(self.get_title(), kw.get("label"))] = (list(x), list(y), [list(e) for e in yerr])
        return real(self, x, y, yerr=yerr, **kw)

    monkeypatch.setattr(matplotlib.axes.Axes, "errorbar", spy)
    out = write_run(tmp_path / "run", synthetic_rows(CONFIGS))
    rebuild(out)
    stored = json.loads((out / "summary.json").read_text())  # the plots draw the summary as summary.json holds it
    g = next(g for g in stored["tasks"]["perplexity"]["groups"] if g["label"] == "qjl@2")["metrics"]["kl"]
    title = next(t for t in drawn if t[0].startswith("perplexity: KL") and t[1] == "qjl")
    x, y, (below, above) = drawn[title]
    # the plot's points are summary.json's numbers, one float64 subtraction at most: approx's default rel
    assert y == [pytest.approx(g["mean"])]
    assert below == [pytest.approx(g["mean"] - g["ci95"][0])] and above == [pytest.approx(g["ci95"][1] - g["mean"])]
    assert below[0] > 0 and len(drawn) == 3 * 3  # three metrics x three codecs, every point with its bar


def test_report_is_byte_identical_and_rebuilds_an_older_summary(tmp_path):
    rows = synthetic_rows(CONFIGS)
    a, b = write_run(tmp_path / "a", rows), write_run(tmp_path / "b", rows)
    (b / "summary.json").write_text(json.dumps({"version": 1, "tasks": {}}))  # a run folder's older summary
    assert rebuild(a).read_bytes() == rebuild(b).read_bytes()
    (a / "summary.json").write_text(dumps(summary_of(a), indent=2))
    assert rebuild(a).read_bytes() == rebuild(b).read_bytes()
