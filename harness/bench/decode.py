"""``harness bench``: fused decode-attention latency and bandwidth, and fused encode throughput.

Per (shape, batch, context, codec, bits): one decode step of the fused Triton kernel
(:func:`kernels.triton.decode_attention.decode_attention_fused`; for an engine's preset, which declares a
token layout, :func:`kernels.triton.token_attention.decode_attention_fused`) and, where it covers the codec,
the table-lookup CUDA kernel (:func:`kernels.cuda.decode_lut.decode_attention_lut`, OCTOPUS,
TurboQuant-MSE and their QJL forms; the path 'auto' takes first) against, in the same process, (a) torch
SDPA in bf16 on the uncompressed cache (flash backend) and (b) dequantize-then-SDPA (the codec's PyTorch
decode of keys and values, then SDPA). Reported: latency per step, ratios, compulsory bytes per step (compressed
states + native window + query), the bytes floor (those bytes / copy bandwidth), achieved
bandwidth as a fraction of a device-to-device copy measured in the same run, the fixed cost (the
time at the shortest context), codecs against the codec they must be as fast as
(:data:`harness.bench.report.AS_FAST_AS`), the extra device memory one step allocates (vs the size of a
full-precision key tensor), and encode throughput of the fused encoders vs the PyTorch reference
(:mod:`harness.bench.encode`).
With ``--ncu``: warp instructions per token and KV head and the DRAM bytes of each decode path's
kernels, read by Nsight Compute (:mod:`harness.bench.ncu`; "—" with a note where ncu cannot run).
Writes bench.json and bench.md under --out
(default reports/bench-<timestamp>/) and prints the table. ``harness bench --generate`` times whole
decode steps of ``model.generate`` instead (:mod:`harness.bench.generate`).

Timing: CUDA-graph replays (triton.testing.do_bench_cudagraph, median); each timed call cycles
through enough copies of its inputs (up to 32) that they do not sit in L2. Compressed states are
random bytes of the codec's exact layout (decode cost does not depend on the values); the
correctness of the same kernel on real encoded keys is checked once per configuration.

The rows are built level by level: :func:`run` (the run's header) -> :func:`shape_rows` (per shape,
batch and context) -> :func:`context_inputs` (the query, window and SDPA baseline) -> :func:`codec_row`
(per codec and bits: :func:`time_codec` times each path, :func:`latency_row` makes the row,
:func:`add_targets` marks it), then :func:`harness.bench.encode.encode_rows`.
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from kernels import make_codec

from harness.bench import generate, ncu
from harness.bench.encode import encode_rows
from harness.bench.inputs import (SHAPES, bench_codecs, check_correctness, parse_ctx, parse_list, plan,
                                  random_state, triton_path)
from harness.bench.report import add_targets, row_line, to_markdown
from harness.bench.timing import copy_bandwidth, sdpa, sdpa_backend_fn, time_eager, time_graph

L2_FLUSH_BYTES = 160 << 20  # cycle input copies until a timed call touches this much
DEQUANT_MAX_TOKEN_HEADS = 1 << 19  # the PyTorch decode (int64 intermediates) is slow and large beyond this
#: --tune: kernel launch variants timed per row (the default first)
TUNE_VARIANTS = {
    "default": {},
    "bn128": {"block_n": 128, "maxnreg": 168},
    "8/SM": {"programs_per_sm": 8},
    "2/SM": {"programs_per_sm": 2},
    "nolimit": {"maxnreg": None, "programs_per_sm": 3},
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="harness bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--contexts", default="1k,4k,16k,32k,64k,128k", help="comma list, e.g. 4k,32k")
    p.add_argument("--bits", default="2,3,4")
    p.add_argument("--batch", default="1,8")
    p.add_argument("--shapes", default=",".join(SHAPES), help=f"of {', '.join(SHAPES)}")
    p.add_argument("--codecs", default=None,
                   help="comma list: NAME (at --bits), NAME@B (at B: an engine preset's own width), 'deployed' or "
                        "'deployed:ENGINE' (the caches of harness run --preset deployed, at their bits); default: "
                        "every codec with a fused layout")
    p.add_argument("--plan", action="store_true",
                   help="print the rows this command would time and the kernel each takes, without a GPU; time "
                        "nothing")
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


@dataclass
class Bench:
    """What every row of one run shares: its options, device, generator, copy bandwidth (bytes read +
    written per second) and the result it fills (bench.json's dict)."""
    args: argparse.Namespace
    dev: torch.device
    gen: torch.Generator
    bw_copy: float
    result: dict
    tune: dict = field(default_factory=dict)  # the kernel knobs given: --block-n, --num-warps, --num-splits
    lut_cfg: dict | None = None  # --lut-config
    lut_alt_cfg: dict | None = None  # --lut-compare


@dataclass
class Context:
    """One (shape, batch, context): q [B, Hq, 1, d] bf16; wk, wv [B, Hkv, W, d] the native window (the
    last W tokens of the SDPA cache); T = context - W compressed tokens; the bf16 SDPA baseline."""
    shape: str
    Hq: int
    Hkv: int
    d: int
    B: int
    ctx: int
    T: int
    q: torch.Tensor
    wk: torch.Tensor
    wv: torch.Tensor
    t_sdpa: float  # seconds per step
    sdpa_name: str  # its backend: flash, efficient or default
    kv_bytes: int  # bytes of the uncompressed keys and values


@dataclass
class Timings:
    """One codec@bits in one context: seconds per step of each path (None: not run), the bytes of
    its compressed states, the device bytes one Triton step allocates, the --tune variants' seconds and
    the table-lookup kernel's launch facts."""
    state_bytes: int
    fused: float | None
    lut: float | None
    lut_alt: float | None
    dequant: float | None
    extra_alloc: int
    variants: dict
    lut_kernel: dict


def copies(nbytes: int) -> int:
    """Copies of an input a timed call cycles through so that they do not sit in L2 (at most 32)."""
    return max(1, min(32, math.ceil(L2_FLUSH_BYTES / nbytes)))


def run(args) -> dict:
    """-> bench.json's dict: the run's header, one row per (shape, batch, context, codec, bits), the
    encode table, the correctness checks and the codecs the table-lookup kernel refused."""
    import triton

    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    tune = {k: v for k, v in (("block_n", args.block_n), ("num_warps", args.num_warps),
                              ("num_splits", args.num_splits)) if v is not None}
    result = {
        "command": "harness bench " + " ".join(sys.argv[1:] if args.argv is None else args.argv),
        "device": props.name, "sms": props.multi_processor_count, "torch": torch.__version__,
        "triton": triton.__version__, "python": platform.python_version(), "config": vars(args) | {"argv": None},
        "rows": [], "encode": [], "correctness": {}, "lut_refused": {},
        "ncu": None if not args.ncu else {"tool": ncu.find_ncu(), "metrics": list(ncu.METRICS)},
    }
    lut_cfg = json.loads(args.lut_config) if args.lut_config else None
    lut_alt_cfg = json.loads(args.lut_compare) if args.lut_compare else None
    bw_copy = copy_bandwidth(dev)
    result["copy_bandwidth_Bps"] = bw_copy
    print(f"device {props.name}: copy bandwidth {bw_copy / 1e9:.0f} GB/s (read + write)", flush=True)

    b = Bench(args, dev, torch.Generator(device=dev).manual_seed(1234), bw_copy, result, tune, lut_cfg, lut_alt_cfg)
    codecs = bench_codecs(args.codecs, parse_list(args.bits, int))
    contexts = parse_list(args.contexts, parse_ctx)
    for shape in parse_list(args.shapes):
        shape_rows(b, shape, codecs, contexts)
    if not args.no_encode:
        encode_rows(result["encode"], list(dict.fromkeys(n for n, _ in codecs)), parse_list(args.bits, int),
                    args.encode_tokens, dev, args.rep_ms)
    return result


def shape_rows(b: Bench, shape: str, codecs: list[tuple[str, int]], contexts: list[int]) -> None:
    """Every row of one head shape: per batch and context, each (codec, bits) of --codecs."""
    if shape not in SHAPES:
        raise SystemExit(f"Unknown shape '{shape}'. Available: {', '.join(SHAPES)}")
    for B in parse_list(b.args.batch, int):
        for ctx in contexts:
            c = context_inputs(b, shape, B, ctx)
            for name, bits in codecs:
                codec_row(b, c, name, bits)
            torch.cuda.empty_cache()


def context_inputs(b: Bench, shape: str, B: int, ctx: int) -> Context:
    """The query and native window of one (shape, batch, context), and bf16 SDPA on its uncompressed
    cache (flash backend) timed over enough copies of the cache that they do not sit in L2."""
    Hq, Hkv, d = SHAPES[shape]
    W = min(b.args.window, ctx)
    T = ctx - W
    dev, gen = b.dev, b.gen
    q = torch.randn(B, Hq, 1, d, device=dev, generator=gen).to(torch.bfloat16)
    kv_bytes = 2 * B * Hkv * ctx * d * 2
    ncp = copies(kv_bytes)
    kvs = [(torch.randn(B, Hkv, ctx, d, device=dev, generator=gen).to(torch.bfloat16),
            torch.randn(B, Hkv, ctx, d, device=dev, generator=gen).to(torch.bfloat16)) for _ in range(ncp)]
    fns = [sdpa_backend_fn(q, k, v, Hq != Hkv) for k, v in kvs]
    t_sdpa = time_graph(lambda: [f() for f, _ in fns], b.args.rep_ms) / ncp
    wk, wv = kvs[0][0][:, :, T:], kvs[0][1][:, :, T:]
    return Context(shape, Hq, Hkv, d, B, ctx, T, q, wk, wv, t_sdpa, fns[0][1], kv_bytes)


def codec_row(b: Bench, c: Context, name: str, bits: int) -> None:
    """One codec@bits in context ``c``: checked once per (shape, codec, bits) against the PyTorch
    reference, timed, its row (with ncu's figures under --ncu) appended to the result and printed."""
    codec = make_codec(name, bits, c.d, seed=0, layer=0, num_heads=c.Hkv, device=b.dev)
    supports, launch = triton_path(codec)
    why = supports(codec, c.q.dtype)
    if why:
        print(f"skip {name}@{bits}: {why}")
        return
    ck = f"{c.shape}/{name}@{bits}"
    if ck not in b.result["correctness"]:
        b.result["correctness"][ck] = check_correctness(codec, c.Hq, c.Hkv, c.d, b.dev, launch)
    t = time_codec(b, c, codec, launch, f"{name}@{bits}")  # its compressed states are freed on return
    row = latency_row(c, name, bits, t, b.bw_copy)
    if b.args.ncu:
        paths = (["lut"] if t.lut is not None else []) + (["triton"] if t.fused is not None else [])
        spec = {"shape": (c.Hq, c.Hkv, c.d), "batch": c.B, "context": c.ctx, "window": b.args.window,
                "codec": name, "bits": bits, "paths": paths, "lut_config": b.lut_cfg, "triton_kw": b.tune}
        torch.cuda.empty_cache()
        row["ncu"] = ncu.measure(spec)
    if t.lut_alt is not None:
        row["lut_compare_us"] = t.lut_alt * 1e6
        row["lut_compare_ratio_vs_sdpa"] = t.lut_alt / c.t_sdpa
    add_targets(row)
    b.result["rows"].append(row)
    print(row_line(row), flush=True)
    if t.lut_alt is not None:
        print(f"   lut variant {b.lut_alt_cfg}: {t.lut_alt * 1e6:.1f} us "
              f"({t.lut_alt / c.t_sdpa:.3f} x sdpa; lut / variant {t.lut / t.lut_alt:.3f})", flush=True)


def time_codec(b: Bench, c: Context, codec, launch, label: str) -> Timings:
    """Time every path of one codec (``label``: codec@bits) in context ``c`` over random states of its
    layout (enough copies that they do not sit in L2): the table-lookup kernel, the Triton kernel,
    dequantize-then-SDPA."""
    ks, vs = random_state(codec, c.B, c.Hkv, c.T, b.dev, b.gen)
    state_bytes = ks.nbytes() + vs.nbytes()
    ncp = copies(state_bytes)
    states = [(ks, vs)] + [random_state(codec, c.B, c.Hkv, c.T, b.dev, b.gen) for _ in range(ncp - 1)]

    def timed(kw, fn=launch):
        def fused_all():
            for a, s in states:
                fn(c.q, a, s, codec, c.wk, c.wv, **kw)
        return time_graph(fused_all, b.args.rep_ms) / ncp

    lut, lut_kernel, lut_alt = time_lut(b, c, codec, label, timed)
    fused, variants = time_triton(b, c, codec, ks, vs, launch, timed, lut)
    extra = extra_alloc(b, c, codec, ks, vs, launch)
    return Timings(state_bytes, fused, lut, lut_alt, time_dequant(b, c, codec, ks, vs), extra, variants, lut_kernel)


def time_lut(b: Bench, c: Context, codec, label: str, timed) -> tuple[float | None, dict, float | None]:
    """The table-lookup CUDA kernel where it covers the codec (checked once against the reference) ->
    (seconds per step, its launch facts, the --lut-compare variant's seconds); where it does not:
    (None, {}, None), its reason in the result's ``lut_refused``."""
    from kernels.cuda.decode_lut import LAST_LAUNCH, decode_attention_lut
    from kernels.cuda.decode_lut import supports as lut_supports

    why_lut = "--no-lut" if b.args.no_lut else lut_supports(codec, c.q.dtype, c.Hq // c.Hkv, b.dev, c.Hkv)
    if why_lut is not None:
        b.result["lut_refused"][label] = why_lut
        return None, {}, None
    kl = f"{c.shape}/{label} lut"
    if kl not in b.result["correctness"]:
        b.result["correctness"][kl] = check_correctness(codec, c.Hq, c.Hkv, c.d, b.dev, decode_attention_lut)
    t_lut = timed({"config": b.lut_cfg} if b.lut_cfg else {}, fn=decode_attention_lut)
    t_alt = None
    if b.lut_alt_cfg is not None:
        t_alt = timed({"config": (b.lut_cfg or {}) | b.lut_alt_cfg}, fn=decode_attention_lut)
    sf = LAST_LAUNCH.get("split")
    info = {"regs": getattr(sf, "num_regs", None), "local_bytes": getattr(sf, "local_size_bytes", None),
            "smem": LAST_LAUNCH.get("layout", {}).get("smem"), "defs": dict(LAST_LAUNCH.get("defs", {}))}
    return t_lut, info, t_alt


def time_triton(b: Bench, c: Context, codec, ks, vs, launch, timed, t_lut) -> tuple[float | None, dict]:
    """The Triton kernel's seconds per step (None under --no-triton where the table-lookup kernel ran);
    under --tune (not for a token layout) the best of TUNE_VARIANTS -> (seconds, {variant: seconds})."""
    variants = {}
    if b.args.tune and codec.token_layout() is None:
        for label, kw in TUNE_VARIANTS.items():
            variants[label] = timed(b.tune | kw)
        best = min(variants, key=variants.get)
        launched = {}
        launch(c.q, ks, vs, codec, c.wk, c.wv, record=launched, **(b.tune | TUNE_VARIANTS[best]))
        kk = launched.get("split")
        if kk is not None and hasattr(kk, "n_regs"):
            print(f"   best {best}: regs {kk.n_regs}, spills {kk.n_spills}, "
                  f"smem {getattr(kk.metadata, 'shared', '?')}", flush=True)
        print("   tune " + ", ".join(f"{k}: {v * 1e6:.1f}" for k, v in variants.items()), flush=True)
        return variants[best], variants
    if b.args.no_triton and t_lut is not None:
        return None, variants
    return timed(b.tune), variants


def extra_alloc(b: Bench, c: Context, codec, ks, vs, launch) -> int:
    """Device bytes one Triton step allocates beyond what is already held (its split workspace)."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats(b.dev)
    base = torch.cuda.memory_allocated(b.dev)
    launch(c.q, ks, vs, codec, c.wk, c.wv, **b.tune)
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated(b.dev) - base


def time_dequant(b: Bench, c: Context, codec, ks, vs) -> float | None:
    """Seconds per step of dequantize-then-SDPA (the codec's PyTorch decode of keys and values, the
    window appended, bf16 SDPA), timed eagerly; None under --no-dequant or beyond DEQUANT_MAX_TOKEN_HEADS."""
    if b.args.no_dequant or c.B * c.Hkv * c.T > DEQUANT_MAX_TOKEN_HEADS:
        return None

    def deq():
        k = torch.cat([codec.decode(ks).to(torch.bfloat16), c.wk], 2)
        v = torch.cat([codec.decode_values(vs).to(torch.bfloat16), c.wv], 2)
        return sdpa(c.q, k, v, c.Hq != c.Hkv)

    return time_eager(deq, max(b.args.rep_ms // 2, 20))


def latency_row(c: Context, name: str, bits: int, t: Timings, bw_copy: float) -> dict:
    """A row of bench.json from one codec's timings: microseconds per step, ratios to SDPA and to
    dequantize-then-SDPA, compulsory bytes per step and the bytes floor, achieved bandwidth as a
    fraction of ``bw_copy``; the achieved figures are the path 'auto' takes (the LUT kernel where it ran)."""
    step_bytes = t.state_bytes + 2 * c.wk.numel() * 2 + c.q.numel() * 2 * 2
    best = t.lut if t.lut is not None else t.fused
    bw = step_bytes / best
    us = (lambda x: None if x is None else x * 1e6)
    ratio = (lambda x, ref: None if x is None or ref is None else x / ref)
    return {
        "shape": c.shape, "batch": c.B, "context": c.ctx, "codec": name, "bits": bits,
        "fused_us": us(t.fused), "lut_us": us(t.lut), "sdpa_us": c.t_sdpa * 1e6,
        "sdpa_backend": c.sdpa_name, "auto_path": "lut" if t.lut is not None else "triton",
        "ratio_vs_sdpa": ratio(t.fused, c.t_sdpa), "lut_ratio_vs_sdpa": ratio(t.lut, c.t_sdpa),
        "best_ratio_vs_sdpa": best / c.t_sdpa,
        "dequant_sdpa_us": None if t.dequant is None else t.dequant * 1e6,
        "ratio_vs_dequant": ratio(best, t.dequant),
        "bytes_per_step": step_bytes, "sdpa_bytes_per_step": c.kv_bytes,
        "floor_us": step_bytes / bw_copy * 1e6,
        "achieved_Bps": bw, "frac_of_copy_bw": bw / bw_copy,
        "fused_frac_of_copy_bw": None if t.fused is None else step_bytes / t.fused / bw_copy,
        "sdpa_frac_of_copy_bw": c.kv_bytes / c.t_sdpa / bw_copy,
        "extra_alloc_bytes": t.extra_alloc, "fp_key_tensor_bytes": c.B * c.Hkv * c.T * c.d * 2,
        "tune_us": {k: v * 1e6 for k, v in t.variants.items()}, "lut_kernel": t.lut_kernel,
    }


def main(argv=None) -> int:
    """``harness bench ARGS``: the decode-attention benchmark, or with --generate :mod:`harness.bench.generate`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--generate" in argv:  # whole-model decode against the native cache: its own options
        return generate.main([a for a in argv if a != "--generate"])
    args = build_parser().parse_args(argv)
    args.argv = list(argv) if argv is not None else None
    if args.plan:
        print("\n".join(plan(args)))
        return 0
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
