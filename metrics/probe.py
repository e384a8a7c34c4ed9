"""Synthetic-probe metrics (the OCTOPUS paper's Table 1 protocol): pure tensor functions.

Shapes: keys/reconstructions ``[N, d]``, queries ``[N, d]`` (one query per key) or a
score matrix. Everything is computed in float64 for stable averages.
"""
from __future__ import annotations

import torch

from registry import declare_modality

from metrics.registry import register_metric

MODALITY = declare_modality("probe")  # before any metric of it registers


@register_metric("unit_mse", "probe", higher_is_better=False,
                 description="E||u - u_hat||^2 of the unit direction u = k/||k|| (= per-coordinate MSE of sqrt(d) u)")
def unit_mse(k: torch.Tensor, k_hat: torch.Tensor) -> float:
    k, k_hat = k.double(), k_hat.double()
    n = k.norm(dim=-1, keepdim=True).clamp_min(1e-300)
    return float(((k - k_hat) / n).pow(2).sum(-1).mean())


@register_metric("cosine", "probe", higher_is_better=True,
                 description="mean cosine similarity between k and its reconstruction")
def cosine(k: torch.Tensor, k_hat: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(k.double(), k_hat.double(), dim=-1).mean())


@register_metric("ip_error", "probe", higher_is_better=False,
                 description="mean |<q,k> - estimate| for unit q and unit k, with the codec's own estimator")
def ip_error(true_ip: torch.Tensor, est_ip: torch.Tensor) -> float:
    return float((true_ip.double() - est_ip.double()).abs().mean())


@register_metric("ip_bias", "probe", higher_is_better=False,
                 description="mean signed error <q,k> estimate - truth (an unbiased estimator is ~0)")
def ip_bias(true_ip: torch.Tensor, est_ip: torch.Tensor) -> float:
    return float((est_ip.double() - true_ip.double()).mean())


@register_metric("needle_mass", "probe", higher_is_better=True,
                 description="softmax attention mass on the planted needle key")
def needle_mass(logits: torch.Tensor, needle: int) -> float:
    """logits: [Q, N] for Q queries over N keys; mean softmax mass on column ``needle``."""
    return float(torch.softmax(logits.double(), dim=-1)[:, needle].mean())
