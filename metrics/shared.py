"""Quantities measured in more than one modality, defined once (direction, scale, display);
each modality's module registers its own implementation with ``@register_metric(name, modality)``."""
from __future__ import annotations

from metrics.registry import define_metric

define_metric("kl", higher_is_better=False, scale="log", display="KL (nats)",
              description="mean KL(baseline || compressed) of next-token distributions, nats (text: the scored "
                          "tokens, baseline top-k + tail bucket; audio: teacher-forced next-scale tokens)")
define_metric("top1_agree", higher_is_better=True, display="top-1 agreement",
              description="share of positions whose top-1 next token matches the baseline's (audio: teacher-forced)")
define_metric("latent_cos", higher_is_better=True, display="latent cosine",
              description="cosine of the generated latents with the uncompressed rollout's (video: per latent "
                          "frame; audio: the tokenizer latents f_hat)")
