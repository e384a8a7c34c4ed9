"""metrics/text.py: pure functions, checked against closed forms."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.special import softmax
from scipy.stats import entropy

from metrics import get_metric
from metrics.text import (exact_match, first_number, kl_topk, normalize_answer, output_match, perplexity,
                          perplexity_from_nll, token_nll, top1_agreement, topk_logprobs)


def test_perplexity_closed_forms():
    V = 50
    assert perplexity(torch.zeros(7, V), torch.randint(0, V, (7,))) == pytest.approx(V)  # uniform
    logits = torch.full((3, V), -1e4)
    logits[torch.arange(3), torch.tensor([1, 2, 3])] = 0.0
    assert perplexity(logits, torch.tensor([1, 2, 3])) == pytest.approx(1.0)
    nll = token_nll(torch.zeros(4, V), torch.zeros(4, dtype=torch.long))
    assert perplexity_from_nll(nll) == pytest.approx(V)
    assert math.isnan(perplexity_from_nll(torch.zeros(0)))


def test_kl_topk_is_exact_with_full_support_and_a_lower_bound_otherwise():
    g = torch.Generator().manual_seed(0)
    p_logits, q_logits = torch.randn(5, 40, generator=g) * 2, torch.randn(5, 40, generator=g) * 2
    p, q = torch.log_softmax(p_logits, -1), torch.log_softmax(q_logits, -1)
    full = (p.exp() * (p - q)).sum(-1)
    ids, lp = topk_logprobs(p_logits, 40)
    torch.testing.assert_close(kl_topk(ids, lp, q_logits), full, rtol=1e-5, atol=1e-6)
    P, Q = softmax(p_logits.double().numpy(), -1), softmax(q_logits.double().numpy(), -1)
    for k in (1, 5, 20):
        ids, lp = topk_logprobs(p_logits, k)
        part = kl_topk(ids, lp, q_logits)
        assert (part <= full + 1e-6).all()  # coarsening never raises a KL (data processing inequality)
        # reference: scipy's float64 KL between the two distributions coarsened onto
        # {the k most likely tokens of p, one bucket for the rest}
        want = []
        for p, q in zip(P, Q):
            top = np.argsort(-p)[:k]
            want.append(entropy(np.append(p[top], 1 - p[top].sum()), np.append(q[top], 1 - q[top].sum())))
        assert min(want) > 1e-3  # the two distributions differ, so a clamped 0 would fail below
        np.testing.assert_allclose(part.double().numpy(), want, rtol=1e-4, atol=1e-7)
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
