"""Text metrics: pure functions of logits, token ids and strings (no model, no cache).

Shapes: ``logits`` [N, V] (one row per scored position), ``targets`` [N] int64 (the token each
row should predict). ``kl`` and ``top1_agree`` give one value per position [N] (tasks score in
chunks and take the mean over every scored position). Divergence from the uncompressed baseline is measured on the baseline's
top-k next-token distribution (stored once per prompt, so a run never keeps [N, V] baseline
logits): the KL between the two distributions coarsened onto {top-k tokens of the baseline,
everything else}. Coarsening can only lower a KL (data processing inequality), so this is a
lower bound on the full-vocabulary KL, tight when the baseline's tail mass is small.
"""
from __future__ import annotations

import math
import re

import torch

from registry import declare_modality

from metrics import shared  # noqa: F401  (defines kl and top1_agree, implemented here for text)
from metrics.registry import register_metric

MODALITY = declare_modality("text")  # before any metric of it registers


def token_nll(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Negative log-likelihood of each target, [N] float32 (natural log)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -logp.gather(-1, targets.long().unsqueeze(-1)).squeeze(-1)


def perplexity(logits: torch.Tensor, targets: torch.Tensor) -> float:
    """exp(mean NLL) of ``targets`` under ``logits``."""
    return perplexity_from_nll(token_nll(logits, targets))


@register_metric("perplexity", "text", higher_is_better=False, scale="log", display="perplexity",
                 description="exp(mean token NLL) over the scored tokens")
def perplexity_from_nll(nll: torch.Tensor) -> float:
    """nll: [N] token NLLs (:func:`token_nll`, gathered over chunks)."""
    return float(math.exp(float(nll.double().mean()))) if nll.numel() else float("nan")


def topk_logprobs(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [N, V] -> (ids [N, k] int32, log-probabilities [N, k] float32), most likely first."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    vals, ids = logp.topk(min(k, logp.shape[-1]), dim=-1)
    return ids.to(torch.int32), vals


@register_metric("kl", "text")
def kl_topk(base_ids: torch.Tensor, base_logp: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """KL(baseline || model) per position on {baseline top-k, tail}, [N] float32 (nats).

    base_ids, base_logp: [N, k] from :func:`topk_logprobs` of the baseline; logits: [N, V] of
    the run being compared.
    """
    # a stored baseline comes back on the device it was saved from (the CPU, say) while this run's
    # logits may be on another: compare on the logits' device
    base_ids, base_logp = base_ids.to(logits.device), base_logp.to(logits.device)
    q_logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, base_ids.long())  # [N, k]
    p = base_logp.double().exp()
    kl = (p * (base_logp.double() - q_logp.double())).sum(-1)
    p_tail = (1.0 - p.sum(-1)).clamp_min(0.0)
    q_tail = (1.0 - q_logp.double().exp().sum(-1)).clamp_min(0.0)
    tail = torch.where(p_tail > 0, p_tail * (torch.log(p_tail.clamp_min(1e-300)) - torch.log(q_tail.clamp_min(1e-300))),
                       torch.zeros_like(p_tail))
    return (kl + tail).clamp_min(0.0).float()


@register_metric("top1_agree", "text")
def top1_agreement(base_top1: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """[N] bool: the compressed run's argmax equals the baseline's top-1 (base_top1 [N], logits [N, V])."""
    return logits.argmax(-1) == base_top1.to(logits.device).long()


_PUNCT = re.compile(r"[^\w\s]")


def normalize_answer(s: str) -> str:
    """Lower-case, drop punctuation, collapse whitespace."""
    return " ".join(_PUNCT.sub(" ", s.lower()).split())


@register_metric("exact_match", "text", higher_is_better=True, display="exact match",
                 description="1 if the normalized answer equals the reference, else 0 (mean over prompts = accuracy)")
def exact_match(prediction: str, reference: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(reference))


def first_number(text: str, digits: int | None = None) -> str:
    """The first run of digits in ``text`` (of exactly ``digits`` digits if given), or ''."""
    pat = r"(?<!\d)\d{%d}(?!\d)" % digits if digits else r"\d+"
    m = re.search(pat, text)
    return m.group(0) if m else ""


@register_metric("output_match", "text", higher_is_better=True, display="output match",
                 description="1 if the compressed run generated exactly the baseline's tokens")
def output_match(tokens: list[int], base_tokens: list[int]) -> float:
    return float(list(tokens) == list(base_tokens))


@register_metric("length_ratio", "text", higher_is_better=None, display="output length ÷ baseline",
                 description="tokens the compressed run generated over the baseline's for the same prompt (a compressed "
                             "cache that lengthens answers raises end-to-end latency); NaN where the baseline said nothing")
def length_ratio(tokens: list[int], base_tokens: list[int]) -> float:
    return len(tokens) / len(base_tokens) if len(base_tokens) else float("nan")
