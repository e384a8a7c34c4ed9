"""Effective length: over a sweep of context lengths, the longest at which a configuration keeps at least
85% of the uncompressed baseline's score (NoLiMa's definition, Modarressi et al. 2025, with the baseline
at the same length as the reference), with its uncertainty.

At each length L a configuration's cells (prompt x codec seed) of the task's score are paired with the
baseline's, and d = score - 0.85 x baseline score gets the interval of :func:`harness.stats.intervals.interval`:
L is *kept* where the interval lies above 0, *lost* where it lies below, *unclear* otherwise (also where
it has no width: every prompt gave the same difference, e.g. all passed on both sides). The
effective length is the longest L up to which every length keeps the mean ratio score / baseline >= 0.85;
``shown`` the longest up to which every length is kept (what the data establishes), ``possible`` the
longest up to which none is lost (what the data does not rule out). None: not even the shortest length.
The summary (:mod:`harness.report.summary`) hands it each configuration's cells per length; it reads no rows.
"""
from __future__ import annotations

from harness.stats.intervals import Cells, interval, pair_cells

THRESHOLD = 0.85


def longest(contexts: list[int], ok: list[bool]) -> int | None:
    """The longest context up to which every one is ``ok`` (None: not the first)."""
    best = None
    for c, good in zip(contexts, ok):
        if not good:
            break
        best = c
    return best


def effective_lengths(base: dict[int, Cells], configs: dict[str, dict[int, Cells]],
                      threshold: float = THRESHOLD) -> list[dict]:
    """Per configuration of ``configs`` ({label: {context length: cells}}, the cells {(prompt, codec seed):
    score} of the task's score at that length): {label, points: [{context, score, baseline, ratio, diff:
    {mean, ci95}}], effective, shown, possible}, against the baseline's cells per length ``base``, over its
    lengths in increasing order ([] with fewer than two lengths)."""
    contexts = sorted(base)
    if len(contexts) < 2:
        return []
    out = []
    for label, by_context in configs.items():
        points = []
        for L in contexts:
            c = by_context.get(L) or {}
            b = base[L]
            if not c or not b:
                points.append({"context": L, "score": None, "baseline": None, "ratio": None, "diff": None})
                continue
            mean_c, mean_b = sum(c.values()) / len(c), sum(b.values()) / len(b)
            d = interval(pair_cells(c, {k: threshold * v for k, v in b.items()}))
            points.append({"context": L, "score": mean_c, "baseline": mean_b,
                           "ratio": mean_c / mean_b if mean_b else None, "diff": d.to_json()})
        # an interval of no width (every prompt the same difference: all pass on both sides) shows nothing
        ci = [p["diff"]["ci95"] if p["diff"] is not None else None for p in points]
        kept = [c is not None and c[1] > c[0] and c[0] > 0 for c in ci]
        lost = [c is not None and c[1] > c[0] and c[1] < 0 for c in ci]
        holds = [p["ratio"] is not None and p["ratio"] >= threshold or (p["baseline"] == 0 and p["score"] is not None)
                 for p in points]
        out.append({"label": label, "points": points, "effective": longest(contexts, holds),
                    "shown": longest(contexts, kept), "possible": longest(contexts, [not x for x in lost])})
    return out
