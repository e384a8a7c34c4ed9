"""Shared by the adapter tests: a compressed run's outputs against the uncompressed run's.

What reads compressed tokens must move, by more than float rounding and by much less than losing
that context does. The reference for "losing the context" is the uncompressed run with other
tokens (another prompt, other conditioning) in place of the context the codec compresses.
"""
from __future__ import annotations

import torch

# A codec's footprint as a share of the reference's, for a KL: above FLOOR (a codec bypassed, i.e. exact keys
# and values read back, leaves float rounding: logits moved by ~1e3 U32 ~ 1e-4 of their size give a KL of
# ~1e-8, which against a lost context's KL of 1e-2..1 is under 1e-6; measured < 1e-12 of it) and below CEILING
# (a behaviour bound, not a rounding: what a 2-3-bit cache may cost); for a norm, their square roots (a KL is
# quadratic in a small perturbation). Measured at 2-3 bits (1 for the codecs that start there): 1-5% of the KL
# (1e-4 with one layer of three compressed), 3-15% of the video latents' change; the engines' 8-bit caches with
# 32-coordinate blocks (llama.cpp q8_0) or per-token-head scales (LMDeploy int8) move the video latents by
# 7e-4 of it, so the floor sits at 1e-8 of the KL (1e-4 of a norm), still 1e4 above a bypassed codec's rounding.
FLOOR, CEILING = 1e-8, 0.1


def kl(ref: torch.Tensor, x: torch.Tensor) -> float:
    """Mean KL(softmax(ref) || softmax(x)) over the rows of logits [..., V], float64."""
    lp, lq = torch.log_softmax(ref.double(), -1), torch.log_softmax(x.double(), -1)
    return float((lp.exp() * (lp - lq)).sum(-1).mean())


def assert_moved_less_than_lost(moved: float, lost: float, quadratic: bool = True) -> None:
    """``moved``: the codec's change (a KL if ``quadratic``, else a norm); ``lost``: the reference's."""
    floor, ceiling = (FLOOR, CEILING) if quadratic else (FLOOR ** 0.5, CEILING ** 0.5)
    assert floor * lost < moved < ceiling * lost, f"moved {moved:.3g}, losing the context {lost:.3g}"
