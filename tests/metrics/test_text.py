"""metrics/text.py: pure functions, checked against closed forms."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.special import softmax
from scipy.stats import entropy
from helpers.tolerances import U64, coarse_kl_abs, gamma, log_close, logsoftmax_abs

from metrics import get_metric
from metrics.text import (exact_match, first_number, kl_topk, normalize_answer, output_match, perplexity,
                          perplexity_from_nll, token_nll, top1_agreement, topk_logprobs)


def test_perplexity_closed_forms():
    V = 50
    # compared in log space: each NLL is a float32 log-softmax of equal logits (logsoftmax_abs: its log-sum-exp's
    # error and its own), their float64 mean and exp add a few U64
    common, each = logsoftmax_abs(V, 0.0)
    targets = torch.randint(0, V, (7,), generator=torch.Generator().manual_seed(0))
    assert log_close(perplexity(torch.zeros(7, V), targets), V, common + each + gamma(8, U64))  # uniform
    logits = torch.full((3, V), -1e4)
    logits[torch.arange(3), torch.tensor([1, 2, 3])] = 0.0
    assert perplexity(logits, torch.tensor([1, 2, 3])) == 1.0  # exp(-1e4) underflows: log(1 + 0) = 0, exp(0) = 1
    nll = token_nll(torch.zeros(4, V), torch.zeros(4, dtype=torch.long))
    assert log_close(perplexity_from_nll(nll), V, common + each + gamma(5, U64))
    assert math.isnan(perplexity_from_nll(torch.zeros(0)))


def test_kl_topk_is_exact_with_full_support_and_a_lower_bound_otherwise():
    g = torch.Generator().manual_seed(0)
    p_logits, q_logits = torch.randn(5, 40, generator=g) * 2, torch.randn(5, 40, generator=g) * 2
    p, q = torch.log_softmax(p_logits, -1), torch.log_softmax(q_logits, -1)
    full = (p.exp() * (p - q)).sum(-1)
    ids, lp = topk_logprobs(p_logits, 40)
    # both float32, from log-probabilities good to logsoftmax_abs (a common error, shared by a position's
    # log-probabilities, and each one's own): sum p (log p - log q) moves by both logs' errors (weights summing to
    # 1), p's own relative error (expm1 of its log's) times sum p |log p - log q|, and the 40-term sum's rounding
    spread = float(torch.cat([p_logits, q_logits], -1).max(-1).values.max() - torch.cat([p_logits, q_logits], -1).min())
    common, each = logsoftmax_abs(40, spread)
    P, Q = softmax(p_logits.double().numpy(), -1), softmax(q_logits.double().numpy(), -1)
    spread_kl = torch.from_numpy((P * np.abs(np.log(P) - np.log(Q))).sum(-1)).float()
    full_err = 2 * (common + each) + (math.expm1(common + each) + gamma(41)) * spread_kl
    torch.testing.assert_close(kl_topk(ids, lp, q_logits), full, rtol=0, atol=2 * float(full_err.max()))
    for k in (1, 5, 20):
        ids, lp = topk_logprobs(p_logits, k)
        part = kl_topk(ids, lp, q_logits)
        # reference: the distributions coarsened onto {the k most likely tokens of p, one bucket for the rest}
        pb = np.stack([np.append(p[np.argsort(-p)[:k]], 1 - p[np.argsort(-p)[:k]].sum()) for p in P])
        qb = np.stack([np.append(q[np.argsort(-p)[:k]], 1 - q[np.argsort(-p)[:k]].sum()) for p, q in zip(P, Q)])
        pb, qb = torch.from_numpy(pb), torch.from_numpy(qb)
        part_err = torch.tensor([coarse_kl_abs(pb[i:i + 1], qb[i:i + 1], common, each) for i in range(len(pb))])
        # coarsening never raises a KL (data processing inequality), up to each side's rounding
        assert (part <= full + full_err + part_err.float()).all()
        # reference: scipy's float64 KL between the two distributions coarsened onto
        # {the k most likely tokens of p, one bucket for the rest}
        want = []
        for p, q in zip(P, Q):
            top = np.argsort(-p)[:k]
            want.append(entropy(np.append(p[top], 1 - p[top].sum()), np.append(q[top], 1 - q[top].sum())))
        assert min(want) > 1e-3  # the two distributions differ, so a clamped 0 would fail below
        # float32 log-probabilities against scipy's float64: coarse_kl_abs, position by position
        assert (np.abs(part.double().numpy() - np.array(want)) <= part_err.numpy()).all()
    ids, lp = topk_logprobs(p_logits, 8)
    # identical distributions: every term is p * (log p - log p) = 0, exactly
    assert torch.equal(kl_topk(ids, lp, p_logits), torch.zeros(5))
    assert torch.equal(get_metric("kl").impl("text")(ids, lp, p_logits), torch.zeros(5))


def test_top1_and_matches():
    logits = torch.tensor([[0.0, 1.0], [2.0, 0.0], [0.0, 3.0]])
    assert top1_agreement(torch.tensor([1, 0, 0]), logits).tolist() == [True, True, False]
    assert exact_match(" 1234567.", "1234567") == 1.0
    assert exact_match("The Answer!", "the answer") == 1.0
    assert exact_match("12345678", "1234567") == 0.0
    assert normalize_answer("  A,  b. ") == "a b"
    assert first_number("is: 12345678 or 7654321.", 7) == "7654321"
    assert first_number("no digits", 7) == ""
    assert output_match([1, 2], [1, 2]) == 1.0 and output_match([1], [1, 2]) == 0.0


def test_directions_registered():
    assert get_metric("perplexity").higher_is_better is False
    assert get_metric("kl").higher_is_better is False
    assert get_metric("top1_agree").higher_is_better is True
    assert get_metric("exact_match").higher_is_better is True
    with pytest.raises(ValueError, match="Unknown metric 'nope'. Available:"):
        get_metric("nope")


def test_kl_and_top1_take_a_baseline_stored_on_another_device():
    """A baseline read back from disk lives where it was saved (the CPU) while a resumed run's logits
    may be on a GPU: the metrics compare on the logits' device ('meta' stands in for the GPU here,
    where a device mismatch raises just as it does on CUDA)."""
    from metrics.text import kl_topk, top1_agreement, topk_logprobs

    ids, logp = topk_logprobs(torch.randn(3, 10), 4)
    logits = torch.randn(3, 10, device="meta")
    assert kl_topk(ids, logp, logits).device.type == "meta"
    assert top1_agreement(ids[:, 0], logits).shape == (3,)
