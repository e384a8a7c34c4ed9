"""Causal Wan video generators: CausVid and Causal Forcing, released or tiny random (see docs/video.md).

* ``causvid``: 3 latent frames per block, steps [1000, 757, 522], timestep shift 8.
* ``causal-forcing``: 1 latent frame per block, steps [1000, 750, 500, 250] warped, shift 5.
* ``causvid-tiny`` / ``causal-forcing-tiny``: the same recipes on a 2-layer random Wan
  (48x64 pixels, 9 latent frames) that runs on a CPU with no checkpoint.
* ``causvid-random`` / ``causal-forcing-random``: the full 1.3B architecture at random weights
  (random prompt embeddings, random full-size VAE): GPU smoke runs without any file.

``path`` for the released models is the generator checkpoint (or the folder holding it); the
Wan 2.1 folder (text encoder, tokenizer, VAE) is ``$WAN_DIR`` or found beside it.
"""
from __future__ import annotations

from dataclasses import replace

from adapters.loading import resolve
from adapters.protocol import DeclaredShape
from adapters.registry import register_model
from adapters.wan import CAUSAL_FORCING, CAUSVID, build_random, load_released, tiny_spec
from adapters.wan.build import released_path


def _no_path(name: str, path) -> None:
    if path:
        raise ValueError(f"'{name}' is a random-weight model and reads no checkpoint (got --model-path {path}); "
                         f"use '{name.rsplit('-', 1)[0]}' for the released weights")


def _shape(spec, path, released: bool) -> DeclaredShape:
    """A Wan model's shape is its recipe's architecture (a released checkpoint must match it: it loads
    strictly); the path is checked as the loader checks it."""
    released_path(spec, path) if released else _no_path(spec.name, path)
    t = spec.transformer
    return DeclaredShape(t["num_layers"], t["num_attention_heads"], t["attention_head_dim"], None,
                         f"model '{spec.name}''s architecture")


@register_model("causvid", modality="video", default_task="video",
                description="CausVid (Wan 2.1 1.3B, 3 latent frames/block, 3 steps, shift 8); path: model.pt",
                declared=lambda path: _shape(CAUSVID, path, released=True))
def load_causvid(path: str | None, device="auto", dtype="auto"):
    return load_released(CAUSVID, path, *resolve(device, dtype))


@register_model("causal-forcing", modality="video", default_task="video",
                description="Causal Forcing frame-wise (Wan 2.1 1.3B, 1 latent frame/block, 4 warped steps, "
                            "shift 5); path: causal_forcing.pt",
                declared=lambda path: _shape(CAUSAL_FORCING, path, released=True))
def load_causal_forcing(path: str | None, device="auto", dtype="auto"):
    return load_released(CAUSAL_FORCING, path, *resolve(device, dtype))


def _random(name: str, spec, description: str, **build):
    """Register ``name``: ``spec``'s architecture at seeded random weights, no checkpoint (``build``: what
    :func:`adapters.wan.build_random` takes beyond the spec, device and dtype)."""
    def load(path: str | None = None, device="auto", dtype="auto"):
        _no_path(name, path)
        return build_random(spec, *resolve(device, dtype), **build)

    load.__name__ = load.__qualname__ = "load_" + name.replace("-", "_")  # who registered it, in errors
    return register_model(name, modality="video", default_task="video", description=description,
                          declared=lambda path: _shape(spec, path, released=False))(load)


load_causvid_random = _random(
    "causvid-random", replace(CAUSVID, name="causvid-random"),
    "full-size CausVid (Wan 2.1 1.3B) at seeded random weights, random prompt embeddings; no checkpoint (GPU smoke "
    "runs)", text_encoder=False)
load_causal_forcing_random = _random(
    "causal-forcing-random", replace(CAUSAL_FORCING, name="causal-forcing-random"),
    "full-size Causal Forcing (Wan 2.1 1.3B) at seeded random weights, random prompt embeddings; no checkpoint "
    "(GPU smoke runs)", text_encoder=False)
load_causvid_tiny = _random(
    "causvid-tiny", tiny_spec(CAUSVID),
    "CausVid recipe on a tiny random Wan (2 layers, 2x32 heads, 48x64, 9 latent frames); no checkpoint")
load_causal_forcing_tiny = _random(
    "causal-forcing-tiny", tiny_spec(CAUSAL_FORCING),
    "Causal Forcing recipe on a tiny random Wan (2 layers, 2x32 heads, 48x64, 9 latent frames); no checkpoint")
