"""AAR (next-scale autoregressive audio, CLAP-conditioned) with its scale-level audio tokenizer.

Models:
  ``aar``        the released checkpoints: ``path`` is a folder with *AAR*.pth (``model_state_dict``),
                 *SAT*.pth (``generator_state_dict``) and optionally a transformers CLAP folder
                 (laion/larger_clap_general layout) or a laion_clap *.pt; or
                 ``aar=FILE,sat=FILE[,clap=DIR|laion_clap=FILE]``. Without CLAP: stand-in conditioning.
  ``aar-random`` the full released architecture at seeded random weights (GPU timing runs).
  ``aar-tiny``   a CPU-sized model at seeded random weights (default runs, tests).
Random-weight models condition on the stand-in embedding (not CLAP); reports say so.
Every AAR model runs in float32 unless a dtype is given (``--dtype bfloat16``), on every device.
"""
from __future__ import annotations

import torch

from adapters.loading import resolve
from adapters.protocol import DeclaredShape
from adapters.registry import register_model

from adapters.aar.models import (FULL_AAR, FULL_SAT, TINY_AAR, TINY_SAT, random_pipeline, released_aar_config,
                                 released_pipeline)
from adapters.aar.pipeline import AARPipeline, Rollout, SamplingConfig, sample_top_k_top_p
from adapters.aar.sat import AAR_SCALES, SAT, SATConfig
from adapters.aar.transformer import AARConfig, AARTransformer


def _placement(device, dtype) -> tuple[torch.device, torch.dtype]:
    # 'auto' is float32 on every device, as the release's inference runs (its bf16 autocast is a
    # training setting); --dtype bfloat16 stays available
    device, dtype = resolve(device, "float32" if dtype in (None, "auto") else dtype)
    return torch.device(device), dtype


def _shape(cfg: AARConfig, source: str) -> DeclaredShape:
    """An AAR model's shape: its transformer's blocks (no position limit: its scales are its own)."""
    return DeclaredShape(cfg.depth, cfg.num_heads, cfg.head_dim, None, source)


def _aar_path(path: str | None) -> str:
    if not path:
        raise ValueError("model 'aar' needs a path: a folder with *AAR*.pth, *SAT*.pth and a CLAP folder "
                         "(or 'aar=FILE,sat=FILE,clap=DIR'); 'aar-tiny' and 'aar-random' need none")
    return path


@register_model("aar", modality="audio", default_task="audio",
                description="AAR (AudioSet, d16) + SAT_d128_lat128 from the released checkpoints; CLAP conditioning",
                declared=lambda path: _shape(*released_aar_config(_aar_path(path))))
def load_aar(path: str | None, device="auto", dtype="auto") -> AARPipeline:
    return released_pipeline(_aar_path(path), *_placement(device, dtype))


@register_model("aar-random", modality="audio", default_task="audio",
                description="full-size AAR + SAT architecture at seeded random weights; stand-in conditioning",
                declared=lambda path: _shape(FULL_AAR, "model 'aar-random''s architecture"))
def load_aar_random(path: str | None = None, device="auto", dtype="auto") -> AARPipeline:
    return random_pipeline(FULL_AAR, FULL_SAT, 0, *_placement(device, dtype), name="aar-random")


@register_model("aar-tiny", modality="audio", default_task="audio",
                description="CPU-sized AAR + SAT at seeded random weights; stand-in conditioning",
                declared=lambda path: _shape(TINY_AAR, "model 'aar-tiny''s architecture"))
def load_aar_tiny(path: str | None = None, device="auto", dtype="auto") -> AARPipeline:
    return random_pipeline(TINY_AAR, TINY_SAT, 0, *_placement(device, dtype), name="aar-tiny")


__all__ = ["AARPipeline", "Rollout", "SamplingConfig", "sample_top_k_top_p", "AAR_SCALES",
           "SAT", "SATConfig", "AARConfig", "AARTransformer", "TINY_AAR", "TINY_SAT", "FULL_AAR", "FULL_SAT",
           "random_pipeline", "released_pipeline"]
