"""The summary's tests beyond the interval: McNemar's exact test for a pass/fail metric (against scipy's binomial
test on the discordant pairs), the non-inferiority verdict of ``--margin`` and the report's lines for both."""
from __future__ import annotations

import json

import pytest
from helpers.run_folder import rebuild, row, summary_of, write_run
from scipy.stats import binomtest

from harness.run.rows import dumps

PROMPTS = [f"p{i}" for i in range(20)]


def _rows(passes: dict[str, list[int]], kl: dict[str, float]) -> list[dict]:
    """needle rows: exact_match per prompt from ``passes``, a KL that grows with ``kl``'s offset."""
    out = []
    for label, marks in passes.items():
        for i, (p, m) in enumerate(zip(PROMPTS, marks)):
            r = row(label, p, 0, kl[label] + 0.001 * (i % 5), 0.0, 4.0 if label != "none" else 16.0,
                    exact_match=float(m), string_match_all=float(m))
            r["task"] = "needle"
            for k in ("perplexity", "scored_tokens"):
                r.pop(k)
            out.append(r)
    return out


def test_a_pass_fail_metric_is_compared_by_mcnemar(tmp_path):
    base = [1] * 20
    worse = [1] * 14 + [0] * 6  # six discordant pairs, all against the codec
    mixed = [0, 1] * 10  # ten discordant pairs, all against the codec
    out = write_run(tmp_path / "run", _rows({"none": base, "kivi@2": worse, "octopus@2": mixed},
                                            {"none": 0.0, "kivi@2": 0.02, "octopus@2": 0.021}))
    t = summary_of(out)["tasks"]["needle"]
    g = {x["label"]: x for x in t["groups"]}
    d = g["kivi@2"]["metrics"]["exact_match"]["delta"]
    # float64 (summary_of is not rounded): one division; p scipy's binomial tail by two routes (~1e-15): default rel
    assert d["test"] == "mcnemar" and d["mean"] == pytest.approx(-6 / 20)
    assert d["p"] == pytest.approx(binomtest(0, 6, 0.5).pvalue) and d["word"] == "worse"  # 2 / 64 < 0.05
    d2 = g["octopus@2"]["metrics"]["exact_match"]["delta"]
    assert d2["p"] == pytest.approx(binomtest(0, 10, 0.5).pvalue) and d2["word"] == "worse"
    assert g["kivi@2"]["metrics"]["kl"]["delta"]["test"] == "t"  # a graded metric keeps the t interval


def test_margin_gives_a_non_inferiority_verdict_and_the_report_says_it(tmp_path):
    out = write_run(tmp_path / "run", _rows({"none": [1] * 20, "kivi@2": [1] * 20, "octopus@2": [1] * 20},
                                            {"none": 0.0, "kivi@2": 0.002, "octopus@2": 0.05}))
    config = json.loads((out / "config.json").read_text())
    config["margin"] = 0.01  # KL within 0.01 nats of the baseline's
    (out / "config.json").write_text(dumps(config, indent=2) + "\n")
    t = summary_of(out)["tasks"]["needle"]
    assert t["margin"] == 0.01
    g = {x["label"]: x for x in t["groups"]}
    head = t["headline"]
    ni = {lb: g[lb]["metrics"][head]["non_inferiority"] for lb in ("kivi@2", "octopus@2")}
    assert ni["kivi@2"]["verdict"] == "non-inferior" and ni["kivi@2"]["bound"] < 0.01
    assert ni["octopus@2"]["verdict"] == "not shown" and ni["octopus@2"]["bound"] > 0.01
    rebuild(out)
    md = (out / "report.md").read_text()
    assert "### Detectable differences from the baseline on" in md and "δ = 0.01 (`--margin`)" in md
    assert "| kivi@2 |" in md and "non-inferior (bound" in md and "Benjamini–Hochberg" in md


def test_mcnemar_counts_a_prompt_once_whatever_the_codec_seeds():
    """A one-seed baseline against a three-seed codec: seeds that agree make one pair per prompt (not three,
    which would triple the evidence); seeds that disagree leave pass rates, compared by the t interval."""
    from harness.stats.pass_fail import compare

    base = {(p, 0): 1.0 for p in PROMPTS}
    agree = {(p, s): 0.0 if i < 6 else 1.0 for i, p in enumerate(PROMPTS) for s in (0, 1, 2)}
    d = compare(agree, base, True)
    assert (d.test, d.n) == ("mcnemar", 20) and d.p == pytest.approx(binomtest(0, 6, 0.5).pvalue)  # as above
    split = {(p, s): float(s == 0 and i < 6) for i, p in enumerate(PROMPTS) for s in (0, 1, 2)}
    assert compare(split, base, True).test == "t"


def test_non_inferiority_of_pass_fail_needs_prompts():
    """Two prompts passing on both sides: no pair disagrees, yet two prompts cannot show a 5-point margin
    (Newcombe's interval, not a t interval of zero width)."""
    from harness.stats.pass_fail import non_inferior

    a = b = {("p0", 0): 1.0, ("p1", 0): 1.0}
    assert non_inferior(a, b, 0.05, True).verdict == "not shown"
    many = {(f"p{i}", 0): 1.0 for i in range(400)}
    assert non_inferior(many, many, 0.05, True).verdict == "non-inferior"
