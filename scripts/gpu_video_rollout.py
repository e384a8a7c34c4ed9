#!/usr/bin/env python
"""One short causal-Wan rollout at the FULL 1.3B size (30 blocks, 12 heads x 128, 480x832) with
random weights, baseline vs a few codecs: wall time and peak memory per block, cache bytes, and
how far each codec's latents (and decoded frames) drift from the baseline's.

No checkpoint, no text encoder (prompts are seeded random UMT5-sized embeddings), no download.
Random weights say nothing about quality; this checks that the full-size rollout runs and what it
costs. ``--tiny`` runs the same code on the tiny random model (CPU, seconds).

    python -m scripts.gpu_video_rollout                       # CUDA, causvid, 9 latent frames
    python -m scripts.gpu_video_rollout --model causal-forcing --frames 21 --codecs none,octopus@2,turboquant-mse@2
    python -m scripts.gpu_video_rollout --tiny --device cpu   # the smoke test
"""
from __future__ import annotations

import argparse
import math
import resource
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from adapters.cache.stats import cache_row_stats
from adapters.cache.config import CacheConfig
from adapters.wan import CAUSAL_FORCING, CAUSVID, build_random, tiny_spec
from kernels import private_generator
from metrics import video as vm

MiB = 1 << 20


def parse_codec(s: str) -> CacheConfig:
    name, _, bits = s.partition("@")
    return CacheConfig(codec=name, bits=int(bits) if bits else 16)


def peak_mib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / MiB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # process peak RSS (kB on Linux)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=("causvid", "causal-forcing"), default="causvid")
    ap.add_argument("--frames", type=int, default=None, help="latent frames (default 9; the released models make 21)")
    ap.add_argument("--codecs", default="none,octopus@2,turboquant-mse@2,kivi@2",
                    help="comma-separated codec@bits; 'none' is the baseline and always runs first")
    ap.add_argument("--tiny", action="store_true", help="the tiny random model (CPU smoke test)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default=None, help="default: bf16 on CUDA, fp32 on CPU")
    ap.add_argument("--residual-frames", type=int, default=1)
    ap.add_argument("--no-decode", action="store_true", help="skip the VAE decode and the pixel metrics")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat-baseline", action="store_true",
                    help="run 'none' a second time and say whether it is bit-identical to the baseline")
    ap.add_argument("--out", default=None, help="write each rollout as MP4 here (needs decoding)")
    ap.add_argument("--profile", action="store_true",
                    help="run each rollout again under torch.profiler: its device seconds against the wall time "
                         "(the host time the GPU sat idle, which CUDA graphs could save)")
    args = ap.parse_args(argv)

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("CUDA is not available; use --device cpu --tiny for the CPU smoke test", file=sys.stderr)
        return 2
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[
        args.dtype or ("bf16" if device.type == "cuda" else "fp32")]
    base_spec = CAUSVID if args.model == "causvid" else CAUSAL_FORCING
    frames = args.frames or 9
    spec = tiny_spec(base_spec, num_frames=frames) if args.tiny else replace(base_spec, num_frames=frames)
    configs = [parse_codec(c) for c in args.codecs.split(",") if c.strip()]
    configs = [CacheConfig(codec="none")] + [c for c in configs if c.codec != "none"]
    if args.repeat_baseline:
        configs.insert(1, CacheConfig(codec="none"))

    t0 = time.perf_counter()
    model = build_random(spec, device, dtype, seed=args.seed, text_encoder=False)
    params = sum(p.numel() for p in model.transformer.parameters())
    print(f"{spec.name}: {params / 1e6:.1f}M transformer parameters, {spec.num_frames} latent frames "
          f"({spec.num_frames // spec.frames_per_block} blocks of {spec.frames_per_block}), {spec.height}x{spec.width}, "
          f"{model.tokens_per_frame} tokens/frame, steps {model.spec.schedule.timesteps().tolist()}, "
          f"{dtype}, {device}; built in {time.perf_counter() - t0:.1f}s")
    if device.type == "cuda":
        print(f"GPU: {torch.cuda.get_device_name(device)}")
    emb = model.encode_prompt("a corgi runs along a sunny beach at golden hour")

    base_lat = base_frames = None
    for cfg in configs:
        cfg = model.cache_config(cfg, window=args.residual_frames)
        cache = model.new_cache(cfg)
        print(f"\n== {cfg.label} (native window {args.residual_frames} frame(s) = {cfg.residual} tokens)")
        print(f"{'block':>5} {'frames':>9} {'seconds':>8} {'peak MiB':>9} {'cache MiB':>10} {'native MiB':>11}")
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)

        def on_block(i, info):
            c = info["cache"]
            print(f"{i:>5} {str(info['frames']):>9} {info['seconds']:>8.2f} {peak_mib(device):>9.0f} "
                  f"{c['total'] / MiB:>10.2f} {c['uncompressed'] / MiB:>11.2f}", flush=True)
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)

        t = time.perf_counter()
        lat = model.rollout(emb, cache, private_generator("gpu_video_rollout", args.seed), on_block=on_block)
        secs = time.perf_counter() - t
        st = cache_row_stats(cache)  # also checks that the codec compressed
        busy = ""
        if args.profile and device.type == "cuda":
            from harness.bench import device_seconds

            def again():
                return model.rollout(emb, model.new_cache(cfg), private_generator("gpu_video_rollout", args.seed))

            torch.cuda.synchronize(device)
            t = time.perf_counter()
            again()  # warm: the first rollout compiled what it needed
            torch.cuda.synchronize(device)
            warm = time.perf_counter() - t
            dev_s, kernels = device_seconds(again)
            busy = (f" ({warm:.2f}s warm, of which device work {dev_s:.2f}s in {kernels} kernels: "
                    f"{dev_s / warm:.1%})")
        line = (f"rollout {secs:.2f}s{busy}; cache {st['cache_bytes'] / MiB:.2f} MiB of {st['uncompressed_bytes'] / MiB:.2f} "
                f"MiB native; key bits/coord {st['bits_per_coord']:.2f}")
        if not torch.isfinite(lat).all():
            line += "; NON-FINITE latents"
        if base_lat is None:
            base_lat = lat
        elif cfg.codec == "none":
            line += f"; bit-identical to the baseline: {torch.equal(lat, base_lat)}"
        else:
            cos = vm.latent_cosine_frames(lat.float().cpu(), base_lat.float().cpu())
            line += f"; latent cos vs baseline: min {cos.min():.5f}, last frame {cos[-1]:.5f}"
        if not args.no_decode:
            t = time.perf_counter()
            fr = model.decode(lat)
            line += f"; decode {time.perf_counter() - t:.1f}s"
            if base_frames is None:
                base_frames = fr
            else:
                p = vm.psnr_video(fr, base_frames)
                line += f"; PSNR {'inf' if math.isinf(p) else f'{p:.2f}'} dB, SSIM {vm.ssim_frames(fr, base_frames).mean():.4f}"
            if args.out:
                from harness.tasks.video import write_mp4
                path = Path(args.out) / f"{spec.name}_{cfg.label.replace('@', '-')}.mp4"
                write_mp4(path, fr, spec.fps)
                line += f"; wrote {path}"
        print(line, flush=True)
        del cache
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
