"""harness/lm_eval/table.py on lm-eval result dicts built by hand (log_samples=True layout): the
intervals against scipy, the paired verdicts against hf, the agreement columns against sums done here."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import t as student_t
from helpers.tolerances import U64, digits_abs, digits_rel, gamma

from harness.lm_eval.table import (Row, Run, agreement_cells, row_figures, table, table_row,
                                   task_metrics)

TASKS = ["mc", "gen"]


def result(acc, lls, greedy, em, gens, bits=3.0) -> dict:
    """A simple_evaluate dict: task 'mc' (4-choice log-likelihood, acc per doc), task 'gen'
    (one generation per doc, exact_match per doc)."""
    mc = [{"doc_id": d, "filter": "none", "metrics": ["acc"], "acc": float(acc[d]),
           "resps": [[(float(ll), bool(g))] for ll, g in zip(lls[d], greedy[d])]} for d in range(len(acc))]
    gen = [{"doc_id": d, "filter": "none", "metrics": ["exact_match"], "exact_match": float(em[d]),
            "resps": [[gens[d]]]} for d in range(len(em))]
    return {"results": {"mc": {"alias": "mc", "acc,none": float(np.mean(acc)), "acc_stderr,none": 0.1},
                        "gen": {"alias": "gen", "exact_match,none": float(np.mean(em)),
                                "exact_match_stderr,none": 0.1}},
            "higher_is_better": {"mc": {"acc": True}, "gen": {"exact_match": True}},
            "samples": {"mc": mc[::-1], "gen": gen},  # order must not matter
            "config": {"kvcodec": {"mean": {"bits_per_coord": bits, "value_bits_per_coord": bits}}}}


def reference(n: int = 8, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    acc = [1, 1, 0, 1, 1, 1, 0, 1][:n]
    return result(acc, rng.normal(-5, 2, (n, 4)), rng.random((n, 4)) < 0.5, acc[::-1], [f"answer {d}" for d in range(n)])


def parse(cell: str) -> tuple[float, float]:
    mean, half = cell.split(" ± ")
    return float(mean), float(half.split()[0])


def cells_of(lines: list[str], label: str) -> dict[str, str]:
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    row = next(line for line in lines if line.startswith(f"| {label} |"))
    return dict(zip(head, (c.strip() for c in row.strip("|").split("|"))))


def test_metrics_read_from_results():
    assert task_metrics(reference(), "mc") == [("acc", "none")]
    assert task_metrics(reference(), "gen") == [("exact_match", "none")]


def test_one_seed_intervals_are_t_intervals_over_documents():
    ref = reference()
    rng = np.random.default_rng(1)
    r = reference()
    acc = [1, 0, 0, 1, 1, 0, 0, 1]
    lls = [[x[0] + dl for x, dl in zip((s["resps"][i][0] for i in range(4)), rng.normal(0, 0.05, 4))]
           for s in sorted(r["samples"]["mc"], key=lambda s: s["doc_id"])]
    codec = result(acc, lls, [[True] * 4] * 8, [1] * 8, [f"answer {d}" if d % 3 else "x" for d in range(8)])
    lines = table(Run(0, ref, 1.0), [Row("c@2", (Run(0, codec, 2.0),))], TASKS)
    got = cells_of(lines, "c@2")

    def t_ci(x):
        x = np.asarray(x, float)
        return x.mean(), student_t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x))

    def check(cell: str, x) -> None:  # the cell prints the mean to 4 and the half-width to 2 significant digits
        (mean, half), (m, h) = parse(cell), t_ci(x)
        # half a unit in the last digit printed, and the float64 rounding that sets the two computations apart
        assert abs(mean - m) <= digits_abs(m, 4) + gamma(4, U64) * abs(m)
        assert abs(half - h) <= digits_abs(h, 2) + gamma(4, U64) * h

    check(got["mc acc"], acc)
    ref_acc = [s["acc"] for s in sorted(ref["samples"]["mc"], key=lambda s: s["doc_id"])]
    check(got["Δ acc vs hf"], np.subtract(acc, ref_acc))
    check(cells_of(lines, "`--model hf`")["mc acc"], ref_acc)
    # |Δ loglik| per document: the mean over its 4 choices, then the t-interval over the 8 documents
    ref_ll = {s["doc_id"]: [x[0][0] for x in s["resps"]] for s in ref["samples"]["mc"]}
    per_doc = [np.mean(np.abs(np.subtract(lls[d], ref_ll[d]))) for d in range(8)]
    check(got["mean abs Δ loglik"], per_doc)
    check(got["generations equal"], [d % 3 != 0 for d in range(8)])
    ref_greedy = [[x[0][1] for x in s["resps"]] for s in sorted(ref["samples"]["mc"], key=lambda s: s["doc_id"])]
    mean, _ = parse(got["is_greedy agree"])
    assert mean == pytest.approx(np.mean(ref_greedy), rel=digits_rel(4))  # codec greedy on every choice; 4 digits
    assert got["key bits"] == "3.00" and got["codec seeds"] == "0"


def test_codec_identical_to_hf_is_indistinguishable_with_zero_difference():
    ref = reference()
    row = Row("same", (Run(0, reference()), Run(1, reference())))
    f = row_figures(row, Run(0, ref), TASKS)
    for label in ("mc acc", "gen exact_match"):
        _, cmp = f["metrics"][label]
        assert cmp.word == "indistinguishable" and cmp.diff.mean == 0 and cmp.diff.ci95 == (0, 0)
        assert cmp.diff.n == 16  # 8 documents x 2 seeds, hf broadcast
    assert f["agreement"]["abs_dloglik"].mean == 0
    assert f["agreement"]["greedy_agree"].mean == 1 and f["agreement"]["gen_equal"].mean == 1
    lines = table(Run(0, ref), [row], TASKS)
    assert table_row(row, Run(0, ref), TASKS) == lines[-1]  # the line the sweep prints as it goes
    got = cells_of(lines, "same")
    assert got["Δ acc vs hf"] == "0 ± 0 indistinguishable" and got["codec seeds"] == "0 1"


def test_clearly_worse_codec_is_worse_and_crossed_over_seeds():
    n = 8
    ref = result([1] * n, np.zeros((n, 4)), np.ones((n, 4), bool), [1] * n, ["a"] * n)
    runs = []
    for seed, hits in ((0, {0}), (1, {0, 5}), (2, set())):  # right on at most 2 of 8 documents per seed
        acc = [int(d in hits) for d in range(n)]
        runs.append(Run(seed, result(acc, -np.ones((n, 4)), np.zeros((n, 4), bool), acc, ["b"] * n)))
    f = row_figures(Row("bad", tuple(runs)), Run(0, ref), TASKS)
    iv, cmp = f["metrics"]["mc acc"]
    assert cmp.word == "worse" and cmp.diff.ci95[1] < 0
    assert iv.method == "crossed" and iv.n == 24 and iv.seeds == (0, 1, 2)
    assert cmp.diff.mean == pytest.approx(3 / 24 - 1)  # a float64 mean of 24 cells of 0 and -1: default rel
    assert f["agreement"]["abs_dloglik"].mean == 1 and f["agreement"]["gen_equal"].mean == 0


def test_agreement_needs_the_same_requests():
    ref, other = reference(), reference()
    other["samples"]["mc"][0]["resps"].pop()
    with pytest.raises(ValueError):
        agreement_cells(Run(0, other), ref, ["mc"])
