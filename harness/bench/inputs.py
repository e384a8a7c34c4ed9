"""What ``harness bench`` times its kernels on: the head shapes, its comma-list options, random
compressed states of a codec's exact layout, the Triton kernel that reads a codec, and the check of
a fused kernel against the PyTorch reference on real encoded keys."""
from __future__ import annotations

import torch

from kernels import Encoded, list_codecs, make_codec

SHAPES = {  # name -> (query heads, KV heads, head dim)
    "qwen2.5-7b": (28, 4, 128),
    "wan-1.3b": (12, 12, 128),
}


def parse_ctx(s: str) -> int:
    """A context length: '32k' -> 32768 (k = 1024 tokens), '1000' -> 1000."""
    s = s.strip().lower()
    return int(float(s[:-1]) * 1024) if s.endswith("k") else int(s)


def parse_list(s: str, f=str) -> list:
    """A comma list, each item through ``f``: '1,8' -> [1, 8] with f=int; empty items dropped."""
    return [f(x) for x in s.split(",") if x.strip()]


def random_state(codec, B: int, H: int, T: int, dev, g: torch.Generator) -> tuple[Encoded, Encoded]:
    """Key and value states of codec's exact layout [B, H, T, ...], random contents (decode cost does
    not depend on the values)."""
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


def real_inputs(codec, Hq, Hkv, d, dev, seed: int = 0) -> tuple:
    """(q [2, Hq, 1, d] bf16, keys and values as ``codec`` encodes them [2, Hkv, 1000, d], the bf16 window
    [2, Hkv, 24, d] of keys and of values, lengths [1000, 613]): what a correctness check decodes."""
    g = torch.Generator(device=dev).manual_seed(seed)
    k = torch.randn(2, Hkv, 1000, d, device=dev, generator=g)
    v = torch.randn(2, Hkv, 1000, d, device=dev, generator=g)
    q = torch.randn(2, Hq, 1, d, device=dev, generator=g).to(torch.bfloat16)
    wk = torch.randn(2, Hkv, 24, d, device=dev, generator=g).to(torch.bfloat16)
    wv = torch.randn(2, Hkv, 24, d, device=dev, generator=g).to(torch.bfloat16)
    lens = torch.tensor([1000, 613], dtype=torch.int32, device=dev)
    return q, codec.encode(k), codec.encode_values(v), wk, wv, lens


def check_correctness(codec, Hq, Hkv, d, dev, kernel=None) -> float:
    """Relative error of a fused kernel (default: the Triton one) vs the PyTorch reference on real
    encoded keys (:func:`real_inputs`)."""
    from kernels.attention import decode_attention_torch
    from kernels.triton.decode_attention import decode_attention_fused

    q, ks, vs, wk, wv, lens = real_inputs(codec, Hq, Hkv, d, dev)
    out = (kernel or decode_attention_fused)(q, ks, vs, codec, wk, wv, lens)
    ref = decode_attention_torch(q, ks, vs, codec, wk, wv, lens)
    return float((out.float() - ref.float()).norm() / ref.float().norm())


def triton_path(codec):
    """The Triton decode kernel that reads this codec (:func:`kernels.attention.triton_kernel`): (supports,
    launch with the benchmark knobs: block_n, num_warps, num_splits, record, ...)."""
    from kernels.attention import triton_kernel

    kernel = triton_kernel(codec)
    return kernel.supports, kernel.decode_attention_fused


def bench_codecs(spec: str | None, bits: list[int]) -> list[tuple[str, int]]:
    """The (codec, bits) rows ``--codecs`` names, ``bits`` being ``--bits``: NAME (at each of ``bits`` it
    supports), NAME@B (at B alone: an engine's preset at its own width, e.g. llamacpp-q4_0@4), 'deployed' (every
    cache ``harness run --preset deployed`` runs, each at its own bits) or 'deployed:ENGINE' (one engine's);
    default: every codec with a fused layout, at ``bits``. An unknown name or width is one line naming it."""
    from harness.run.config import DEPLOYED

    known = list_codecs()
    items = parse_list(spec) if spec else fused_codecs()
    out: list[tuple[str, int]] = []
    for item in (s.strip() for s in items):
        if item == "deployed" or item.startswith("deployed:"):
            engine = item.partition(":")[2]
            if engine and engine not in DEPLOYED:
                raise SystemExit(f"--codecs {item}: no engine '{engine}'; use one of {', '.join(DEPLOYED)}")
            for entry in (c for e, cs in DEPLOYED.items() if engine in ("", e) for c in cs):
                name, _, widths = entry.partition("@")
                out += [(name, int(b)) for b in widths.split(",")]
            continue
        name, at, width = item.partition("@")
        if name not in known:
            raise SystemExit(f"--codecs: unknown codec '{name}' (see `harness list`)")
        if at and (not width.isdigit() or int(width) not in known[name]):
            raise SystemExit(f"--codecs {item}: '{name}' runs at {', '.join(map(str, known[name]))} bits")
        out += [(name, int(width))] if at else [(name, b) for b in bits if b in known[name]]
    return list(dict.fromkeys(out))


def fused_codecs() -> list[str]:
    """Every registered codec that declares a fused layout (:meth:`kernels.base.Codec.fused_layout`)."""
    return [n for n, bits in list_codecs().items()
            if bits and make_codec(n, bits[-1], 128).fused_layout() is not None]


def plan(args) -> list[str]:
    """``--plan``: the (codec, bits) rows the command times per (shape, batch, context), each with the kernel it
    takes (the Triton one that reads it, where that supports the shape; the table-lookup kernel is tried on the
    GPU as well) or why it is skipped; then the count of timed rows."""
    codecs = bench_codecs(args.codecs, parse_list(args.bits, int))
    lines, timed = [], 0
    for shape in parse_list(args.shapes):
        if shape not in SHAPES:
            raise SystemExit(f"Unknown shape '{shape}'. Available: {', '.join(SHAPES)}")
        Hq, Hkv, d = SHAPES[shape]
        for name, bits in codecs:
            codec = make_codec(name, bits, d, seed=0, layer=0, num_heads=Hkv)
            supports, launch = triton_path(codec)
            why = supports(codec, torch.bfloat16)
            kernel = f"{launch.__module__.rpartition('.')[2]}" if why is None else f"skip: {why}"
            timed += why is None
            lines.append(f"{shape} {name}@{bits}: {kernel}")
    n = timed * len(parse_list(args.batch, int)) * len(parse_list(args.contexts, parse_ctx))
    return lines + [f"{n} rows timed (each beside bf16 SDPA at its batch and context)"]
