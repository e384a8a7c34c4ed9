"""Profiling helpers of the table-lookup CUDA decode kernel (kernels.cuda.decode_lut), GPU only.
The side-by-side benchmark (bf16 SDPA, the Triton kernel, the LUT kernel; fixed cost, achieved
bandwidth, bytes floor) is ``harness bench`` (e.g. ``harness bench --codecs octopus --no-dequant --no-encode``).

python -m scripts.gpu_bench_lut check
    the kernel against decode_attention_torch on real encoded keys, several shapes and configs.
python -m scripts.gpu_bench_lut sweep [--contexts 4k] [--bits 3] [--configs '{"num_warps": 4};{}']
    launch configurations, and the split and combine kernels alone ("split" includes lut_qprep where
    it runs; "combine" alone is launched with PDL where the config says so and reads the partials a
    previous call left: its time, not its output, is what counts).
python -m scripts.gpu_bench_lut once BITS [--ctx 32k] [--batch 1]
    a few launches of one configuration, for ncu (--kernel-name lut_split).
python -m scripts.gpu_bench_lut host [--contexts 4k,32k] [--configs '{"pdl": false};{}']
    host time per eager call (what a decode step pays per layer), against wall time.
python -m scripts.gpu_bench_lut kernels [--codecs octopus@3,turboquant-prod@3] [--batch 1,8] [--ctx 32k]
    device time per kernel of one call (lut_qprep, lut_split, lut_combine; torch.profiler): with PDL
    the kernels overlap, so a kernel's time includes the wait for the one before it.
"""
from __future__ import annotations

import argparse
import json
import sys

import torch

from harness.bench import SHAPES, copies, parse_ctx, parse_list, random_state, real_inputs, time_graph
from kernels import make_codec
from kernels.attention import decode_attention_torch


def _rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


def check(configs=None) -> list:
    from kernels.cuda.decode_lut import decode_attention_lut

    dev = torch.device("cuda")
    rows = []
    for shape in ("qwen2.5-7b", "wan-1.3b"):
        Hq, Hkv, d = SHAPES[shape]
        for bits in (2, 3, 4):
            codec = make_codec("octopus", bits, d, seed=0, layer=0, num_heads=Hkv, device=dev)
            q, ks, vs, wk, wv, lens = real_inputs(codec, Hq, Hkv, d, dev, seed=bits)
            ref = decode_attention_torch(q, ks, vs, codec, wk, wv, lens)
            for cfg in configs or [None]:
                out = decode_attention_lut(q, ks, vs, codec, wk, wv, lens, config=cfg)
                torch.cuda.synchronize()
                e = _rel(out, ref)
                rows.append({"shape": shape, "bits": bits, "config": cfg, "rel_err": e})
                print(f"check {shape} @{bits} {cfg}: rel err {e:.2e}", flush=True)
    return rows


def sweep(a):
    """Launch configurations and the two kernels alone (profiling: split only, combine only)."""
    from kernels.cuda.decode_lut import LAST_LAUNCH, decode_attention_lut

    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(7)
    cfgs = [json.loads(c) for c in a.configs.split(";")] if a.configs else [{}]
    for shape in parse_list(a.shapes):
        Hq, Hkv, d = SHAPES[shape]
        for B in parse_list(a.batch, int):
            for ctx in parse_list(a.contexts, parse_ctx):
                T = ctx - 32
                q = torch.randn(B, Hq, 1, d, device=dev, generator=gen).to(torch.bfloat16)
                wk = torch.randn(B, Hkv, 32, d, device=dev, generator=gen).to(torch.bfloat16)
                wv = torch.randn_like(wk)
                for bits in parse_list(a.bits, int):
                    codec = make_codec("octopus", bits, d, seed=0, layer=0, num_heads=Hkv, device=dev)
                    ks, vs = random_state(codec, B, Hkv, T, dev, gen)
                    n = copies(ks.nbytes() + vs.nbytes())
                    states = [(ks, vs)] + [random_state(codec, B, Hkv, T, dev, gen) for _ in range(n - 1)]
                    for cfg in cfgs:
                        line = []
                        for parts in ("both", "split", "combine"):
                            def f(parts=parts, cfg=cfg, states=states):
                                for x, y in states:
                                    decode_attention_lut(q, x, y, codec, wk, wv, config=cfg, _parts=parts)
                            line.append(time_graph(f, a.rep_ms) / n * 1e6)
                        sf = LAST_LAUNCH["split"]
                        print(f"sweep {shape} B{B} {ctx // 1024}k @{bits} {json.dumps(cfg)}: both {line[0]:.1f} "
                              f"split {line[1]:.1f} combine {line[2]:.1f} us; regs {sf.num_regs} local "
                              f"{sf.local_size_bytes} smem {LAST_LAUNCH['layout']['smem']}", flush=True)
                    del states


def _row_inputs(shape: str, B: int, T: int, bits: int, name: str = "octopus"):
    """(codec, q, key state, value state, window keys, window values) of one benchmark row: codec
    ``name`` at ``bits`` in ``shape``'s geometry, random states of its exact layout, a 32-token bf16 window."""
    dev = torch.device("cuda")
    Hq, Hkv, d = SHAPES[shape]
    g = torch.Generator(device=dev).manual_seed(0)
    codec = make_codec(name, bits, d, seed=0, layer=0, num_heads=Hkv, device=dev)
    ks, vs = random_state(codec, B, Hkv, T, dev, g)
    q = torch.randn(B, Hq, 1, d, device=dev, dtype=torch.bfloat16, generator=g)
    wk = torch.randn(B, Hkv, 32, d, device=dev, dtype=torch.bfloat16, generator=g)
    return codec, q, ks, vs, wk, torch.randn(wk.shape, device=dev, dtype=torch.bfloat16, generator=g)


def once(a):
    from kernels.cuda.decode_lut import decode_attention_lut

    codec, q, ks, vs, wk, wv = _row_inputs(a.shape, a.batch, parse_ctx(a.ctx), a.bits)
    cfg = json.loads(a.config) if a.config else None
    for _ in range(3):
        decode_attention_lut(q, ks, vs, codec, wk, wv, config=cfg)
    torch.cuda.synchronize()


def host(a):
    """Host time per eager call of the LUT path (the launches and their Python), against wall time:
    a decode step calls it once per layer and is bound by host time (docs/decode_lut.md)."""
    import time

    from kernels.cuda.decode_lut import decode_attention_lut

    cfgs = [json.loads(c) for c in a.configs.split(";")] if a.configs else [{}]
    for ctx in parse_list(a.contexts, parse_ctx):
        codec, q, ks, vs, wk, wv = _row_inputs(a.shape, a.batch, ctx, a.bits)
        for cfg in cfgs:
            for _ in range(20):
                decode_attention_lut(q, ks, vs, codec, wk, wv, config=cfg)
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(a.calls):
                decode_attention_lut(q, ks, vs, codec, wk, wv, config=cfg)
            th = time.perf_counter() - t
            torch.cuda.synchronize()
            tw = time.perf_counter() - t
            print(f"host {a.shape} B{a.batch} {ctx // 1024}k @{a.bits} {json.dumps(cfg)}: host {th / a.calls * 1e6:.1f} "
                  f"us/call, wall {tw / a.calls * 1e6:.1f} us/call", flush=True)


def kernel_times(a):
    """Device time per kernel of one LUT call, averaged over ``a.calls`` calls (torch.profiler)."""
    from collections import defaultdict

    from kernels.cuda.decode_lut import decode_attention_lut

    for B in parse_list(a.batch, int):
        for spec in a.codecs.split(","):
            name, bits = spec.split("@")
            codec, q, ks, vs, wk, wv = _row_inputs(a.shape, B, parse_ctx(a.ctx), int(bits), name)
            for _ in range(10):
                decode_attention_lut(q, ks, vs, codec, wk, wv)
            torch.cuda.synchronize()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(a.calls):
                    decode_attention_lut(q, ks, vs, codec, wk, wv)
                torch.cuda.synchronize()
            t = defaultdict(float)
            for e in prof.events():
                if e.device_type == torch.autograd.DeviceType.CUDA:
                    t[e.name] += e.device_time / a.calls
            print(f"{a.shape} B={B} {a.ctx} {spec}: " + "  ".join(f"{k} {v:.1f} us" for k, v in sorted(t.items())),
                  flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("check")
    w = sub.add_parser("sweep")
    w.add_argument("--contexts", default="4k,32k,128k")
    w.add_argument("--batch", default="1,8")
    w.add_argument("--bits", default="3")
    w.add_argument("--shapes", default="qwen2.5-7b")
    w.add_argument("--rep-ms", type=int, default=30)
    w.add_argument("--configs", default=None, help="';'-separated JSON launch configs")
    o = sub.add_parser("once")
    o.add_argument("bits", type=int)
    o.add_argument("--ctx", default="32k")
    o.add_argument("--batch", type=int, default=1)
    o.add_argument("--shape", default="qwen2.5-7b")
    o.add_argument("--config", default=None)
    h = sub.add_parser("host")
    h.add_argument("--contexts", default="4k,32k")
    h.add_argument("--batch", type=int, default=1)
    h.add_argument("--bits", type=int, default=3)
    h.add_argument("--shape", default="qwen2.5-7b")
    h.add_argument("--calls", type=int, default=300)
    h.add_argument("--configs", default=None, help="';'-separated JSON launch configs")
    k = sub.add_parser("kernels")
    k.add_argument("--codecs", default="octopus@3,turboquant-mse@3,octopus-qjl@3,turboquant-prod@3")
    k.add_argument("--batch", default="1,8")
    k.add_argument("--ctx", default="32k")
    k.add_argument("--shape", default="qwen2.5-7b")
    k.add_argument("--calls", type=int, default=50)
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 2
    if a.cmd == "check":
        check()
    elif a.cmd == "sweep":
        sweep(a)
    elif a.cmd == "once":
        once(a)
    elif a.cmd == "host":
        host(a)
    elif a.cmd == "kernels":
        kernel_times(a)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
