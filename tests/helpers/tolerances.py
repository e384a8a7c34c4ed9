"""Tolerances derived from what a test compares, never picked.

A test that compares two floating-point computations of one quantity bounds their difference by the
rounding each can do, propagated through what follows. The bounds here are the textbook ones (Higham,
*Accuracy and Stability of Numerical Algorithms*, 2nd ed.): ``u`` is the unit roundoff of a dtype (half
its machine epsilon), a sum or dot product of ``n`` terms computed in another order differs by at most
``gamma(n) * sum(|x_i|)``, and an error ``d`` in an exponent becomes a relative error ``expm1(d)``.

Use them as ``pytest.approx(want, rel=sum_rel(n))`` or compare exponentials in log space with
``log_close``; a test whose comparison has no clean bound (a whole model's forward) names the rounding
it allows in a one-line comment beside its tolerance.
"""
from __future__ import annotations

import math

import torch

#: unit roundoff (half the machine epsilon) per dtype: the largest relative error of one rounding
UNIT_ROUNDOFF = {dtype: torch.finfo(dtype).eps / 2
                 for dtype in (torch.float64, torch.float32, torch.bfloat16, torch.float16)}
U64 = UNIT_ROUNDOFF[torch.float64]   # 1.1e-16
U32 = UNIT_ROUNDOFF[torch.float32]   # 6.0e-8
U16 = UNIT_ROUNDOFF[torch.float16]   # 4.9e-4
UBF16 = UNIT_ROUNDOFF[torch.bfloat16]  # 3.9e-3


def gamma(n: int, u: float = U32) -> float:
    """Higham's gamma_n = n u / (1 - n u): the relative error bound of n successive roundings."""
    assert n * u < 1, f"{n} roundings at unit roundoff {u} bound nothing"
    return n * u / (1 - n * u)


def sum_rel(n: int, u: float = U32) -> float:
    """Relative bound (to ``sum(|x_i|)``) on the difference of two orders of summing ``n`` terms:
    each order is within ``gamma(n - 1)`` of the exact sum, so the two within twice that."""
    return 2 * gamma(max(n - 1, 1), u)


def exp_rel(abs_err_in_exponent: float) -> float:
    """Relative error of ``exp(s)`` when ``s`` is off by at most ``abs_err_in_exponent``."""
    return math.expm1(abs_err_in_exponent)


def log_close(got: float, want: float, abs_err_in_log: float) -> bool:
    """Two positive aggregates of exponentials (perplexities) agree when their logs are within the
    propagated bound of the summed log terms: compare there, not as ratios of huge numbers."""
    return got > 0 and want > 0 and abs(math.log(got) - math.log(want)) <= abs_err_in_log


def digits_rel(significant: int) -> float:
    """Relative error of a value written to ``significant`` digits (rows.jsonl keeps 7, harness.run.rows;
    report cells fewer): half a unit in the last digit kept, over a leading digit of at least 1."""
    return 0.5 * 10.0 ** (1 - significant)


def digits_abs(value: float, significant: int) -> float:
    """Absolute error of ``value`` written to ``significant`` digits: half a unit in its last digit kept."""
    return 0.5 * 10.0 ** (math.floor(math.log10(abs(value))) + 1 - significant) if value else 0.0


def logsoftmax_abs(vocab: int, spread: float, u: float = U32) -> tuple[float, float]:
    """Bound on the error of a log-softmax over ``vocab`` logits rounded at ``u``, against the exact one of
    the same logits (``spread``: largest minus smallest logit), in two parts: (common, each). ``common`` is
    its log-sum-exp's, shared by every log-probability of the position: ``vocab`` exponentials each good to
    2u, summed (gamma(vocab + 1) relative, absolute in the log), and the log's own rounding; ``each`` is
    what the two subtractions round of what they hold (at most spread + log vocab)."""
    return gamma(vocab + 1, u) + 2 * u * math.log(vocab), 2 * u * (spread + math.log(vocab))


def coarse_kl_abs(pb: torch.Tensor, qb: torch.Tensor, common: float, each: float) -> float:
    """Bound on the mean over positions of KL(pb || qb), bucket distributions [N, k + 1] whose last bucket
    is the tail (1 - the others), when p's and q's top-k log-probabilities carry a ``common`` error and one of
    their ``each`` own (logsoftmax_abs). With d = log(P/Q): a common shift of p's moves the KL by
    expm1(common) |sum_top P d - P_top d_t| (the shift itself cancels against the tail's), of q's by
    expm1(common) |P_t / Q_t - 1|; the own errors by each (3 + P_t / Q_t + |d_t|) + expm1(each) sum_top P |d|
    (sum P (dlog P - dlog Q), the tails' errors over their masses, and the masses' errors). First order in
    the errors (their squares, ~1e-10, are left out), valid while they are small against the tail masses."""
    pb, qb = pb.double(), qb.double()
    d = (pb / qb).log()
    ptop, dt, ratio = pb[:, :-1].sum(-1), d[:, -1], pb[:, -1] / qb[:, -1]
    assert float(pb[:, -1].min()) > 100 * (common + each) and float(qb[:, -1].min()) > 100 * (common + each)
    shift = math.expm1(common) * ((pb[:, :-1] * d[:, :-1]).sum(-1) - ptop * dt).abs() \
        + math.expm1(common) * (ratio - 1).abs()
    own = each * (3 + ratio + dt.abs()) + math.expm1(each) * (pb[:, :-1] * d[:, :-1].abs()).sum(-1)
    return float((shift + own).mean())


def attention_atol(q_norm: float, k_norm: float, v_abs: float, scale: float, n: int, t: int, u: float = U32,
                   score_extra: float = 0.0) -> float:
    """Bound on |out - exact| of attention softmax(scale q.K^T) V computed at unit roundoff ``u`` (against
    a float64 reference, exact to its own, negligible u): a score moves by at most
    delta = (gamma(n) + 2u) scale ||q|| ||k|| (``n`` rounding steps of its dot product, Cauchy-Schwarz: in
    any rotated frame, and the scaling) plus ``score_extra`` (an additive mask's or a soft cap's rounding);
    each weight then by a factor within exp(+-2 delta), which moves the output by expm1(2 delta) max |v|;
    the weights' own rounding (the shift, the exp, the ``t``-term sum, the division) and the t-term
    weighted sum add (2 gamma(t) + 5u) max |v|."""
    delta = (gamma(n, u) + 2 * u) * scale * q_norm * k_norm + score_extra
    return (math.expm1(2 * delta) + 2 * gamma(t, u) + 5 * u) * v_abs
