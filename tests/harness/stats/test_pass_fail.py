"""harness/stats/pass_fail.py, checked against figures computed independently of it: McNemar's p against
scipy's binomial test and by hand, Newcombe's interval against a published example, the formula
evaluated here with numpy and its exact coverage, Benjamini-Hochberg against scipy, the
non-inferiority bound against harness.stats.intervals.interval's 90% interval, and the minimum detectable
differences by simulated power."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import gammaln
from scipy.stats import binomtest, false_discovery_control, norm
from scipy.stats import t as student_t

from harness.stats.pass_fail import (benjamini_hochberg, is_binary, mcnemar, mcnemar_p, minimum_detectable_difference,
                                  newcombe_paired, non_inferiority, pair_values, wilson)
from harness.stats.intervals import interval, pair_cells, paired

N_SIMULATIONS = 4000
POWER_BAND = (0.77, 0.83)  # 0.80 ± ~4.7 binomial standard errors at 4000 draws


def table_cells(n11: int, n10: int, n01: int, n00: int) -> tuple[dict, dict]:
    """Two single-seed grids whose paired outcomes are n11 x (1, 1), n10 x (1, 0), n01 x (0, 1), n00 x (0, 0)."""
    pairs = [(1, 1)] * n11 + [(1, 0)] * n10 + [(0, 1)] * n01 + [(0, 0)] * n00
    return ({(f"p{i}", 0): float(x) for i, (x, _) in enumerate(pairs)},
            {(f"p{i}", 0): float(y) for i, (_, y) in enumerate(pairs)})


# --- binary cells and pairing ------------------------------------------------------------------------
def test_is_binary():
    assert is_binary({("p", 0): 1.0, ("q", 0): 0.0, ("r", 0): True, ("s", 0): float("nan")})
    assert is_binary({("p", 0): 1, ("q", 0): float("inf")})  # non-finite cells are missing
    assert not is_binary({("p", 0): 1.0, ("q", 0): 0.5})
    assert not is_binary({("p", 0): 2.0})


@pytest.mark.parametrize("seeds_a, seeds_b, broadcast", [
    ((0, 1, 2), (0,), True),      # a single-seed baseline broadcast under a 3-seed codec
    ((0,), (0, 1, 2), True),      # ... on either side
    ((5,), (0, 1, 2), True),      # the single seed's value does not matter when broadcast
    ((0, 1, 2), (1, 2, 3), True),  # seeds matched by value
    ((0, 1, 2), (0,), False),     # no broadcast: only seed 0 pairs
])
def test_pair_values_pairs_as_pair_cells_does(seeds_a, seeds_b, broadcast):
    rng = np.random.default_rng(11)
    a = {(f"p{i}", s): float(rng.normal()) for i in range(4) for s in seeds_a}
    b = {(f"p{i}", s): float(rng.normal()) for i in range(1, 5) for s in seeds_b}  # p0 and p4 unpaired
    got = {k: x - y for k, (x, y) in pair_values(a, b, broadcast).items()}
    assert got == pytest.approx(pair_cells(a, b, broadcast)) and got  # one float64 subtraction each: default rel


def test_single_seed_baseline_is_broadcast_across_a_three_seed_codec():
    base = {("p0", 0): 1.0, ("p1", 0): 1.0, ("p2", 0): 0.0, ("p3", 0): 0.0}
    codec = {("p0", 0): 1.0, ("p0", 1): 0.0, ("p0", 2): 0.0,   # p0: two losses against a pass
             ("p1", 0): 1.0, ("p1", 1): 1.0, ("p1", 2): 1.0,   # p1: three ties
             ("p2", 0): 1.0, ("p2", 1): 0.0, ("p2", 2): 0.0,   # p2: one win against a fail
             ("p3", 0): 0.0, ("p3", 1): 0.0, ("p3", 2): 0.0}   # p3: three ties
    r = mcnemar(codec, base, higher_is_better=True)
    assert (r.n, r.n10, r.n01) == (12, 1, 2) and r.diff == pytest.approx(-1 / 12)  # one float64 division: default rel
    flipped = mcnemar(base, codec, higher_is_better=True)
    assert (flipped.n, flipped.n10, flipped.n01) == (12, 2, 1)
    assert mcnemar(codec, base, True, broadcast=False).n == 4  # only seed 0 pairs


# --- McNemar ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n10, n01", [(0, 0), (3, 3), (1, 6), (6, 1), (0, 5), (12, 30), (40, 25), (101, 77)])
def test_mcnemar_p_is_the_exact_binomial_test(n10, n01):
    a, b = table_cells(7, n10, n01, 4)
    r = mcnemar(a, b, higher_is_better=True)
    expected = 1.0 if n10 + n01 == 0 else binomtest(min(n10, n01), n10 + n01, 0.5).pvalue
    assert (r.n10, r.n01, r.n) == (n10, n01, 11 + n10 + n01)
    # rel 1e-9: two float64 routes to one binomial tail (binom.cdf's incomplete beta; binomtest's cdf + sf of
    # the mirrored tail), each good to a few 1e-15 (Boost's ibeta): 1e-9 is far above, a wrong tail far below
    assert r.p == pytest.approx(expected, rel=1e-9) and r.p <= 1.0


def test_mcnemar_p_by_hand():
    # 1 vs 6 discordant: 2 (C(7,0) + C(7,1)) / 2^7 = 16/128; 0 vs 5: 2 / 2^5 (scipy's float64 binomial tail:
    # approx's default rel 1e-6 is far above its ~1e-14 error)
    assert mcnemar_p(1, 6) == pytest.approx(16 / 128) and mcnemar_p(6, 1) == pytest.approx(16 / 128)
    assert mcnemar_p(0, 5) == pytest.approx(2 / 32)
    assert mcnemar_p(4, 4) == 1.0 and mcnemar_p(0, 0) == 1.0  # 2 P[X <= 4] > 1: capped


def test_mcnemar_word_follows_p_and_direction():
    a, b = table_cells(5, 0, 8, 5)  # p = 2/256: B passes 8 cells A fails, never the reverse
    assert mcnemar(a, b, True).word == "worse" and mcnemar(b, a, True).word == "better"
    assert mcnemar(a, b, False).word == "better" and mcnemar(a, b, None).word == "lower"
    assert mcnemar(b, a, None).word == "higher"
    a, b = table_cells(5, 1, 6, 5)  # p = 0.125
    assert mcnemar(a, b, True).word == "indistinguishable"
    assert mcnemar(a, b, True, level=0.80).word == "worse"  # 0.125 < 1 - 0.80


def test_mcnemar_missing_and_invalid_cells():
    a, b = table_cells(2, 1, 1, 2)
    a[("p0", 0)] = float("nan")  # a missing cell drops its pair
    assert mcnemar(a, b, True).n == 5
    empty = mcnemar({}, b, True)
    assert (empty.n, empty.diff, empty.p, empty.ci95, empty.word) == (0, None, None, None, None)
    with pytest.raises(ValueError, match="0 or 1"):
        mcnemar({("p0", 0): 0.5}, {("p0", 0): 1.0}, True)
    assert set(mcnemar(*table_cells(2, 1, 1, 2), True).to_json()) == {"n", "n10", "n01", "diff", "p", "ci95", "word"}


# --- Newcombe's interval ------------------------------------------------------------------------------
def test_newcombe_interval_matches_a_published_example():
    # Complete response before and after consolidation therapy (Cavo et al. 2012), the paired 2x2 example of
    # Fagerland, Lydersen & Laake, Statistical Analysis of Contingency Tables (2017) ch. 8 and Stat Med
    # 33:2850 (2014): [[59, 6], [16, 80]], Newcombe square-and-add -0.0621 (95% CI -0.1186 to -0.0046), as
    # printed by the book's companion R package contingencytables (tests/testthat/test-ch8.R).
    r = mcnemar(*table_cells(59, 6, 16, 80), higher_is_better=True)
    assert round(r.diff, 4) == -0.0621
    assert (round(r.ci95[0], 4), round(r.ci95[1], 4)) == (-0.1186, -0.0046)


def wilson_by_roots(x: int, n: int, z: float) -> tuple[float, float]:
    """The Wilson limits as the two roots of (q - x/n)² = z² q (1 - q) / n."""
    p = x / n
    lo, hi = sorted(np.roots([1 + z * z / n, -(2 * p + z * z / n), p * p]).real)
    return float(lo), float(hi)


@pytest.mark.parametrize("table", [(59, 6, 16, 80), (1, 1, 7, 12), (36, 12, 2, 0), (0, 0, 0, 9), (5, 0, 3, 2),
                                   (10, 4, 4, 10), (0, 9, 1, 0)])
@pytest.mark.parametrize("level", [0.95, 0.90])
def test_newcombe_interval_against_the_formula_evaluated_here(table, level):
    a, b, c, d = table
    n, z = a + b + c + d, norm.ppf(0.5 + level / 2)
    first = np.array([1] * (a + b) + [0] * (c + d))  # each pair as two 0/1 vectors
    second = np.array([1] * a + [0] * b + [1] * c + [0] * d)
    p1, p2 = first.mean(), second.mean()
    l1, u1 = wilson_by_roots(a + b, n, z)
    l2, u2 = wilson_by_roots(a + c, n, z)
    # abs 1e-12: the closed form against numpy's companion-matrix roots of a quadratic with coefficients <= 3,
    # both float64 (an eigenvalue solver's backward error is a small multiple of U64 times the coefficients)
    assert wilson(a + b, n, level) == pytest.approx((l1, u1), abs=1e-12)
    if first.std() == 0 or second.std() == 0:
        phi = 0.0
    else:  # Pearson's phi of the pairs, with Newcombe's correction of ad - bc by n/2 when positive
        phi = float(np.corrcoef(first, second)[0, 1])
        scale = math.sqrt((a + b) * (c + d) * (a + c) * (b + d))
        phi = max(phi - n / 2 / scale, 0.0) if a * d > b * c else phi
    lo = p1 - p2 - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2))
    hi = p1 - p2 + math.sqrt((p2 - l2) ** 2 + (u1 - p1) ** 2 - 2 * phi * (p2 - l2) * (u1 - p1))
    # abs 1e-10: the limits above (to 1e-12 each) through a square root whose argument may be as small as
    # ~1e-3 here (d sqrt(x) = dx / 2 sqrt(x)), and numpy's corrcoef against the closed-form phi, all float64
    assert newcombe_paired(a, b, c, d, level) == pytest.approx((lo, hi), abs=1e-10)
    assert lo <= p1 - p2 <= hi


@pytest.mark.parametrize("n, p11, p10, p01", [(30, 0.3, 0.2, 0.1), (30, 0.1, 0.3, 0.2), (40, 0.5, 0.15, 0.05)])
def test_newcombe_interval_covers_at_about_its_level(n, p11, p10, p01):
    # exact coverage: the sum of the multinomial probabilities of every table whose interval holds p10 - p01
    probs = np.array([p11, p10, p01, 1 - p11 - p10 - p01])
    tables = np.array([(a, b, c, n - a - b - c) for a in range(n + 1) for b in range(n + 1 - a)
                       for c in range(n + 1 - a - b)])
    pmf = np.exp(gammaln(n + 1) - gammaln(tables + 1).sum(axis=1) + (tables * np.log(probs)).sum(axis=1))
    theta = p10 - p01
    covered = np.array([lo <= theta <= hi for lo, hi in (newcombe_paired(*map(int, t)) for t in tables)])
    assert pmf.sum() == pytest.approx(1.0)  # float64 lgamma, exp and a 12k-term sum: ~1e-12, default rel
    assert 0.935 <= float(pmf[covered].sum()) <= 0.975


# --- Benjamini-Hochberg ------------------------------------------------------------------------------
def test_benjamini_hochberg_matches_scipy():
    rng = np.random.default_rng(5)
    p = np.concatenate([rng.uniform(0, 1, 30), rng.uniform(0, 0.01, 10), [0.02, 0.02, 0.02, 1.0, 0.0]])
    rng.shuffle(p)
    q = benjamini_hochberg(list(p))
    assert q == pytest.approx(list(false_discovery_control(p)), rel=1e-12)  # m p / rank: two float64 roundings each
    order = np.argsort(p)
    assert all(np.diff(np.array(q)[order]) >= 0) and max(q) <= 1.0 and all(qi >= pi for qi, pi in zip(q, p))


def test_benjamini_hochberg_passes_missing_entries_through():
    p = [0.01, None, 0.04, float("nan"), 0.03]
    q = benjamini_hochberg(p)
    assert q[1] is None and q[3] is None
    assert [q[0], q[2], q[4]] == pytest.approx(list(false_discovery_control([0.01, 0.04, 0.03])))  # float64: default
    assert benjamini_hochberg([]) == [] and benjamini_hochberg([None]) == [None]
    with pytest.raises(ValueError):
        benjamini_hochberg([0.5, 1.5])


# --- non-inferiority ----------------------------------------------------------------------------------
def crossed_cells(rng, shift: float, P: int = 8, S: int = 3) -> dict:
    y = shift + rng.normal(0, 0.5, P)[:, None] + rng.normal(0, 0.3, S)[None, :] + rng.normal(0, 0.2, (P, S))
    return {(f"p{i}", j): float(y[i, j]) for i in range(P) for j in range(S)}


@pytest.mark.parametrize("P, S", [(8, 3), (10, 1)])
def test_non_inferiority_bound_is_the_end_of_the_90_percent_interval(P, S):
    rng = np.random.default_rng(17)
    b = crossed_cells(rng, 0.0, P, S)
    noise = rng.normal(0, 0.3, len(b))
    a = {k: v + e for (k, v), e in zip(b.items(), noise - noise.mean() + 0.02)}  # A - B: mean 0.02, sd 0.3
    d = pair_cells(a, b)
    lo90, hi90 = interval(d, level=0.90).ci95
    assert lo90 < 0 < hi90  # so a margin can sit on either side of each bound
    comparison = paired(a, b, higher_is_better=True)
    for given in (d, comparison, comparison.diff):  # cells, Comparison and Interval routes agree
        up = non_inferiority(given, margin=0.5, higher_is_better=True)
        down = non_inferiority(given, margin=0.5, higher_is_better=False)
        # rel 1e-9: one float64 interval reached by three routes (an SE recovered from the interval's width and
        # rescaled: a few roundings and a t quantile evaluated twice, scipy's ppf converging to ~1e-12)
        assert up.bound == pytest.approx(lo90, rel=1e-9) and down.bound == pytest.approx(hi90, rel=1e-9)
        assert up.mean == pytest.approx(comparison.diff.mean)  # the same float64 mean: default rel
    # the verdict turns exactly where the margin meets the bound
    assert non_inferiority(d, -lo90 + 1e-6, True).verdict == "non-inferior"
    assert non_inferiority(d, -lo90 - 1e-6, True).verdict == "not shown"
    assert non_inferiority(d, hi90 + 1e-6, False).verdict == "non-inferior"
    assert non_inferiority(d, hi90 - 1e-6, False).verdict == "not shown"
    lo80 = interval(d, level=0.80).ci95[0]
    assert non_inferiority(d, 0.5, True, level=0.90).bound == pytest.approx(lo80)  # float64, as above: default rel


def test_non_inferiority_without_an_interval_is_not_shown():
    r = non_inferiority({("p", 0): 0.1}, margin=1.0, higher_is_better=True)
    assert (r.mean, r.bound, r.verdict) == (0.1, None, "not shown")
    assert set(r.to_json()) == {"mean", "bound", "margin", "verdict", "level"}
    with pytest.raises(ValueError):
        non_inferiority({("p", 0): 0.1, ("q", 0): 0.2}, margin=-1.0, higher_is_better=True)


# --- minimum detectable difference --------------------------------------------------------------------
def test_continuous_mdd_by_formula_and_simulated_power():
    P, sigma = 10, 1.0
    z = np.random.default_rng(0).normal(size=P)
    pilot = {(f"p{i}", 0): float(v) for i, v in enumerate((z - z.mean()) / z.std(ddof=1) * sigma)}  # SD sigma
    mdd = minimum_detectable_difference(pilot)
    se = sigma / math.sqrt(P)
    assert mdd == pytest.approx((student_t.ppf(0.975, P - 1) + student_t.ppf(0.8, P - 1)) * se)  # float64: default rel
    # a true difference of mdd, with that SD, is found (95% interval above 0) about 80% of the time
    rng = np.random.default_rng(2024)
    found = 0
    for _ in range(N_SIMULATIONS):
        d = rng.normal(mdd, sigma, P)
        found += interval({(f"p{i}", 0): float(v) for i, v in enumerate(d)}).ci95[0] > 0
    assert POWER_BAND[0] <= found / N_SIMULATIONS <= POWER_BAND[1]


def test_continuous_mdd_uses_the_interval_of_a_crossed_grid():
    rng = np.random.default_rng(3)
    d = pair_cells(crossed_cells(rng, 0.2), crossed_cells(rng, 0.0))
    iv = interval(d)
    se = (iv.ci95[1] - iv.ci95[0]) / 2 / student_t.ppf(0.975, iv.df)  # the SE behind the 95% interval
    expected = (student_t.ppf(0.975, iv.df) + student_t.ppf(0.9, iv.df)) * se
    # float64 quantiles and a few products: approx's default rel 1e-6 is far above their rounding
    assert minimum_detectable_difference(d, power=0.9) == pytest.approx(expected)
    assert minimum_detectable_difference(iv, power=0.9) == pytest.approx(expected)
    assert minimum_detectable_difference({("p", 0): 1.0}) is None  # one cell
    assert minimum_detectable_difference({("p", 0): 1.0, ("q", 0): 1.0}) == 0.0  # no spread at all


@pytest.mark.parametrize("n, psi", [(200, 0.3), (400, 0.1)])
def test_binary_mdd_solves_connors_formula_and_has_its_power(n, psi):
    delta = minimum_detectable_difference(n=n, discordance=psi)
    za, zb = norm.ppf(0.975), norm.ppf(0.8)
    # float64 closed-form root put back into the equation (a few roundings, amplified by 1/delta^2 ~ 50): default rel
    assert (za * math.sqrt(psi) + zb * math.sqrt(psi - delta ** 2)) ** 2 / delta ** 2 == pytest.approx(n)
    # simulated: pairs discordant at rate psi, split (psi ± delta)/2; McNemar's z-test (Connor's) rejects ~80%
    rng = np.random.default_rng(99)
    counts = rng.multinomial(n, [(psi + delta) / 2, (psi - delta) / 2, 1 - psi], size=N_SIMULATIONS)
    n10, n01 = counts[:, 0], counts[:, 1]
    z = (n10 - n01) / np.sqrt(np.maximum(n10 + n01, 1))
    power = float(np.mean(np.abs(z) > za))
    assert POWER_BAND[0] <= power <= POWER_BAND[1]
    exact = np.mean([mcnemar_p(int(x), int(y)) < 0.05 for x, y in zip(n10, n01)])
    assert 0.70 <= exact <= power  # the exact test is discrete, so a little conservative


def test_binary_mdd_where_it_cannot_be_computed():
    assert minimum_detectable_difference(n=1, discordance=0.5) is None
    assert minimum_detectable_difference(n=100, discordance=0.0) is None  # no discordant pairs
    assert minimum_detectable_difference(n=5, discordance=0.05) is None  # even delta = psi is not detectable
    with pytest.raises(TypeError):
        minimum_detectable_difference()
    with pytest.raises(TypeError):
        minimum_detectable_difference({("p", 0): 1.0}, n=10, discordance=0.2)
