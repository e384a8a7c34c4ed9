"""Intervals and paired comparisons for values measured over prompts x codec seeds.

The design. A configuration's metric is measured once per cell of a crossed layout: prompts
p = 1..P (the text or clip scored) and codec seeds s = 1..S (the codec's random draws:
rotations, projections). A value is modelled as

    y[p, s] = mu + a[p] + b[s] + e[p, s],   a ~ (0, sp²), b ~ (0, ss²), e ~ (0, se²)

(crossed random effects: every prompt sees the same seed draws, so a bad seed shifts every
prompt). The grand mean ybar estimates mu with Var(ybar) = sp²/P + ss²/S + se²/(PS): seeds
count as S samples, not P·S, so treating cells as independent would be too narrow whenever
the seed matters.

The 95% interval (:func:`interval`). A complete grid with P, S >= 2 gets a t-interval whose
variance comes from the two-way ANOVA mean squares,

    V = (MS_prompt + MS_seed - MS_resid) / (P·S),

unbiased for Var(ybar) above, with Satterthwaite degrees of freedom. V can come out below what
either main effect alone says (or negative) when MS_resid is large by chance; it is then clamped
to max(MS_prompt, MS_seed) / (P·S), the estimate for the case where the other effect is zero
(with that mean square's own degrees of freedom), so the interval is never narrower than the
one-factor one. S = 1: the ordinary t-interval over prompts (df P-1); P = 1: over seeds
(df S-1); one cell: no interval ("n = 1"). In simulation (normal and skewed effects, P = 6..8,
S = 3) the coverage is 0.94-0.96; it is conservative where no factor dominates (up to 0.97) and
where neither prompts nor seeds matter (0.985).

Missing cells (a seed missing for one prompt): each prompt's values are averaged over the seeds
it has and the t-interval is taken over these prompt means (df P-1), centred on their mean. A
seed effect shared by every prompt is then not in the interval, so it can be too narrow; the
method says so ("prompt means", summary.json's ``interval``).

Paired comparison (:func:`paired`). d[p, s] = A[p, s] - B[p, s] on the cells both have; a side
measured at a single seed (a deterministic codec, the baseline) is broadcast across the other's
seeds; otherwise seeds are matched by value (two codecs' draws for one seed value are
independent, so this is a valid pairing, and a prompt effect shared by A and B cancels). The
difference gets the same interval; its word, at 95%: "better" / "worse" by the metric's
direction ("higher" / "lower" where it has none), "indistinguishable" where the interval holds
0. Each word is a test of its own: no multiplicity correction.

Everything here is deterministic (no resampling), so summaries of identical rows are identical.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

import numpy as np

LEVEL = 0.95

#: {(prompt id, codec seed): value}
Cells = Mapping[tuple[str, int], float]


@dataclass(frozen=True)
class Interval:
    """The mean of a grid of cells and its interval. ``ci95`` is None with fewer than two cells or
    a non-finite value; ``method`` names how it was computed ("crossed", "prompts", "seeds",
    "prompt means", "n = 1", "not finite", "no values")."""
    mean: float | None
    ci95: tuple[float, float] | None
    n: int
    prompts: int
    seeds: tuple[int, ...]
    method: str
    df: float | None = None

    def to_json(self) -> dict:
        return {"mean": self.mean, "ci95": self.ci95, "n": self.n}


@dataclass(frozen=True)
class Comparison:
    """A - B on the paired cells: the interval of the difference and its word (None: no interval)."""
    diff: Interval
    word: str | None

    def to_json(self) -> dict:
        return {"mean": self.diff.mean, "ci95": self.diff.ci95, "word": self.word, "n": self.diff.n}


def grid(cells: Cells) -> tuple[list[str], list[int], np.ndarray]:
    """(prompts, seeds, y [P, S]) from ``cells``, sorted so row order does not matter; a missing
    cell is NaN."""
    prompts = sorted({p for p, _ in cells})
    seeds = sorted({s for _, s in cells})
    y = np.full((len(prompts), len(seeds)), np.nan)
    pi, si = {p: i for i, p in enumerate(prompts)}, {s: j for j, s in enumerate(seeds)}
    for (p, s), v in cells.items():
        y[pi[p], si[s]] = v
    return prompts, seeds, y


def _t_interval(x: np.ndarray, level: float) -> tuple[float, tuple[float, float], float]:
    """Mean, t-interval and df of independent values x [n], n >= 2."""
    mean = float(x.mean())
    return mean, _around(mean, float(x.var(ddof=1)) / len(x), len(x) - 1, level), float(len(x) - 1)


def _around(mean: float, var: float, df: float, level: float) -> tuple[float, float]:
    from scipy.stats import t

    if var <= 0:  # every value equal (e.g. two identical configs): the interval is the point
        return mean, mean
    half = float(t.ppf(0.5 + level / 2, df)) * math.sqrt(var)
    return mean - half, mean + half


def crossed(y: np.ndarray, level: float = LEVEL) -> tuple[float, tuple[float, float], float]:
    """Mean, interval and Satterthwaite df of a complete grid y [P, S], P, S >= 2 (module docstring)."""
    P, S = y.shape
    mean = float(y.mean())
    rows, cols = y.mean(axis=1), y.mean(axis=0)
    ms_p = S * float(((rows - mean) ** 2).sum()) / (P - 1)
    ms_s = P * float(((cols - mean) ** 2).sum()) / (S - 1)
    resid = y - rows[:, None] - cols[None, :] + mean
    ms_e = float((resid ** 2).sum()) / ((P - 1) * (S - 1))
    terms = [(ms_p, P - 1), (ms_s, S - 1), (-ms_e, (P - 1) * (S - 1))]
    combined = ms_p + ms_s - ms_e
    if combined < max(ms_p, ms_s):  # clamped: the one-factor estimate (module docstring)
        terms = [max((ms_p, P - 1), (ms_s, S - 1))]
        combined = terms[0][0]
    denom = sum(c * c / df for c, df in terms)
    df = combined * combined / denom if denom > 0 else float(P * S - 1)
    return mean, _around(mean, combined / (P * S), df, level), df


def interval(cells: Cells, level: float = LEVEL) -> Interval:
    """The mean of ``cells`` and its ``level`` interval (module docstring). NaN cells are missing."""
    cells = {k: float(v) for k, v in cells.items() if not math.isnan(v)}
    if not cells:
        return Interval(None, None, 0, 0, (), "no values")
    prompts, seeds, y = grid(cells)
    n, P, S = len(cells), len(prompts), len(seeds)
    if not all(math.isfinite(v) for v in cells.values()):
        return Interval(float(np.mean(list(cells.values()))), None, n, P, tuple(seeds), "not finite")
    if n == 1:
        return Interval(float(y[~np.isnan(y)][0]), None, 1, 1, tuple(seeds), "n = 1")
    if n < P * S:
        means = np.nanmean(y, axis=1) if P > 1 else y[0][~np.isnan(y[0])]
        method = "prompt means" if P > 1 else "seeds"
        mean, ci, df = _t_interval(means, level)
    elif S == 1 or P == 1:
        method = "prompts" if S == 1 else "seeds"
        mean, ci, df = _t_interval(y.ravel(), level)
    else:
        method = "crossed"
        mean, ci, df = crossed(y, level)
    return Interval(mean, ci, n, P, tuple(seeds), method, df)


def pair_cells(a: Cells, b: Cells, broadcast: bool = True) -> dict[tuple[str, int], float]:
    """{cell: a - b} on the cells both have. With ``broadcast`` a side with a single seed (a codec
    without random draws, the baseline) is broadcast across the other's seeds; otherwise seeds are
    matched by value. inf - inf is kept as NaN, i.e. missing."""
    seeds_a, seeds_b = {s for _, s in a}, {s for _, s in b}
    if broadcast and len(seeds_a) == 1 and len(seeds_b) > 1:
        return {k: -d for k, d in pair_cells(b, a).items()}
    if broadcast and len(seeds_b) == 1:
        (sb,) = seeds_b
        pairs = [((p, s), x, b.get((p, sb))) for (p, s), x in a.items()]
    else:
        pairs = [(k, x, b.get(k)) for k, x in a.items()]
    out = {}
    for k, x, y in pairs:
        if y is not None:
            d = float(x) - float(y)
            out[k] = d if not (math.isinf(x) and math.isinf(y)) else float("nan")
    return out


def word(ci: tuple[float, float] | None, mean: float | None, higher_is_better: bool | None) -> str | None:
    """What A - B with interval ``ci`` says about A: "better" / "worse" by the metric's direction
    ("higher" / "lower" without one), "indistinguishable" where ``ci`` holds 0; None without ``ci``."""
    if ci is None or mean is None:
        return None
    if ci[0] <= 0 <= ci[1]:
        return "indistinguishable"
    higher = mean > 0
    if higher_is_better is None:
        return "higher" if higher else "lower"
    return "better" if higher == higher_is_better else "worse"


def paired(a: Cells, b: Cells, higher_is_better: bool | None, level: float = LEVEL,
           broadcast: bool = True) -> Comparison:
    """A - B on the paired cells (:func:`pair_cells`), its interval and word."""
    diff = interval(pair_cells(a, b, broadcast), level)
    return Comparison(diff, word(diff.ci95, diff.mean, higher_is_better))
