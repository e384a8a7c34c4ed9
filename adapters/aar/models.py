"""Building AAR pipelines: tiny or full-size at seeded random weights, or from the released checkpoints."""
from __future__ import annotations

import math
import re
from collections import Counter
from pathlib import Path

import torch
from adapters.loading import load_strict
from kernels import private_generator

from adapters.aar.checkpoint import AAR_KEY, SAT_KEY, read_state_dict
from adapters.aar.conditioning import ClapConditioner, LaionClapConditioner, StandInConditioner
from adapters.aar.pipeline import AARPipeline
from adapters.aar.sat import AAR_SCALES, SAT, SATConfig
from adapters.aar.transformer import AARConfig, AARTransformer

#: A CPU-sized AAR: same scales, block structure and cache recipe, 4 layers of 4 heads x 32.
TINY_AAR = AARConfig(depth=4, width=128, num_heads=4, vocab=256, latent_dim=16)
TINY_SAT = SATConfig(dimension=16, latent_dim=16, n_filters=4, lstm=1, codebook_size=256)
#: The released architecture (AAR_d16 with SAT_d128_lat128).
FULL_AAR, FULL_SAT = AARConfig(), SATConfig()


@torch.no_grad()
def randomize_sat_(sat: SAT, generator: torch.Generator) -> SAT:
    """Seeded random tokenizer weights (fan-in scaled; weight norms set to |v|, so w = v)."""
    for name, p in sat.named_parameters():
        if name.endswith("weight_g"):
            continue
        if p.dim() >= 2:
            fan_in = p.shape[1] * (p.shape[2] if p.dim() > 2 else 1)
            p.copy_(torch.randn(p.shape, generator=generator) / math.sqrt(fan_in))
        else:
            p.zero_()
    for m in sat.modules():
        if hasattr(m, "weight_g"):
            m.weight_g.copy_(m.weight_v.flatten(1).norm(dim=1).view_as(m.weight_g))
    for layer in sat.vq.layers:
        cb = layer._codebook
        cb.embed.copy_(torch.randn(cb.embed.shape, generator=generator))
        cb.embed_avg.copy_(cb.embed)
    return sat


def random_pipeline(aar_cfg: AARConfig, sat_cfg: SATConfig, seed: int = 0, device="cpu", dtype=torch.float32,
                    name: str = "aar-random", conditioner=None) -> AARPipeline:
    """AAR + SAT at seeded random weights, stand-in conditioning unless one is given."""
    aar = AARTransformer(aar_cfg).init_random(private_generator("aar-random-weights", name, seed))
    sat = randomize_sat_(SAT(sat_cfg), private_generator("sat-random-weights", name, seed))
    return AARPipeline(aar, sat, conditioner or StandInConditioner(aar_cfg.cond_in), device, dtype, name,
                       weights=f"random (seeded, seed={seed})")


# --- the released checkpoints ------------------------------------------------------------------
def aar_config_from_state(sd: dict) -> AARConfig:
    width, latent = sd["word_embed.weight"].shape
    depth = len({k.split(".")[1] for k in sd if re.match(r"blocks\.\d+\.attn\.mat_qkv\.weight$", k)})
    levels = Counter(sd["lvl_1L"].flatten().tolist()) if "lvl_1L" in sd else None
    scales = tuple(levels[i] for i in sorted(levels)) if levels else AAR_SCALES
    return AARConfig(depth=depth, width=width, num_heads=sd["blocks.0.attn.scale_mul_1H11"].shape[1],
                     mlp_ratio=sd["blocks.0.ffn.fc1.weight"].shape[0] / width,
                     cond_in=sd["class_emb.fc1.weight"].shape[1], vocab=sd["head.weight"].shape[0],
                     latent_dim=latent, scales=scales)


def sat_config_from_state(sd: dict, scales) -> SATConfig:
    n_layers = len({k for k in sd if re.match(r"quantizer\.vq\.layers\.\d+\._codebook\.embed$", k)})
    if n_layers != len(scales):
        raise ValueError(f"the tokenizer has {n_layers} codebooks but the AAR model predicts {len(scales)} scales")
    size, latent = sd["quantizer.vq.layers.0._codebook.embed"].shape
    phis = sorted((k for k in sd if re.match(r"quantizer\.vq\.quant_resi\.qresi_ls\.\d+\.weight$", k)),
                  key=lambda k: int(k.split(".")[4]))
    lstm_layers = len([k for k in sd if re.match(r"decoder\.model\.1\.lstm\.weight_ih_l\d+$", k)])
    # the encoder's top-level convolutions: first (kernel 7), one per downsampling (kernel 2 * ratio,
    # coarsest ratio last), last (kernel 7)
    top = sorted((int(m.group(1)), sd[k].shape[-1]) for k in sd
                 if (m := re.match(r"encoder\.model\.(\d+)\.conv\.conv\.weight_v$", k)))
    ratios = tuple(k // 2 for _, k in reversed(top[1:-1]))
    n_res = len({k.split(".")[2] for k in sd if re.match(r"encoder\.model\.\d+\.block\.1\.conv\.conv\.weight_v$", k)})
    return SATConfig(ratios=ratios, n_residual_layers=n_res // max(len(ratios), 1),dimension=sd["decoder.model.0.conv.conv.weight_v"].shape[1], latent_dim=latent,
                     n_filters=sd["encoder.model.0.conv.conv.weight_v"].shape[0], lstm=lstm_layers,
                     codebook_size=size, scales=tuple(scales),
                     phi_kernels=tuple(sd[k].shape[-1] for k in phis))


def build_aar(state: dict) -> AARTransformer:
    model = AARTransformer(aar_config_from_state(state))
    load_strict(model, state, "AAR (model_state_dict)")
    return model


def build_sat(state: dict, scales) -> SAT:
    model = SAT(sat_config_from_state(state, scales))
    load_strict(model, state, "SAT (generator_state_dict)")
    return model


def _resolve(path: str | Path) -> dict[str, Path | None]:
    """'aar=FILE,sat=FILE[,clap=DIR|laion_clap=FILE]' or a folder holding *AAR*.pth, *SAT*.pth and
    optionally a transformers CLAP folder (with config.json) or a laion_clap *.pt."""
    spec = str(path)
    if "=" in spec:
        parts = dict(p.split("=", 1) for p in spec.split(","))
        unknown = set(parts) - {"aar", "sat", "clap", "laion_clap"}
        if unknown:
            raise ValueError(f"unknown parts {sorted(unknown)} in '{spec}'. Available: aar, sat, clap, laion_clap")
        return {k: Path(parts[k]) if k in parts else None for k in ("aar", "sat", "clap", "laion_clap")}
    root = Path(spec)
    if not root.is_dir():
        raise FileNotFoundError(f"AAR weights: '{root}' is not a folder (or use 'aar=FILE,sat=FILE[,clap=DIR]')")
    pths = sorted(root.glob("*.pth"))
    found = {"aar": [p for p in pths if "aar" in p.name.lower()], "sat": [p for p in pths if "sat" in p.name.lower()]}
    for k, v in found.items():
        if len(v) != 1:
            raise FileNotFoundError(f"AAR weights: expected one *{k.upper()}*.pth in {root}, found {[p.name for p in v]}")
    clap = [d for d in sorted(root.iterdir()) if d.is_dir() and (d / "config.json").exists()]
    laion = [p for p in sorted(root.glob("*.pt")) if "clap" in p.name.lower()]
    return {"aar": found["aar"][0], "sat": found["sat"][0], "clap": clap[0] if clap else None,
            "laion_clap": laion[0] if laion and not clap else None}


def released_aar_config(path: str | Path) -> tuple[AARConfig, str]:
    """(the AAR transformer's config, the file it was read from) of released weights, read off the file's tensor
    shapes (memory-mapped: no weight is read) before the pipeline loads."""
    file = _resolve(path)["aar"]
    return aar_config_from_state(read_state_dict(file, AAR_KEY)), str(file)


def released_pipeline(path: str | Path, device="cpu", dtype=torch.float32) -> AARPipeline:
    files = _resolve(path)
    aar = build_aar(read_state_dict(files["aar"], AAR_KEY))
    sat = build_sat(read_state_dict(files["sat"], SAT_KEY), aar.cfg.scales)
    if files["clap"] is not None:
        cond = ClapConditioner(files["clap"], device)
    elif files["laion_clap"] is not None:
        cond = LaionClapConditioner(files["laion_clap"], device)
    else:
        cond = StandInConditioner(aar.cfg.cond_in)
    return AARPipeline(aar, sat, cond, device, dtype, "aar",
                       weights=f"{files['aar'].name} + {files['sat'].name}")


__all__ = ["TINY_AAR", "TINY_SAT", "FULL_AAR", "FULL_SAT", "random_pipeline", "released_pipeline", "released_aar_config",
           "build_aar", "build_sat", "aar_config_from_state", "sat_config_from_state", "randomize_sat_"]
