"""Paired tests for pass/fail metrics, multiplicity, non-inferiority and detectable differences.

Cells are :data:`harness.stats.intervals.Cells`, {(prompt id, codec seed): value}, paired as
:func:`harness.stats.intervals.pair_cells` pairs them: a side measured at a single seed (a deterministic
codec, the baseline) is broadcast across the other's seeds, otherwise seeds are matched by value.
Everything here is a pure, deterministic function of its arguments.

McNemar's test (:func:`mcnemar`; McNemar 1947, Psychometrika 12:153-157). On n paired binary
cells, n10 pairs have A = 1, B = 0 and n01 have A = 0, B = 1. The difference of the paired pass
rates is (n10 - n01) / n. Given the n10 + n01 discordant pairs, n10 is Binomial(n10 + n01, 1/2)
when A and B pass equally often, so the exact two-sided p-value is

    p = min(1, 2 · P[Binomial(n10 + n01, 1/2) <= min(n10, n01)])     (1 without discordant pairs).

The test treats the paired cells as independent pairs. With several codec seeds per prompt the
pairs of one prompt are not (a broadcast baseline repeats its value), so p is too small where
prompts, rather than seeds, decide pass or fail; with one seed per prompt it is exact.

The interval of the difference is Newcombe's hybrid score interval for paired proportions, method
10 of Newcombe (1998, Stat Med 17:2635-2650, "Improved confidence intervals for the difference
between binomial proportions based on paired data"). With a = both pass, b = n10, c = n01,
d = neither, p1 = (a + b)/n, p2 = (a + c)/n, Wilson score limits (l1, u1), (l2, u2) for p1 and p2,

    lower = (p1 - p2) - sqrt((p1 - l1)² - 2φ(p1 - l1)(u2 - p2) + (u2 - p2)²)
    upper = (p1 - p2) + sqrt((p2 - l2)² - 2φ(p2 - l2)(u1 - p1) + (u1 - p1)²)

where φ estimates the correlation of the pair, C / sqrt((a+b)(c+d)(a+c)(b+d)) with
C = max(ad - bc - n/2, 0) if ad > bc, else ad - bc; φ = 0 if a margin is empty. This corrected φ
is the one Newcombe uses, and the one in Newcombe & Altman (Statistics with Confidence, 2000) and
Fagerland, Lydersen & Laake (Statistical Analysis of Contingency Tables, 2017, "Newcombe
square-and-add"); the plain Pearson φ gives a slightly narrower interval.

Benjamini-Hochberg (:func:`benjamini_hochberg`; Benjamini & Hochberg 1995, JRSS B 57:289-300).
Sorted p(1) <= ... <= p(m) get q(i) = min over j >= i of min(1, m · p(j) / j), the smallest
false discovery rate at which each would be rejected; the words of :mod:`harness.stats.intervals` are
tests of their own, and this is the correction to use when many comparisons are read together.

Non-inferiority (:func:`non_inferiority`; the confidence-interval form, e.g. CONSORT's extension,
Piaggio et al. 2012, JAMA 308:2594-2604). A is no worse than B by more than ``margin`` when the
one-sided ``level`` bound of A - B lies beyond -margin (higher is better) or below +margin (lower
is better). The bound comes from the interval of :func:`harness.stats.intervals.interval` (same variance
model, df): the one-sided 95% bound is an end of the two-sided 90% interval.

Minimum detectable difference (:func:`minimum_detectable_difference`), at two-sided alpha =
1 - level and the given power (0.8):

* continuous paired differences: MDD = (t(1 - alpha/2, df) + t(power, df)) · SE, where SE and df
  are those of the difference's :func:`harness.stats.intervals.interval` (over one seed: SD of the
  per-prompt differences / sqrt(P), df = P - 1); the usual t approximation to the power of the
  t-interval, within 0.003 of the noncentral-t power for P >= 8;
* binary paired outcomes (McNemar): Connor's (1987, Biometrics 43:207-211) normal approximation
  n = (z(1 - alpha/2) sqrt(ψ) + z(power) sqrt(ψ - δ²))² / δ², with ψ the discordance rate
  (n10 + n01)/n, solved for δ:  δ = sqrt(ψ) (z_a sqrt(n) + z_b sqrt(n - z_a² + z_b²)) / (n + z_b²).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from collections.abc import Mapping, Sequence

from harness.stats.intervals import LEVEL, Cells, Comparison, Interval, interval

POWER = 0.8


def is_binary(cells: Cells) -> bool:
    """True when every finite value of ``cells`` is 0 or 1 (NaN and inf are missing cells, so a
    grid with none left is binary too)."""
    return all(v in (0, 1) for v in cells.values() if math.isfinite(v))


def pair_values(a: Cells, b: Cells, broadcast: bool = True) -> dict[tuple[str, int], tuple[float, float]]:
    """{cell: (a value, b value)} on the cells both have, paired as :func:`harness.stats.intervals.pair_cells`
    pairs them: with ``broadcast`` a single-seed side is repeated across the other's seeds (the
    keys are then the other side's cells), otherwise seeds are matched by value."""
    seeds_a, seeds_b = {s for _, s in a}, {s for _, s in b}
    if broadcast and len(seeds_a) == 1 and len(seeds_b) > 1:
        return {k: (x, y) for k, (y, x) in pair_values(b, a).items()}
    if broadcast and len(seeds_b) == 1:
        (sb,) = seeds_b
        pairs = (((p, s), x, b.get((p, sb))) for (p, s), x in a.items())
    else:
        pairs = ((k, x, b.get(k)) for k, x in a.items())
    return {k: (float(x), float(y)) for k, x, y in pairs if y is not None}


# --- McNemar --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class McNemar:
    """A against B on paired pass/fail cells: n paired cells, n10 with A = 1 and B = 0, n01 with
    A = 0 and B = 1; ``diff`` = (n10 - n01)/n, A's pass rate minus B's; ``p`` the exact two-sided
    McNemar p-value; ``ci95`` Newcombe's interval of ``diff`` at ``level``; ``word`` as in
    :func:`harness.stats.intervals.word`, from ``p``. diff, p, ci95 and word are None without paired cells."""
    n: int
    n10: int
    n01: int
    diff: float | None
    p: float | None
    ci95: tuple[float, float] | None
    word: str | None
    level: float = LEVEL

    def to_json(self) -> dict:
        return {"n": self.n, "n10": self.n10, "n01": self.n01, "diff": self.diff, "p": self.p,
                "ci95": self.ci95, "word": self.word}


def mcnemar_p(n10: int, n01: int) -> float:
    """The exact two-sided McNemar p-value: min(n10, n01) in n10 + n01 trials at 1/2, doubled,
    capped at 1; 1.0 without discordant pairs."""
    from scipy.stats import binom

    if n10 + n01 == 0:
        return 1.0
    return min(1.0, 2.0 * float(binom.cdf(min(n10, n01), n10 + n01, 0.5)))


def wilson(x: int, n: int, level: float = LEVEL) -> tuple[float, float]:
    """Wilson's score interval for the proportion x/n, n >= 1."""
    from scipy.stats import norm

    z = float(norm.ppf(0.5 + level / 2))
    p = x / n
    centre, half = p + z * z / (2 * n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (centre - half) / (1 + z * z / n), (centre + half) / (1 + z * z / n)


def newcombe_paired(a: int, b: int, c: int, d: int, level: float = LEVEL) -> tuple[float, float]:
    """Newcombe's (1998) method 10 interval for p1 - p2 = (b - c)/n of the paired table
    [[a, b], [c, d]] (a: both pass, b: only the first, c: only the second, d: neither), with the
    corrected φ (module docstring). n = a + b + c + d >= 1."""
    n = a + b + c + d
    p1, p2 = (a + b) / n, (a + c) / n
    l1, u1 = wilson(a + b, n, level)
    l2, u2 = wilson(a + c, n, level)
    margins = (a + b) * (c + d) * (a + c) * (b + d)
    cross = a * d - b * c
    corrected = max(cross - n / 2, 0.0) if cross > 0 else cross
    phi = corrected / math.sqrt(margins) if margins > 0 else 0.0
    lo = (p1 - p2) - math.sqrt(max((p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2, 0.0))
    hi = (p1 - p2) + math.sqrt(max((p2 - l2) ** 2 - 2 * phi * (p2 - l2) * (u1 - p1) + (u1 - p1) ** 2, 0.0))
    return lo, hi


def _direction(higher: bool, higher_is_better: bool | None) -> str:
    if higher_is_better is None:
        return "higher" if higher else "lower"
    return "better" if higher == higher_is_better else "worse"


def mcnemar(a: Cells, b: Cells, higher_is_better: bool | None, level: float = LEVEL,
            broadcast: bool = True) -> McNemar:
    """A - B on the paired pass/fail cells (:func:`pair_values`; a pair with a NaN or inf side is
    missing): McNemar's exact test, Newcombe's interval and the word ("better" / "worse" by the
    metric's direction, "higher" / "lower" without one, "indistinguishable" where p >= 1 - level).
    A finite value other than 0 or 1 raises ValueError."""
    pairs = [(x, y) for x, y in pair_values(a, b, broadcast).values() if math.isfinite(x) and math.isfinite(y)]
    bad = next((v for pair in pairs for v in pair if v not in (0, 1)), None)
    if bad is not None:
        raise ValueError(f"McNemar needs values 0 or 1; got {bad}")
    n = len(pairs)
    n11 = sum(1 for x, y in pairs if x == 1 and y == 1)
    n10 = sum(1 for x, y in pairs if x == 1 and y == 0)
    n01 = sum(1 for x, y in pairs if x == 0 and y == 1)
    if n == 0:
        return McNemar(0, 0, 0, None, None, None, None, level)
    p = mcnemar_p(n10, n01)
    diff = (n10 - n01) / n
    word = "indistinguishable" if p >= 1 - level else _direction(n10 > n01, higher_is_better)
    return McNemar(n, n10, n01, diff, p, newcombe_paired(n11, n10, n01, n - n11 - n10 - n01, level), word, level)


# --- multiplicity ---------------------------------------------------------------------------------
def benjamini_hochberg(pvalues: Sequence[float | None]) -> list[float | None]:
    """Benjamini-Hochberg adjusted p-values (q-values) in input order: monotone in p, capped at 1.
    None and NaN entries are left out of the count m and come back as None; a p outside [0, 1]
    raises ValueError."""
    valid = [(i, float(p)) for i, p in enumerate(pvalues) if p is not None and not math.isnan(p)]
    if any(not 0 <= p <= 1 for _, p in valid):
        raise ValueError(f"p-values must lie in [0, 1]; got {[p for _, p in valid if not 0 <= p <= 1]}")
    out: list[float | None] = [None] * len(pvalues)
    m, running = len(valid), 1.0
    for rank, (i, p) in reversed(list(enumerate(sorted(valid, key=lambda ip: ip[1]), start=1))):
        running = min(running, m * p / rank)  # from the largest p down: q(i) = min over j >= i
        out[i] = running
    return out


# --- non-inferiority and detectable differences ---------------------------------------------------
def _as_interval(diff: Interval | Comparison | Cells) -> Interval:
    """The difference's interval at LEVEL: a Comparison's, an Interval as given, or that of cells."""
    if isinstance(diff, Comparison):
        return diff.diff
    if isinstance(diff, Interval):
        return diff
    return interval(diff, LEVEL)


def _se(iv: Interval) -> float | None:
    """The standard error behind ``iv.ci95`` (a ``LEVEL`` t-interval with ``iv.df``); None without one."""
    from scipy.stats import t

    if iv.ci95 is None or iv.df is None or iv.mean is None:
        return None
    return (iv.ci95[1] - iv.ci95[0]) / (2 * float(t.ppf(0.5 + LEVEL / 2, iv.df)))


@dataclass(frozen=True)
class NonInferiority:
    """A - B against the non-inferiority ``margin`` (in the metric's units, >= 0): ``bound`` is the
    one-sided ``level`` bound of A - B on the side that matters (lower when higher is better),
    None without an interval; ``verdict`` is "non-inferior" when the bound clears the margin,
    otherwise "not shown"."""
    mean: float | None
    bound: float | None
    margin: float
    verdict: str
    level: float = LEVEL

    def to_json(self) -> dict:
        return {"mean": self.mean, "bound": self.bound, "margin": self.margin, "verdict": self.verdict,
                "level": self.level}


def non_inferiority(diff: Interval | Comparison | Cells, margin: float, higher_is_better: bool,
                    level: float = LEVEL) -> NonInferiority:
    """Is A no worse than B by more than ``margin``? ``diff`` is A - B: cells of paired differences
    (:func:`harness.stats.intervals.pair_cells`), or their :class:`~harness.stats.intervals.Interval` (its ci95 taken at
    LEVEL) or :class:`~harness.stats.intervals.Comparison`. The one-sided ``level`` bound is mean -/+
    t(level, df) · SE, i.e. an end of :func:`harness.stats.intervals.interval` at 2·level - 1."""
    from scipy.stats import t

    if margin < 0 or not 0.5 < level < 1:
        raise ValueError(f"need margin >= 0 and 0.5 < level < 1; got margin {margin}, level {level}")
    if isinstance(diff, Mapping):  # straight from the cells: the two-sided 2·level - 1 interval's end
        iv = interval(diff, 2 * level - 1)
        bound = None if iv.ci95 is None else iv.ci95[0] if higher_is_better else iv.ci95[1]
    else:
        iv = _as_interval(diff)
        se = _se(iv)
        step = None if se is None else float(t.ppf(level, iv.df)) * se
        bound = None if step is None else iv.mean - step if higher_is_better else iv.mean + step
    shown = bound is not None and (bound > -margin if higher_is_better else bound < margin)
    return NonInferiority(iv.mean, bound, margin, "non-inferior" if shown else "not shown", level)


def minimum_detectable_difference(diff: Interval | Comparison | Cells | None = None, *, n: int | None = None,
                                  discordance: float | None = None, level: float = LEVEL,
                                  power: float = POWER) -> float | None:
    """The smallest true |A - B| detected (two-sided, alpha = 1 - level) with probability ``power``.

    Either ``diff``, continuous paired differences A - B (cells, or their Interval / Comparison):
    (t(1 - alpha/2, df) + t(power, df)) · SE with the SE and df of their interval; 0.0 when every
    difference is equal. Or ``n`` paired binary cells and their ``discordance`` rate (n10 + n01)/n:
    Connor's (1987) approximation for McNemar's test (module docstring), a difference of pass rates.
    None where it cannot be computed: fewer than two cells, a non-finite value; for the binary form
    n < z(1 - alpha/2)² (about 4, where Connor's equation has no root), no discordant pairs, or
    no difference possible at this discordance rate (|δ| <= ψ) is detectable.
    """
    from scipy.stats import norm, t

    if (diff is None) == (n is None or discordance is None):
        raise TypeError("give either diff (continuous) or n and discordance (binary)")
    if not 0.5 <= power < 1:
        raise ValueError(f"power must lie in [0.5, 1); got {power}")
    alpha = 1 - level
    if diff is not None:
        iv = _as_interval(diff)
        se = _se(iv)
        if se is None:
            return None
        return (float(t.ppf(1 - alpha / 2, iv.df)) + float(t.ppf(power, iv.df))) * se
    if not 0 <= discordance <= 1:
        raise ValueError(f"discordance is a rate in [0, 1]; got {discordance}")
    za, zb = float(norm.ppf(1 - alpha / 2)), float(norm.ppf(power))
    if n < 2 or n < za * za or discordance == 0:
        return None
    delta = math.sqrt(discordance) * (za * math.sqrt(n) + zb * math.sqrt(n - za * za + zb * zb)) / (n + zb * zb)
    return delta if delta <= discordance else None


def t_p(iv: Interval) -> float | None:
    """The two-sided p-value of "the mean difference is 0" under the t model of :func:`harness.stats.intervals.interval`
    (its SE and df): what the interval's word tests, as a number a multiplicity correction can take."""
    from scipy.stats import t

    se = _se(iv)
    if se is None:
        return None
    if se == 0:  # every difference equal
        return 1.0 if iv.mean == 0 else 0.0
    return float(2 * t.sf(abs(iv.mean) / se, iv.df))


@dataclass(frozen=True)
class Paired:
    """A - B as the reports compare them (:func:`compare`): the difference's ``mean`` and ``ci95``, the
    ``word``, ``n`` paired cells, the two-sided ``p``, the ``test`` ("mcnemar" for pass/fail cells, "t"
    otherwise) and ``mdd``, the smallest true difference these cells would detect (80% power)."""
    mean: float | None
    ci95: tuple[float, float] | None
    word: str | None
    n: int
    p: float | None
    test: str
    mdd: float | None

    def to_json(self) -> dict:
        return {"mean": self.mean, "ci95": self.ci95, "word": self.word, "n": self.n, "p": self.p,
                "test": self.test, "mdd": self.mdd}


def _one_per_prompt(a: Cells, b: Cells) -> tuple[Cells, Cells] | None:
    """Both sides as one pass/fail value per prompt (keyed (prompt, 0)), where they are: each side's cells
    averaged over its codec seeds stay 0 or 1 (a single seed, or seeds that agree). None otherwise, and
    where either side is not pass/fail: McNemar's pairs must be independent, so a prompt counts once."""
    if not (is_binary(a) and is_binary(b)) or not any(math.isfinite(v) for v in a.values()):
        return None
    out = []
    for cells in (a, b):
        by: dict[str, list[float]] = {}
        for (p, _), v in cells.items():
            if math.isfinite(v):
                by.setdefault(p, []).append(v)
        means = {(p, 0): sum(v) / len(v) for p, v in by.items()}
        if not is_binary(means):
            return None
        out.append(means)
    return out[0], out[1]


def compare(a: Cells, b: Cells, higher_is_better: bool | None, level: float = LEVEL) -> Paired:
    """A - B on the paired cells, by the test the outcome calls for: McNemar's exact test and Newcombe's
    interval where both sides are one pass/fail (0/1) value per prompt (:func:`_one_per_prompt`: seeds
    averaged, each prompt one pair), else :func:`harness.stats.intervals.paired` (the interval of the paired
    differences over prompts x codec seeds) with its t p-value (:func:`t_p`)."""
    from harness.stats.intervals import paired

    per_prompt = _one_per_prompt(a, b)
    if per_prompt is not None:
        m = mcnemar(*per_prompt, higher_is_better, level)
        mdd = None if not m.n else minimum_detectable_difference(n=m.n, discordance=(m.n10 + m.n01) / m.n,
                                                                 level=level)
        return Paired(m.diff, m.ci95, m.word, m.n, m.p, "mcnemar", mdd)
    c = paired(a, b, higher_is_better, level)
    return Paired(c.diff.mean, c.diff.ci95, c.word, c.diff.n, t_p(c.diff), "t",
                  minimum_detectable_difference(c, level=level))


def non_inferior(a: Cells, b: Cells, margin: float, higher_is_better: bool, level: float = LEVEL) -> NonInferiority:
    """Is A no worse than B by more than ``margin``, on their paired cells: for one pass/fail value per prompt
    on both sides (:func:`_one_per_prompt`) the bound is the end of Newcombe's 2·level - 1 interval of the
    paired difference of pass rates (a t-interval of 0/1 differences collapses where no pair disagrees),
    else :func:`non_inferiority` of the paired differences."""
    from harness.stats.intervals import pair_cells

    per_prompt = _one_per_prompt(a, b)
    if per_prompt is None:
        return non_inferiority(pair_cells(a, b), margin, higher_is_better, level)
    if margin < 0 or not 0.5 < level < 1:
        raise ValueError(f"need margin >= 0 and 0.5 < level < 1; got margin {margin}, level {level}")
    m = mcnemar(*per_prompt, higher_is_better, 2 * level - 1)
    bound = None if m.ci95 is None else m.ci95[0] if higher_is_better else m.ci95[1]
    shown = bound is not None and (bound > -margin if higher_is_better else bound < margin)
    return NonInferiority(m.diff, bound, margin, "non-inferior" if shown else "not shown", level)
