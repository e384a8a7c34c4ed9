"""Building a :class:`CausalWan`: from released checkpoints, or at random weights (tiny or full size)."""
from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import torch

from adapters.loading import random_init_

from adapters.wan.checkpoint import load_released_generator, load_text_encoder, load_vae, wan_layout
from adapters.wan.model import CausalWan, CausalWanSpec
from adapters.wan.tiny import TINY_TRANSFORMER, TINY_UMT5, TINY_VAE, ByteTokenizer

#: Where the Wan 2.1 folder is looked for when WAN_DIR is not set (CausVid / Causal Forcing put it there).
WAN_DIR_CANDIDATES = ("wan_models/Wan2.1-T2V-1.3B-Diffusers", "wan_models/Wan2.1-T2V-1.3B",
                      "checkpoints/Wan2.1-T2V-1.3B-Diffusers", "checkpoints/Wan2.1-T2V-1.3B")


def tiny_spec(spec: CausalWanSpec, num_frames: int = 9) -> CausalWanSpec:
    """The same recipe (blocks, steps, shift) on a tiny random model: 9 latent frames of 48x64 pixels."""
    return replace(spec, name=f"{spec.name}-tiny", num_frames=num_frames, height=48, width=64, text_len=32,
                   transformer=dict(TINY_TRANSFORMER))


def fresh_rope(transformer) -> None:
    """Rebuild the RoPE tables in float64 on the model's device (``.to(bf16)`` would have rounded them)."""
    from diffusers.models.transformers.transformer_wan import WanRotaryPosEmbed
    c = transformer.config
    device = transformer.proj_out.weight.device
    transformer.rope = WanRotaryPosEmbed(c.attention_head_dim, c.patch_size, c.rope_max_seq_len).to(device)


def cast_(transformer, dtype: torch.dtype, device=None):
    """Move to ``device`` and cast to ``dtype``, keeping the modules diffusers keeps in float32
    (time embedder, modulation tables, norms) in float32, as ``from_pretrained(torch_dtype=)`` does."""
    keep = tuple(getattr(transformer, "_keep_in_fp32_modules", None) or ())
    for name, p in transformer.named_parameters():
        fp32 = any(k in name.split(".") for k in keep)
        p.data = p.data.to(device=device if device is not None else p.device,
                           dtype=torch.float32 if fp32 else dtype)
    fresh_rope(transformer)
    return transformer


def build_transformer(config: dict, device, dtype, seed_parts: tuple | None = None):
    """A ``WanTransformer3DModel`` of ``config``: random weights from ``seed_parts``, or on the meta
    device (to be assigned from a checkpoint) when ``seed_parts`` is None."""
    from diffusers import WanTransformer3DModel
    if seed_parts is None:
        with torch.device("meta"):
            return WanTransformer3DModel(**config)
    with torch.device(device):
        model = WanTransformer3DModel(**config)
    random_init_(model, *seed_parts)
    return cast_(model, dtype)


def build_random(spec: CausalWanSpec, device="cpu", dtype=torch.float32, seed: int = 0,
                 text_encoder: bool = True) -> CausalWan:
    """Random weights everywhere (seeded). The VAE is the tiny one unless the geometry is full size.

    ``text_encoder`` False: prompts become seeded random embeddings (no UMT5 at all).
    """
    from diffusers import AutoencoderKLWan
    tiny = spec.transformer == TINY_TRANSFORMER
    transformer = build_transformer(spec.transformer, device, dtype, ("wan-random", spec.name, seed, "transformer"))
    with torch.device(device):
        vae = AutoencoderKLWan(**(TINY_VAE if tiny else {}))
    random_init_(vae, "wan-random", spec.name, seed, "vae")
    vae = vae.eval().requires_grad_(False)
    enc = tok = None
    if text_encoder:
        from transformers import UMT5Config, UMT5EncoderModel
        if not tiny:
            raise ValueError("a random full-size UMT5-XXL is 5.7B parameters for nothing: use text_encoder=False")
        cfg = UMT5Config(**{**TINY_UMT5, "d_model": spec.transformer["text_dim"]})
        with torch.device(device):
            enc = UMT5EncoderModel(cfg)
        random_init_(enc, "wan-random", spec.name, seed, "text_encoder")
        enc = enc.to(dtype).eval().requires_grad_(False)
        tok = ByteTokenizer()
    return CausalWan(spec, transformer, vae, enc, tok, device=device, dtype=dtype,
                     source=f"random init (seed {seed})")


def find_wan_dir(checkpoint_path: str | None) -> Path:
    """The Wan 2.1 folder: $WAN_DIR, else a known place beside the checkpoint or under the working directory."""
    env = os.environ.get("WAN_DIR")
    if env:
        wan_layout(env)  # raises with what is missing
        return Path(env)
    roots = [Path.cwd()]
    if checkpoint_path:
        d = Path(checkpoint_path)
        d = d if d.is_dir() else d.parent
        roots[:0] = [d, d.parent, d.parent.parent]  # checkpoints/framewise/x.pt -> the repository root
    tried = []
    for root in roots:
        for cand in WAN_DIR_CANDIDATES + tuple(c.split("/", 1)[1] for c in WAN_DIR_CANDIDATES):
            d = root / cand
            tried.append(str(d))
            try:
                wan_layout(d)
                return d
            except FileNotFoundError:
                continue
    raise FileNotFoundError("no Wan 2.1 folder (text encoder, tokenizer, VAE) found; set WAN_DIR to "
                            "Wan2.1-T2V-1.3B-Diffusers or Wan2.1-T2V-1.3B. Tried: " + ", ".join(dict.fromkeys(tried)))


def released_path(spec: CausalWanSpec, path: str | None) -> str:
    """``path`` of a released model's checkpoint (ValueError where none is given)."""
    if not path:
        raise ValueError(f"model '{spec.name}' needs its released checkpoint: pass --model-path "
                         f"(see docs/video.md), or use '{spec.name}-tiny' for a random tiny model")
    return path


def load_released(spec: CausalWanSpec, path: str | None, device="cpu", dtype=torch.float32,
                  wan_dir: str | None = None, key: str | None = None) -> CausalWan:
    """A released CausVid / Causal Forcing generator plus the Wan 2.1 text encoder and VAE."""
    released_path(spec, path)
    transformer = build_transformer(spec.transformer, device, dtype, None)
    file = load_released_generator(transformer, path, spec.checkpoint_format, key)
    cast_(transformer, dtype, device)  # also rebuilds RoPE, whose tables are not in the checkpoint
    folder = Path(wan_dir) if wan_dir else find_wan_dir(path)
    enc, tok = load_text_encoder(folder, dtype, device)
    vae = load_vae(folder, torch.float32, device)  # decode in float32: metrics compare pixels
    return CausalWan(spec, transformer, vae, enc, tok, device=device, dtype=dtype, source=f"{file} + {folder}")
