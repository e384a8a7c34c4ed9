"""``harness bench``: fused decode-attention latency and bandwidth, and fused encode throughput.

Per (shape, batch, context, codec, bits): one decode step of the fused Triton kernel
(:func:`kernels.triton.decode_attention.decode_attention_fused`; for an engine's preset, which declares a
token layout, :func:`kernels.triton.token_attention.decode_attention_tokens`) and, where it covers the codec,
the table-lookup CUDA kernel (:func:`kernels.cuda.decode_lut.decode_attention_lut`, OCTOPUS,
TurboQuant-MSE and their QJL forms; the path 'auto' takes first) against, in the same process, (a) torch SDPA in bf16 on the uncompressed
cache (flash backend) and (b) dequantize-then-SDPA (the codec's PyTorch decode of keys and
values, then SDPA). Reported: latency per step, ratios, compulsory bytes per step (compressed
states + native window + query), the bytes floor (those bytes / copy bandwidth), achieved
bandwidth as a fraction of a device-to-device copy measured in the same run, the fixed cost (the
time at the shortest context), codecs against the codec they must be as fast as
(:data:`harness.bench_report.AS_FAST_AS`), the extra device memory one step allocates (vs the size of a
full-precision key tensor), and encode throughput of the fused encoders vs the PyTorch reference.
With ``--ncu``: warp instructions per token and KV head and the DRAM bytes of each decode path's
kernels, read by Nsight Compute (:mod:`harness.bench_ncu`; "—" with a note where ncu cannot run).
Writes bench.json and bench.md under --out
(default reports/bench-<timestamp>/) and prints the table. ``harness bench --generate`` times whole
decode steps of ``model.generate`` instead (:mod:`harness.bench_generate`).

Timing: CUDA-graph replays (triton.testing.do_bench_cudagraph, median); each timed call cycles
through enough copies of its inputs (up to 32) that they do not sit in L2. Compressed states are
random bytes of the codec's exact layout (decode cost does not depend on the values); the
correctness of the same kernel on real encoded keys is checked once per configuration.
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path

import torch

from . import bench_ncu
from .bench_report import _row_line, to_markdown
from .bench_timing import copy_bandwidth, sdpa, sdpa_backend_fn, time_eager, time_graph

SHAPES = {  # name -> (query heads, KV heads, head dim)
    "qwen2.5-7b": (28, 4, 128),
    "wan-1.3b": (12, 12, 128),
}
#: latency targets vs bf16 SDPA at >= 32k (H100), per codec and bits
TARGETS = {"octopus": {2: 0.5, 3: 0.5, 4: 0.7}}
TARGET_BW = 0.6  # fraction of copy bandwidth, at 2/3 bits at >= 32k, for the codecs in TARGETS
L2_FLUSH_BYTES = 160 << 20  # cycle input copies until a timed call touches this much
DEQUANT_MAX_TOKEN_HEADS = 1 << 19  # the PyTorch decode (int64 intermediates) is slow and large beyond this
#: --tune: kernel launch variants timed per row (the default first)
TUNE_VARIANTS = {
    "default": {},
    "bn128": {"block_n": 128, "maxnreg": 168},
    "8/SM": {"programs_per_sm": 8},
    "2/SM": {"programs_per_sm": 2},
    "nolimit": {"maxnreg": None, "programs_per_sm": 3},
}  # the PyTorch decode's int64 intermediates beyond this are huge


def _parse_ctx(s: str) -> int:
    s = s.strip().lower()
    return int(float(s[:-1]) * 1024) if s.endswith("k") else int(s)


def _csv(s: str, f=str):
    return [f(x) for x in s.split(",") if x.strip()]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="harness bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--contexts", default="1k,4k,16k,32k,64k,128k", help="comma list, e.g. 4k,32k")
    p.add_argument("--bits", default="2,3,4")
    p.add_argument("--batch", default="1,8")
    p.add_argument("--shapes", default=",".join(SHAPES), help=f"of {', '.join(SHAPES)}")
    p.add_argument("--codecs", default=None, help="comma list (default: every codec with a fused layout)")
    p.add_argument("--window", type=int, default=32, help="native window tokens (part of the context)")
    p.add_argument("--rep-ms", type=int, default=100, help="timing budget per measurement (ms)")
    p.add_argument("--no-dequant", action="store_true", help="skip the dequantize-then-SDPA baseline")
    p.add_argument("--no-encode", action="store_true", help="skip the encode throughput table")
    p.add_argument("--encode-tokens", type=int, default=32768, help="tokens per head for encode timing")
    p.add_argument("--block-n", type=int, default=None, help="override the kernel's BLOCK_N")
    p.add_argument("--num-warps", type=int, default=None)
    p.add_argument("--num-splits", type=int, default=None)
    p.add_argument("--no-lut", action="store_true", help="skip the table-lookup CUDA kernel")
    p.add_argument("--lut-config", default=None, help="JSON launch config for the table-lookup kernel")
    p.add_argument("--lut-compare", default=None,
                   help="JSON launch config of a second table-lookup variant timed in the same row, e.g. "
                        "'{\"merge\": \"launch\"}' (the separate combine launch)")
    p.add_argument("--no-triton", action="store_true",
                   help="skip timing the Triton kernel (rows then report the table-lookup kernel alone)")
    p.add_argument("--tune", action="store_true",
                   help="time the launch variants in TUNE_VARIANTS per row and report the best (slower)")
    p.add_argument("--ncu", action="store_true",
                   help="per row, read the decode kernels' warp instructions and DRAM bytes with Nsight Compute "
                        "(a child process under ncu; several seconds per row)")
    p.add_argument("--out", default=None, help="output folder (default reports/bench-<timestamp>)")
    p.add_argument("--generate", action="store_true", help="instead: decode tokens/s of model.generate, native "
                   "against each codec, beside the memory roofline (harness bench --generate --help)")
    return p


# ---------------------------------------------------------------------------------------------
def random_state(codec, B: int, H: int, T: int, dev, g: torch.Generator):
    """Key and value states of codec's exact layout [B, H, T, ...], random contents."""
    from kernels import Encoded

    d = codec.head_dim
    probe = codec.encode(torch.randn(1, H, 1, d, device=dev))
    vprobe = codec.encode_values(torch.randn(1, H, 1, d, device=dev))

    def fill(state):
        out = {}
        for k, t in state.tensors.items():
            shape = (B, H, T, t.shape[-1])
            if t.dtype == torch.uint8:
                out[k] = torch.randint(0, 256, shape, dtype=torch.uint8, device=dev, generator=g)
            elif k in ("norm", "rnorm"):
                out[k] = (torch.rand(shape, device=dev, generator=g) * 2 + 0.5).to(t.dtype)
            elif k == "scale":
                out[k] = (torch.rand(shape, device=dev, generator=g) * 0.1 + 0.01).to(t.dtype)
            else:
                out[k] = (torch.randn(shape, device=dev, generator=g) * 0.3).to(t.dtype)
        return Encoded(out, (B, H, T, d), torch.bfloat16)

    return fill(probe), fill(vprobe)


def check_correctness(codec, Hq, Hkv, d, dev, kernel=None) -> float:
    """Relative error of a fused kernel (default: the Triton one) vs the PyTorch reference on real
    encoded keys."""
    from kernels.attention import decode_attention_torch
    from kernels.triton.decode_attention import decode_attention_fused

    g = torch.Generator(device=dev).manual_seed(0)
    k = torch.randn(2, Hkv, 1000, d, device=dev, generator=g)
    v = torch.randn(2, Hkv, 1000, d, device=dev, generator=g)
    q = torch.randn(2, Hq, 1, d, device=dev, generator=g).to(torch.bfloat16)
    wk = torch.randn(2, Hkv, 24, d, device=dev, generator=g).to(torch.bfloat16)
    wv = torch.randn(2, Hkv, 24, d, device=dev, generator=g).to(torch.bfloat16)
    ks, vs = codec.encode(k), codec.encode_values(v)
    lens = torch.tensor([1000, 613], dtype=torch.int32, device=dev)
    out = (kernel or decode_attention_fused)(q, ks, vs, codec, wk, wv, lens)
    ref = decode_attention_torch(q, ks, vs, codec, wk, wv, lens)
    return float((out.float() - ref.float()).norm() / ref.float().norm())


def triton_path(codec):
    """The Triton decode kernel that reads this codec (:func:`kernels.attention.triton_kernel`): (supports,
    launch with the benchmark knobs)."""
    from kernels.attention import triton_kernel

    kernel = triton_kernel(codec)
    return kernel.supports, getattr(kernel, "decode_attention_tokens", None) or kernel._launch


def fused_codecs() -> list[str]:
    """Every registered codec that declares a fused layout (:meth:`kernels.base.Codec.fused_layout`)."""
    from kernels import list_codecs, make_codec

    return [n for n, bits in list_codecs().items()
            if bits and make_codec(n, bits[-1], 128).fused_layout() is not None]


def bench_encode(codec_name, bits, Hkv, d, tokens, dev, rep_ms) -> dict | None:
    """Fused encoder vs the PyTorch reference; None when no fused encoder writes this codec's state."""
    from kernels import make_codec
    from kernels.triton.encoders import encoder_unsupported, fused_encoder

    codec = make_codec(codec_name, bits, d, seed=0, layer=0, num_heads=Hkv, device=dev)
    if encoder_unsupported(codec, dev) is not None:
        return None
    # the reference: the same codec forced onto the PyTorch path ('auto' would take the fused one on CUDA)
    ref = make_codec(codec_name, bits, d, seed=0, layer=0, num_heads=Hkv, device=dev, backend="torch")
    fused = fused_encoder(codec.fused_layout())
    k = torch.randn(1, Hkv, tokens, d, device=dev).to(torch.bfloat16)
    a, b = fused(codec, k), ref.encode(k)
    same = {f: float((a.tensors[f] == b.tensors[f]).float().mean()) for f in a.tensors if a.tensors[f].dtype == torch.uint8}
    t_fused = time_eager(lambda: fused(codec, k), rep_ms)
    t_ref = time_eager(lambda: ref.encode(k), rep_ms)
    n = Hkv * tokens
    return {"codec": codec_name, "bits": bits, "vectors": n, "fused_s": t_fused, "torch_s": t_ref,
            "fused_vec_per_s": n / t_fused, "torch_vec_per_s": n / t_ref, "speedup": t_ref / t_fused,
            "bytes_equal_frac": same}


# ---------------------------------------------------------------------------------------------
def run(args) -> dict:
    import triton

    from kernels import list_codecs, make_codec
    from kernels.cuda.decode_lut import LAST_LAUNCH, decode_attention_lut
    from kernels.cuda.decode_lut import supports as lut_supports

    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    rep = args.rep_ms
    tune = {k: v for k, v in (("block_n", args.block_n), ("num_warps", args.num_warps),
                              ("num_splits", args.num_splits)) if v is not None}
    result = {
        "command": "harness bench " + " ".join(sys.argv[1:] if args.argv is None else args.argv),
        "device": props.name, "sms": props.multi_processor_count, "torch": torch.__version__,
        "triton": triton.__version__, "python": platform.python_version(), "config": vars(args) | {"argv": None},
        "rows": [], "encode": [], "correctness": {}, "lut_refused": {},
        "ncu": None if not args.ncu else {"tool": bench_ncu.find_ncu(), "metrics": list(bench_ncu.METRICS)},
    }
    lut_cfg = json.loads(args.lut_config) if args.lut_config else None
    lut_alt_cfg = json.loads(args.lut_compare) if args.lut_compare else None
    bw_copy = copy_bandwidth(dev)
    result["copy_bandwidth_Bps"] = bw_copy
    print(f"device {props.name}: copy bandwidth {bw_copy / 1e9:.0f} GB/s (read + write)", flush=True)

    gen = torch.Generator(device=dev).manual_seed(1234)
    codecs = _csv(args.codecs) if args.codecs else fused_codecs()
    contexts = _csv(args.contexts, _parse_ctx)
    for shape in _csv(args.shapes):
        if shape not in SHAPES:
            raise SystemExit(f"Unknown shape '{shape}'. Available: {', '.join(SHAPES)}")
        Hq, Hkv, d = SHAPES[shape]
        for B in _csv(args.batch, int):
            for ctx in contexts:
                W = min(args.window, ctx)
                T = ctx - W
                q = torch.randn(B, Hq, 1, d, device=dev, generator=gen).to(torch.bfloat16)
                # --- bf16 SDPA on the uncompressed cache -----------------------------------
                kv_bytes = 2 * B * Hkv * ctx * d * 2
                ncp = max(1, min(32, math.ceil(L2_FLUSH_BYTES / kv_bytes)))
                kvs = [(torch.randn(B, Hkv, ctx, d, device=dev, generator=gen).to(torch.bfloat16),
                        torch.randn(B, Hkv, ctx, d, device=dev, generator=gen).to(torch.bfloat16)) for _ in range(ncp)]
                fns = [sdpa_backend_fn(q, k, v, Hq != Hkv) for k, v in kvs]
                sdpa_name = fns[0][1]
                t_sdpa = time_graph(lambda: [f() for f, _ in fns], rep) / ncp
                wk, wv = kvs[0][0][:, :, T:], kvs[0][1][:, :, T:]
                del fns, kvs
                for name in codecs:
                    for bits in _csv(args.bits, int):
                        if bits not in list_codecs()[name]:  # an engine preset has its own bits
                            continue
                        codec = make_codec(name, bits, d, seed=0, layer=0, num_heads=Hkv, device=dev)
                        supports, _launch = triton_path(codec)
                        why = supports(codec, q.dtype)
                        if why:
                            print(f"skip {name}@{bits}: {why}")
                            continue
                        ck = f"{shape}/{name}@{bits}"
                        if ck not in result["correctness"]:
                            result["correctness"][ck] = check_correctness(codec, Hq, Hkv, d, dev, _launch)
                        ks, vs = random_state(codec, B, Hkv, T, dev, gen)
                        st_bytes = ks.nbytes() + vs.nbytes()
                        ncp = max(1, min(32, math.ceil(L2_FLUSH_BYTES / st_bytes)))
                        states = [(ks, vs)] + [random_state(codec, B, Hkv, T, dev, gen) for _ in range(ncp - 1)]

                        def timed(kw, states=states, codec=codec, fn=_launch):
                            def fused_all():
                                for a, b in states:
                                    fn(q, a, b, codec, wk, wv, **kw)
                            return time_graph(fused_all, rep) / ncp

                        # the table-lookup CUDA kernel, where it covers the codec (its reason otherwise)
                        t_lut, lut_info, t_lut_alt = None, {}, None
                        why_lut = "--no-lut" if args.no_lut else lut_supports(codec, q.dtype, Hq // Hkv, dev, Hkv)
                        if why_lut is None:
                            kl = f"{shape}/{name}@{bits} lut"
                            if kl not in result["correctness"]:
                                result["correctness"][kl] = check_correctness(codec, Hq, Hkv, d, dev,
                                                                              decode_attention_lut)
                            t_lut = timed({"config": lut_cfg} if lut_cfg else {}, fn=decode_attention_lut)
                            if lut_alt_cfg is not None:
                                t_lut_alt = timed({"config": (lut_cfg or {}) | lut_alt_cfg}, fn=decode_attention_lut)
                            sf = LAST_LAUNCH.get("split")
                            lut_info = {"regs": getattr(sf, "num_regs", None),
                                        "local_bytes": getattr(sf, "local_size_bytes", None),
                                        "smem": LAST_LAUNCH.get("layout", {}).get("smem"),
                                        "defs": dict(LAST_LAUNCH.get("defs", {}))}
                        else:
                            result["lut_refused"][f"{name}@{bits}"] = why_lut

                        variants = {}
                        if args.tune and codec.token_layout() is None:
                            for label, kw in TUNE_VARIANTS.items():
                                variants[label] = timed(tune | kw)
                            best = min(variants, key=variants.get)
                            t_fused = variants[best]
                            launched = {}
                            _launch(q, ks, vs, codec, wk, wv, record=launched, **(tune | TUNE_VARIANTS[best]))
                            kk = launched.get("split")
                            if kk is not None and hasattr(kk, "n_regs"):
                                print(f"   best {best}: regs {kk.n_regs}, spills {kk.n_spills}, "
                                      f"smem {getattr(kk.metadata, 'shared', '?')}", flush=True)
                            print("   tune " + ", ".join(f"{k}: {v * 1e6:.1f}" for k, v in variants.items()),
                                  flush=True)
                        elif args.no_triton and t_lut is not None:
                            t_fused = None
                        else:
                            t_fused = timed(tune)
                        # extra memory one step allocates (workspace), vs a full-precision key tensor
                        torch.cuda.synchronize()
                        torch.cuda.reset_peak_memory_stats(dev)
                        base = torch.cuda.memory_allocated(dev)
                        _launch(q, ks, vs, codec, wk, wv, **tune)
                        torch.cuda.synchronize()
                        extra = torch.cuda.max_memory_allocated(dev) - base
                        key_fp = B * Hkv * T * d * 2
                        # dequantize-then-SDPA
                        t_deq = None
                        if not args.no_dequant and B * Hkv * T <= DEQUANT_MAX_TOKEN_HEADS:
                            def deq(ks=ks, vs=vs, codec=codec):
                                k = torch.cat([codec.decode(ks).to(torch.bfloat16), wk], 2)
                                v = torch.cat([codec.decode_values(vs).to(torch.bfloat16), wv], 2)
                                return sdpa(q, k, v, Hq != Hkv)
                            t_deq = time_eager(deq, max(rep // 2, 20))
                        del states
                        step_bytes = st_bytes + 2 * wk.numel() * 2 + q.numel() * 2 * 2
                        # the path decode_attention's 'auto' takes: the LUT kernel where it runs, else Triton
                        best = t_lut if t_lut is not None else t_fused
                        bw = step_bytes / best
                        us = (lambda t: None if t is None else t * 1e6)
                        ratio = (lambda t, ref: None if t is None or ref is None else t / ref)
                        row = {
                            "shape": shape, "batch": B, "context": ctx, "codec": name, "bits": bits,
                            "fused_us": us(t_fused), "lut_us": us(t_lut), "sdpa_us": t_sdpa * 1e6,
                            "sdpa_backend": sdpa_name, "auto_path": "lut" if t_lut is not None else "triton",
                            "ratio_vs_sdpa": ratio(t_fused, t_sdpa), "lut_ratio_vs_sdpa": ratio(t_lut, t_sdpa),
                            "best_ratio_vs_sdpa": best / t_sdpa,
                            "dequant_sdpa_us": None if t_deq is None else t_deq * 1e6,
                            "ratio_vs_dequant": ratio(best, t_deq),
                            "bytes_per_step": step_bytes, "sdpa_bytes_per_step": kv_bytes,
                            "floor_us": step_bytes / bw_copy * 1e6,
                            "achieved_Bps": bw, "frac_of_copy_bw": bw / bw_copy,
                            "fused_frac_of_copy_bw": None if t_fused is None else step_bytes / t_fused / bw_copy,
                            "sdpa_frac_of_copy_bw": kv_bytes / t_sdpa / bw_copy,
                            "extra_alloc_bytes": extra, "fp_key_tensor_bytes": key_fp,
                            "tune_us": {k: v * 1e6 for k, v in variants.items()}, "lut_kernel": lut_info,
                        }
                        if args.ncu:
                            paths = (["lut"] if t_lut is not None else []) + (["triton"] if t_fused is not None else [])
                            spec = {"shape": (Hq, Hkv, d), "batch": B, "context": ctx, "window": args.window,
                                    "codec": name, "bits": bits, "paths": paths, "lut_config": lut_cfg,
                                    "triton_kw": tune}
                            del ks, vs
                            torch.cuda.empty_cache()
                            row["ncu"] = bench_ncu.measure(spec)
                        if t_lut_alt is not None:
                            row["lut_compare_us"] = t_lut_alt * 1e6
                            row["lut_compare_ratio_vs_sdpa"] = t_lut_alt / t_sdpa
                        if name in TARGETS and ctx >= 32 * 1024:
                            row["target_ratio"] = TARGETS[name].get(bits)
                            row["meets_ratio"] = row["best_ratio_vs_sdpa"] <= TARGETS[name].get(bits, 0)
                            if bits in (2, 3):
                                row["meets_bw"] = row["frac_of_copy_bw"] >= TARGET_BW
                        result["rows"].append(row)
                        print(_row_line(row), flush=True)
                        if t_lut_alt is not None:
                            print(f"   lut variant {lut_alt_cfg}: {t_lut_alt * 1e6:.1f} us "
                                  f"({t_lut_alt / t_sdpa:.3f} x sdpa; lut / variant {t_lut / t_lut_alt:.3f})", flush=True)
                        if not args.ncu:
                            del ks, vs
                torch.cuda.empty_cache()
    if not args.no_encode:
        Hkv, d = 4, 128
        for name in codecs:
            for bits in _csv(args.bits, int):
                r = bench_encode(name, bits, Hkv, d, args.encode_tokens, dev, rep)
                if r is None:
                    continue
                result["encode"].append(r)
                print(f"encode {name}@{bits}: fused {r['fused_vec_per_s'] / 1e6:.1f} M vec/s, torch "
                      f"{r['torch_vec_per_s'] / 1e6:.2f} M vec/s ({r['speedup']:.0f}x), bytes equal {r['bytes_equal_frac']}",
                      flush=True)
    return result


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--generate" in argv:  # whole-model decode against the native cache: its own options
        from .bench_generate import main as generate_main

        return generate_main([a for a in argv if a != "--generate"])
    args = build_parser().parse_args(argv)
    args.argv = list(argv) if argv is not None else None
    if not torch.cuda.is_available():
        print("harness bench needs a CUDA device (the fused kernels are timed on it)", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else Path("reports") / time.strftime("bench-%Y%m%d-%H%M%S")
    res = run(args)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(res, indent=1, default=str))
    md = to_markdown(res)
    (out / "bench.md").write_text(md)
    print("\n" + md)
    print(f"wrote {out / 'bench.json'} and {out / 'bench.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
