"""harness/stats/intervals.py: the interval of a prompts x codec seeds mean (checked by hand on small tables
and by its coverage on data drawn from known crossed random-effects models) and the paired
comparison (planted differences found, identical configs indistinguishable, pairing pairs)."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import t as student_t

from harness.stats.intervals import interval, pair_cells, paired, word

N_DATASETS = 2000
COVERAGE_BAND = (0.93, 0.97)  # 0.95 ± ~2.1 binomial standard errors at 2000 draws


def as_cells(y: np.ndarray) -> dict:
    """y [P, S] -> {(prompt, seed): value}, NaN cells left out."""
    return {(f"p{i}", j): float(y[i, j]) for i in range(y.shape[0]) for j in range(y.shape[1]) if not np.isnan(y[i, j])}


# --- the interval by hand --------------------------------------------------------------------------
def test_crossed_interval_by_hand():
    y = np.array([[1.0, 1.4, 0.9], [2.0, 2.6, 1.7], [0.5, 1.1, 0.6], [1.2, 1.5, 1.4]])  # P = 4, S = 3
    P, S = y.shape
    # sums of squares by the total decomposition: SS_resid = SS_total - SS_prompt - SS_seed
    g = y.mean()
    ss_total = ((y - g) ** 2).sum()
    ss_p = sum(S * (y[i].mean() - g) ** 2 for i in range(P))
    ss_s = sum(P * (y[:, j].mean() - g) ** 2 for j in range(S))
    ms_p, ms_s, ms_e = ss_p / (P - 1), ss_s / (S - 1), (ss_total - ss_p - ss_s) / ((P - 1) * (S - 1))
    combo = ms_p + ms_s - ms_e
    assert combo > max(ms_p, ms_s)  # this table needs no clamp
    df = combo ** 2 / (ms_p ** 2 / (P - 1) + ms_s ** 2 / (S - 1) + ms_e ** 2 / ((P - 1) * (S - 1)))
    half = student_t.ppf(0.975, df) * math.sqrt(combo / (P * S))
    iv = interval(as_cells(y))
    assert iv.method == "crossed" and iv.n == 12 and iv.prompts == 4 and iv.seeds == (0, 1, 2)
    # float64 sums of squares of 12 cells by two routes (a few 1e-16 each): approx's default rel 1e-6 is far above
    assert iv.mean == pytest.approx(g) and iv.df == pytest.approx(df)
    assert iv.ci95 == pytest.approx((g - half, g + half))


def test_clamped_when_the_residual_exceeds_an_effect():
    # pure interaction: no seed main effect at all, so MS_seed < MS_resid and the estimate is clamped
    y = np.array([[1.0, 3.0], [3.0, 1.0], [2.0, 4.0], [4.0, 2.0]])
    P, S = y.shape
    rows = y.mean(axis=1)
    ms_p = S * ((rows - y.mean()) ** 2).sum() / (P - 1)
    assert y.mean(axis=0).std() == 0  # MS_seed = 0
    half = student_t.ppf(0.975, P - 1) * math.sqrt(ms_p / (P * S))  # prompts' mean square, its own df
    iv = interval(as_cells(y))
    assert iv.df == pytest.approx(P - 1) and iv.ci95 == pytest.approx((y.mean() - half, y.mean() + half))  # float64


@pytest.mark.parametrize("shape", [(5, 1), (1, 4)])
def test_one_seed_or_one_prompt_is_the_ordinary_t_interval(shape):
    x = np.array([0.3, 0.9, 0.4, 1.3, 0.7][: max(shape)])
    y = x.reshape(shape)
    n = x.size
    half = student_t.ppf(0.975, n - 1) * x.std(ddof=1) / math.sqrt(n)
    iv = interval(as_cells(y))
    assert iv.method == ("prompts" if shape[1] == 1 else "seeds") and iv.df == n - 1
    assert iv.ci95 == pytest.approx((x.mean() - half, x.mean() + half))  # float64, a few roundings: default rel


def test_one_cell_has_no_interval_and_missing_cells_fall_back_to_prompt_means():
    iv = interval({("p", 0): 2.5})
    assert (iv.mean, iv.ci95, iv.n, iv.method) == (2.5, None, 1, "n = 1")
    y = np.array([[1.0, 1.2, 0.8], [2.0, np.nan, 2.4], [0.4, 0.6, np.nan]])
    means = np.array([1.0, 2.2, 0.5])  # each prompt over the seeds it has
    half = student_t.ppf(0.975, 2) * means.std(ddof=1) / math.sqrt(3)
    iv = interval(as_cells(y))
    assert iv.method == "prompt means" and iv.n == 7  # below: float64, a few roundings, approx's default rel
    assert iv.mean == pytest.approx(means.mean()) and iv.ci95 == pytest.approx((means.mean() - half, means.mean() + half))
    assert interval({("p", 0): float("inf"), ("q", 0): 1.0}).ci95 is None  # not finite: no interval
    assert interval({("p", 0): float("nan"), ("q", 0): 1.0}).n == 1  # NaN is a missing cell


# --- coverage ---------------------------------------------------------------------------------------
def draw(rng, P, S, sp, ss, se, skewed=False) -> np.ndarray:
    """One dataset y [P, S] = 1 + a[p] + b[s] + e[p, s] of true mean 1 (skewed: prompt effects and
    noise exponential, centred)."""
    if skewed:
        a, e = rng.exponential(sp, P) - sp, rng.exponential(se, (P, S)) - se
    else:
        a, e = rng.normal(0, sp, P), rng.normal(0, se, (P, S))
    return 1.0 + a[:, None] + rng.normal(0, ss, S)[None, :] + e


def naive_covers(y: np.ndarray) -> bool:
    """Treating the P·S cells as independent: the t-interval over all of them."""
    x = y.ravel()
    return abs(x.mean() - 1.0) <= student_t.ppf(0.975, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size)


@pytest.mark.parametrize("P, S, sp, ss, se, skewed", [
    (8, 3, 1.0, 1.0, 1.0, False),   # every component matters (of Var(mean): 25% prompts, 67% seeds, 8% noise)
    (6, 3, 0.3, 1.0, 0.3, False),   # seed-dominated
    (6, 1, 1.0, 0.0, 1.0, False),   # one seed (a deterministic codec)
    (6, 3, 0.5, 1.0, 0.5, True),    # skewed prompt effects and noise, as KL is
])
def test_coverage_of_the_crossed_interval(P, S, sp, ss, se, skewed):
    rng = np.random.default_rng(20240611)
    hits = 0
    for _ in range(N_DATASETS):
        lo, hi = interval(as_cells(draw(rng, P, S, sp, ss, se, skewed))).ci95
        hits += lo <= 1.0 <= hi
    assert COVERAGE_BAND[0] <= hits / N_DATASETS <= COVERAGE_BAND[1]


def test_naive_interval_undercovers_when_the_seed_dominates():
    rng = np.random.default_rng(7)
    ours = naive = 0
    for _ in range(N_DATASETS):
        y = draw(rng, 6, 3, 0.3, 1.0, 0.3)
        lo, hi = interval(as_cells(y)).ci95
        ours += lo <= 1.0 <= hi
        naive += naive_covers(y)
    assert ours / N_DATASETS >= COVERAGE_BAND[0] and naive / N_DATASETS < 0.75


# --- paired comparisons -----------------------------------------------------------------------------
@pytest.fixture
def shared():
    """A [8, 3] with a large prompt effect (sd 10) and seed effect, and noise of sd 0.01."""
    rng = np.random.default_rng(3)
    return 5.0 + rng.normal(0, 10, 8)[:, None] + rng.normal(0, 1, 3)[None, :], rng


def test_paired_flags_a_planted_difference_by_direction(shared):
    base, rng = shared
    a = base + rng.normal(0, 0.01, base.shape)
    b = base + 0.1 + rng.normal(0, 0.01, base.shape)  # b is 0.1 higher everywhere
    assert paired(as_cells(b), as_cells(a), higher_is_better=False).word == "worse"
    assert paired(as_cells(b), as_cells(a), higher_is_better=True).word == "better"
    assert paired(as_cells(a), as_cells(b), higher_is_better=True).word == "worse"
    assert paired(as_cells(b), as_cells(a), higher_is_better=None).word == "higher"
    assert paired(as_cells(a), as_cells(b), higher_is_better=None).word == "lower"


def test_pairing_cancels_a_shared_prompt_effect(shared):
    base, rng = shared
    a = base + rng.normal(0, 0.01, base.shape)
    b = base + 0.1 + rng.normal(0, 0.01, base.shape)
    d = paired(as_cells(b), as_cells(a), higher_is_better=True).diff
    ia, ib = interval(as_cells(a)), interval(as_cells(b))
    # alone, each mean's interval is wide (the prompt effect) and they overlap; the difference's is not
    assert ia.ci95[1] - ia.ci95[0] > 5 and ib.ci95[0] < ia.ci95[1]
    # the mean: float64 differences of values ~20 (rounding ~4e-15, against a mean of 0.1): approx's default rel
    assert d.mean == pytest.approx(float((b - a).mean())) and d.ci95[1] - d.ci95[0] < 0.05 and d.ci95[0] > 0


def test_identical_configs_are_indistinguishable(shared):
    base, _ = shared
    c = paired(as_cells(base), as_cells(base.copy()), higher_is_better=True)
    assert c.diff.mean == 0 and c.diff.ci95 == (0.0, 0.0) and c.word == "indistinguishable"


def test_single_seed_side_is_broadcast_and_seeds_match_by_value():
    det = {("p", 0): 1.0, ("q", 0): 2.0}  # a deterministic codec: one seed
    rnd = {(p, s): v + s / 10 for (p, _), v in det.items() for s in (0, 1, 2)}  # (v + s/10) - v: ~1e-16 off s/10
    assert pair_cells(rnd, det) == pytest.approx({(p, s): s / 10 for p in "pq" for s in (0, 1, 2)})
    assert pair_cells(det, rnd) == pytest.approx({(p, s): -s / 10 for p in "pq" for s in (0, 1, 2)})
    other = {(p, s): 0.0 for p in "pq" for s in (1, 2, 3)}
    assert set(pair_cells(rnd, other)) == {(p, s) for p in "pq" for s in (1, 2)}
    assert set(pair_cells(rnd, {("p", 0): 0.0}, broadcast=False)) == {("p", 0)}
    assert math.isnan(pair_cells({("p", 0): math.inf}, {("p", 0): math.inf})[("p", 0)])


def test_word():
    assert word((-1.0, 2.0), 0.5, True) == "indistinguishable"
    assert word((0.0, 0.0), 0.0, False) == "indistinguishable"
    assert word((0.1, 2.0), 1.0, False) == "worse"
    assert word((-2.0, -0.1), -1.0, False) == "better"
    assert word(None, 1.0, True) is None
