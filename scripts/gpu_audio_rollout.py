#!/usr/bin/env python
"""One AAR rollout at the FULL released size (depth 16, width 1024, 16 heads of 64; SAT d128/lat128;
16 scales, 455 tokens) at seeded random weights: the uncompressed baseline, then each codec with the
paper's cache recipe (one native scale). Prints wall time, peak memory, cache bytes and the audio
metrics against the baseline.

    python -m scripts.gpu_audio_rollout                      # CUDA, bf16, default codecs at 2 bits
    python -m scripts.gpu_audio_rollout --codecs octopus@2,turboquant-mse@3 --batch 4
    python -m scripts.gpu_audio_rollout --weights /ckpt/aar  # the released checkpoints instead
    python -m scripts.gpu_audio_rollout --tiny               # CPU-sized model, on the CPU (smoke test)

Random weights measure the mechanics (time, memory, bytes) and a rough sensitivity only; the
conditioning is the stand-in embedding of a synthetic tone unless --clip / --weights bring CLAP.
"""
from __future__ import annotations

import argparse
import json
import resource
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from adapters.aar import FULL_AAR, FULL_SAT, TINY_AAR, TINY_SAT, SamplingConfig, random_pipeline, released_pipeline
from adapters.cache.stats import cache_row_stats
from adapters.cache.config import CacheConfig
from kernels import list_codecs, private_generator
from metrics import audio as am

DEFAULT_CODECS = "octopus@2,turboquant-mse@2,turboquant-prod@2,polarquant@2,qjl@2"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="CPU-sized model (adapters.aar.TINY_*), default device cpu")
    p.add_argument("--device", default=None, help="default: cuda, or cpu with --tiny")
    p.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="default: bf16 on cuda, fp32 on cpu")
    p.add_argument("--codecs", default=DEFAULT_CODECS, help="comma list of codec@bits (unknown codecs are skipped)")
    p.add_argument("--batch", type=int, default=1, help="clips per rollout (the cache holds 2x for guidance)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--weights", default=None, help="folder of the released checkpoints (model 'aar') instead of random")
    p.add_argument("--clip", default=None, help="conditioning clip (default: a synthetic tone)")
    p.add_argument("--scales", default=None, help="override the token pyramid, e.g. 1,2,4,8 (random weights only)")
    p.add_argument("--json", default=None, help="also write the results here")
    p.add_argument("--profile", action="store_true",
                   help="run each rollout again under torch.profiler: its device seconds against the wall time "
                        "(the host time the GPU sat idle, which CUDA graphs could save)")
    return p.parse_args(argv)


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak_mib(device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2 ** 20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # process max RSS (Linux: KiB)


def build(args):
    device = torch.device(args.device or ("cpu" if args.tiny else "cuda"))
    dtype = DTYPES[args.dtype or ("bf16" if device.type == "cuda" else "fp32")]
    if args.weights:
        return released_pipeline(args.weights, device, dtype), device
    aar_cfg, sat_cfg = (TINY_AAR, TINY_SAT) if args.tiny else (FULL_AAR, FULL_SAT)
    if args.scales:
        scales = tuple(int(s) for s in args.scales.split(","))
        aar_cfg, sat_cfg = replace(aar_cfg, scales=scales), replace(sat_cfg, scales=scales)
    name = "aar-tiny" if args.tiny else "aar-random"
    return random_pipeline(aar_cfg, sat_cfg, args.seed, device, dtype, name=name), device


def conditioning(model, args) -> torch.Tensor:
    rate = model.conditioner.sample_rate
    if args.clip:
        import librosa  # only for a real clip (not installed on the GPU image: carry it or pass none)

        clip, _ = librosa.load(args.clip, sr=rate, mono=True)
        clip = clip[: 10 * rate]
    else:  # a 2 s harmonic tone at 220 Hz
        t = np.arange(2 * rate) / rate
        clip = sum(0.3 / k * np.sin(2 * np.pi * 220 * k * t) for k in (1, 2, 3, 4)).astype(np.float32)
    return model.embed(clip).repeat(args.batch, 1)


def timed(model, emb, config, seed, device, **kw):
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    _sync(device)
    t0 = time.perf_counter()
    gen = None if "teacher" in kw else private_generator("gpu-audio-rollout", seed, device=device)
    r = model.rollout(emb, config, gen, SamplingConfig(), **kw)
    _sync(device)
    return r, time.perf_counter() - t0, _peak_mib(device)


def main(argv=None) -> list[dict]:
    args = parse(argv)
    model, device = build(args)
    c = model.aar.cfg
    print(f"model {model.name} ({model.weights}); depth {c.depth}, width {c.width}, {c.num_heads} heads x {c.head_dim}; "
          f"{len(c.scales)} scales, {c.num_tokens} tokens; device {device}, {model.dtype}; batch {args.batch} "
          f"(x2 for guidance)\nconditioning: {model.conditioning_label}")
    emb = conditioning(model, args)
    available = list_codecs()
    configs = [CacheConfig("none")]
    for spec in filter(None, args.codecs.split(",")):
        name, _, bits = spec.partition("@")
        if name not in available or int(bits or 2) not in available[name]:
            print(f"  skipping {spec}: not available (have {', '.join(available)})")
            continue
        configs.append(CacheConfig(name, int(bits or 2)))
    timed(model, emb, configs[0], args.seed, device)  # warm-up (kernels, allocator)
    rows, base = [], None
    head = f"{'cache':<20}{'time s':>8}{'peak MiB':>10}{'cache MiB':>10}{'native MiB':>11}{'k bits':>7}{'v bits':>7}" \
           f"{'SNR dB':>8}{'LSD dB':>8}{'tf KL':>9}{'tf agree':>9}"
    print(head)
    for cfg in configs:
        r, secs, peak = timed(model, emb, cfg, args.seed, device)
        if base is None:
            base = r
        tf = r if cfg.codec == "none" else model.rollout(emb, cfg, sampling=SamplingConfig(), teacher=base.tokens)
        st = cache_row_stats(r.cache)  # also checks that the codec compressed
        row = {"cache": cfg.label, "seconds": secs, "peak_mib": peak, "cache_mib": st["cache_bytes"] / 2 ** 20,
               "uncompressed_mib": st["uncompressed_bytes"] / 2 ** 20,
               "key_bits": st["bits_per_coord"], "value_bits": st["value_bits_per_coord"],
               "snr_db": am.snr_db(base.audio, r.audio), "lsd": am.lsd(base.audio[0], r.audio[0]),
               "kl": am.pooled(am.kl_divergence, base.logits, tf.logits),
               "top1_agree": am.pooled(am.token_agreement, base.logits, tf.logits)}
        if args.profile and device.type == "cuda":
            from harness.bench import device_seconds

            row["warm_s"] = timed(model, emb, cfg, args.seed, device)[1]  # the first compiled what it needed
            row["device_s"], row["kernels"] = device_seconds(lambda: timed(model, emb, cfg, args.seed, device))
            print(f"  {cfg.label}: {row['warm_s']:.2f}s warm, of which device work {row['device_s']:.2f}s in "
                  f"{row['kernels']} kernels: {row['device_s'] / row['warm_s']:.1%}", flush=True)
        rows.append(row)
        print(f"{row['cache']:<20}{secs:>8.2f}{peak:>10.0f}{row['cache_mib']:>10.2f}{row['uncompressed_mib']:>11.2f}"
              f"{row['key_bits']:>7.2f}{row['value_bits']:>7.2f}{row['snr_db']:>8.2f}{row['lsd']:>8.2f}{row['kl']:>9.2e}"
              f"{row['top1_agree']:>9.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"model": model.describe(), "batch": args.batch, "rows": rows}, indent=1))
    return rows


if __name__ == "__main__":
    main()
