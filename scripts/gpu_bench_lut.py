"""Decode attention side by side in one process: bf16 SDPA (flash), the fused Triton kernel
(kernels.triton.decode_attention.decode_attention_fused) and the table-lookup CUDA kernel
(kernels.cuda.decode_lut.decode_attention_lut), GPU only.

python scripts/gpu_bench_lut.py bench [--contexts 4k,32k,128k] [--batch 1,8] [--bits 2,3,4]
                                      [--shapes qwen2.5-7b,wan-1.3b] [--rep-ms 40] [--no-triton]
    per row: latency per step (CUDA-graph replay, median, inputs cycled past L2), ratio to SDPA,
    compulsory bytes per step (compressed states + native window + query), achieved bandwidth
    as a fraction of a device-to-device copy measured in the same run, and the bytes floor
    (bytes / copy bandwidth). Correctness of each configuration on real encoded keys first.
python scripts/gpu_bench_lut.py check
    the kernel against decode_attention_torch on real encoded keys, several shapes and configs.
python scripts/gpu_bench_lut.py once BITS [--ctx 32k] [--batch 1]
    a few launches of one configuration, for ncu (--kernel-name lut_split).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.bench import (SHAPES, _csv, _parse_ctx, _time, copy_bandwidth, random_state,  # noqa: E402
                           sdpa_backend_fn)
from kernels import make_codec  # noqa: E402
from kernels.attention import decode_attention_torch  # noqa: E402

L2_FLUSH = 160 << 20


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
            g = torch.Generator(device=dev).manual_seed(bits)
            k = torch.randn(2, Hkv, 1000, d, device=dev, generator=g)
            v = torch.randn(2, Hkv, 1000, d, device=dev, generator=g)
            q = torch.randn(2, Hq, 1, d, device=dev, generator=g).to(torch.bfloat16)
            wk = torch.randn(2, Hkv, 24, d, device=dev, generator=g).to(torch.bfloat16)
            wv = torch.randn(2, Hkv, 24, d, device=dev, generator=g).to(torch.bfloat16)
            ks, vs = codec.encode(k), codec.encode_values(v)
            lens = torch.tensor([1000, 613], dtype=torch.int32, device=dev)
            ref = decode_attention_torch(q, ks, vs, codec, wk, wv, lens)
            for cfg in configs or [None]:
                out = decode_attention_lut(q, ks, vs, codec, wk, wv, lens, config=cfg)
                torch.cuda.synchronize()
                e = _rel(out, ref)
                rows.append({"shape": shape, "bits": bits, "config": cfg, "rel_err": e})
                print(f"check {shape} @{bits} {cfg}: rel err {e:.2e}", flush=True)
    return rows


def bench(a) -> dict:
    import triton

    from kernels.cuda.decode_lut import LAST_LAUNCH, decode_attention_lut
    from kernels.triton.decode_attention import decode_attention_fused

    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    bw = copy_bandwidth(dev)
    res = {"device": props.name, "sms": props.multi_processor_count, "torch": torch.__version__,
           "triton": triton.__version__, "copy_Bps": bw, "command": "python scripts/gpu_bench_lut.py " +
           " ".join(sys.argv[1:]), "rows": [], "check": []}
    print(f"device {props.name}: copy bandwidth {bw / 1e9:.0f} GB/s (read + write)", flush=True)
    cfg = json.loads(a.config) if a.config else None
    res["check"] = check([cfg]) if not a.no_check else []
    gen = torch.Generator(device=dev).manual_seed(1234)
    hdr = (f"{'shape':<11} {'B':>2} {'ctx':>5} {'b':>1} {'sdpa us':>8} {'triton us':>9} {'lut us':>7} "
           f"{'tri/sdpa':>8} {'lut/sdpa':>8} {'MB/step':>8} {'floor us':>8} {'lut GB/s':>8} {'of copy':>7}")
    print(hdr, flush=True)
    for shape in _csv(a.shapes):
        Hq, Hkv, d = SHAPES[shape]
        for B in _csv(a.batch, int):
            for ctx in _csv(a.contexts, _parse_ctx):
                W = min(a.window, ctx)
                T = ctx - W
                q = torch.randn(B, Hq, 1, d, device=dev, generator=gen).to(torch.bfloat16)
                kv_bytes = 2 * B * Hkv * ctx * d * 2
                ncp = max(1, min(32, math.ceil(L2_FLUSH / kv_bytes)))
                kvs = [(torch.randn(B, Hkv, ctx, d, device=dev, generator=gen).to(torch.bfloat16),
                        torch.randn(B, Hkv, ctx, d, device=dev, generator=gen).to(torch.bfloat16)) for _ in range(ncp)]
                fns = [sdpa_backend_fn(q, k, v, Hq != Hkv) for k, v in kvs]
                t_sdpa = _time(lambda: [f() for f, _ in fns], a.rep_ms) / ncp
                wk, wv = kvs[0][0][:, :, T:], kvs[0][1][:, :, T:]
                del fns, kvs
                for bits in _csv(a.bits, int):
                    codec = make_codec("octopus", bits, d, seed=0, layer=0, num_heads=Hkv, device=dev)
                    ks, vs = random_state(codec, B, Hkv, T, dev, gen)
                    st_bytes = ks.nbytes() + vs.nbytes()
                    n = max(1, min(32, math.ceil(L2_FLUSH / st_bytes)))
                    states = [(ks, vs)] + [random_state(codec, B, Hkv, T, dev, gen) for _ in range(n - 1)]

                    def run_all(fn, states=states, codec=codec, **kw):
                        def f():
                            for x, y in states:
                                fn(q, x, y, codec, wk, wv, **kw)
                        return f

                    t_tri = None
                    if not a.no_triton:
                        t_tri = _time(run_all(decode_attention_fused), a.rep_ms) / n
                    kw = {"config": cfg} if cfg else {}
                    t_lut = _time(run_all(decode_attention_lut, **kw), a.rep_ms) / n
                    step = st_bytes + 2 * wk.numel() * 2 + q.numel() * 2 * 2
                    row = {"shape": shape, "batch": B, "context": ctx, "bits": bits, "sdpa_us": t_sdpa * 1e6,
                           "triton_us": None if t_tri is None else t_tri * 1e6, "lut_us": t_lut * 1e6,
                           "triton_ratio": None if t_tri is None else t_tri / t_sdpa, "lut_ratio": t_lut / t_sdpa,
                           "bytes_per_step": step, "floor_us": step / bw * 1e6, "lut_Bps": step / t_lut,
                           "lut_frac_copy": step / t_lut / bw, "sdpa_frac_copy": kv_bytes / t_sdpa / bw,
                           "regs": getattr(LAST_LAUNCH.get("split"), "num_regs", None),
                           "local_bytes": getattr(LAST_LAUNCH.get("split"), "local_size_bytes", None),
                           "smem": LAST_LAUNCH.get("layout", {}).get("smem"), "defs": dict(LAST_LAUNCH.get("defs", {}))}
                    res["rows"].append(row)
                    tri = "-" if t_tri is None else f"{t_tri * 1e6:.1f}"
                    trr = "-" if t_tri is None else f"{t_tri / t_sdpa:.3f}"
                    print(f"{shape:<11} {B:>2} {ctx // 1024:>4}k {bits} {t_sdpa * 1e6:>8.1f} {tri:>9} "
                          f"{t_lut * 1e6:>7.1f} {trr:>8} {t_lut / t_sdpa:>8.3f} {step / 1e6:>8.2f} "
                          f"{step / bw * 1e6:>8.1f} {step / t_lut / 1e9:>8.0f} {step / t_lut / bw:>7.2f}", flush=True)
                    del states, ks, vs
                torch.cuda.empty_cache()
    sp = res["rows"][-1] if res["rows"] else {}
    print(f"lut_split: {sp.get('regs')} registers, {sp.get('local_bytes')} B local, {sp.get('smem')} B shared")
    return res


def sweep(a):
    """Launch configurations and the two kernels alone (profiling: split only, combine only)."""
    from kernels.cuda.decode_lut import LAST_LAUNCH, decode_attention_lut

    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(7)
    cfgs = [json.loads(c) for c in a.configs.split(";")] if a.configs else [{}]
    for shape in _csv(a.shapes):
        Hq, Hkv, d = SHAPES[shape]
        for B in _csv(a.batch, int):
            for ctx in _csv(a.contexts, _parse_ctx):
                T = ctx - 32
                q = torch.randn(B, Hq, 1, d, device=dev, generator=gen).to(torch.bfloat16)
                wk = torch.randn(B, Hkv, 32, d, device=dev, generator=gen).to(torch.bfloat16)
                wv = torch.randn_like(wk)
                for bits in _csv(a.bits, int):
                    codec = make_codec("octopus", bits, d, seed=0, layer=0, num_heads=Hkv, device=dev)
                    ks, vs = random_state(codec, B, Hkv, T, dev, gen)
                    n = max(1, min(32, math.ceil(L2_FLUSH / (ks.nbytes() + vs.nbytes()))))
                    states = [(ks, vs)] + [random_state(codec, B, Hkv, T, dev, gen) for _ in range(n - 1)]
                    for cfg in cfgs:
                        line = []
                        for parts in ("both", "split", "combine"):
                            def f(parts=parts, cfg=cfg):
                                for x, y in states:
                                    decode_attention_lut(q, x, y, codec, wk, wv, config=cfg, _parts=parts)
                            line.append(_time(f, a.rep_ms) / n * 1e6)
                        sf = LAST_LAUNCH["split"]
                        print(f"sweep {shape} B{B} {ctx // 1024}k @{bits} {json.dumps(cfg)}: both {line[0]:.1f} "
                              f"split {line[1]:.1f} combine {line[2]:.1f} us; regs {sf.num_regs} local "
                              f"{sf.local_size_bytes} smem {LAST_LAUNCH['layout']['smem']}", flush=True)
                    del states


def once(a):
    from kernels.cuda.decode_lut import decode_attention_lut

    dev = torch.device("cuda")
    Hq, Hkv, d = SHAPES[a.shape]
    T, B = _parse_ctx(a.ctx), a.batch
    g = torch.Generator(device=dev).manual_seed(0)
    codec = make_codec("octopus", a.bits, d, seed=0, layer=0, num_heads=Hkv, device=dev)
    ks, vs = random_state(codec, B, Hkv, T, dev, g)
    q = torch.randn(B, Hq, 1, d, device=dev, dtype=torch.bfloat16)
    wk = torch.randn(B, Hkv, 32, d, device=dev, dtype=torch.bfloat16)
    cfg = json.loads(a.config) if a.config else None
    for _ in range(3):
        decode_attention_lut(q, ks, vs, codec, wk, torch.randn_like(wk), config=cfg)
    torch.cuda.synchronize()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("bench")
    b.add_argument("--contexts", default="4k,32k,128k")
    b.add_argument("--batch", default="1,8")
    b.add_argument("--bits", default="2,3,4")
    b.add_argument("--shapes", default="qwen2.5-7b,wan-1.3b")
    b.add_argument("--window", type=int, default=32)
    b.add_argument("--rep-ms", type=int, default=40)
    b.add_argument("--no-triton", action="store_true")
    b.add_argument("--no-check", action="store_true")
    b.add_argument("--config", default=None, help="JSON launch config for the LUT kernel")
    b.add_argument("--out", default=None, help="write the JSON here")
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
    else:
        t0 = time.time()
        res = bench(a)
        res["wall_s"] = time.time() - t0
        if a.out:
            Path(a.out).write_text(json.dumps(res, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
