"""``harness bench``'s encode table: fused encoders (:func:`kernels.triton.encoders.fused_encoder`)
against the codec's PyTorch reference, vectors per second and how many of the stored bytes agree."""
from __future__ import annotations

import torch

from kernels import make_codec

from harness.bench.timing import time_eager

ENCODE_HEADS, ENCODE_DIM = 4, 128  # the geometry the encode table times (Qwen2.5-7B's KV heads)


def bench_encode(codec_name, bits, Hkv, d, tokens, dev, rep_ms) -> dict | None:
    """Fused encoder vs the PyTorch reference on [1, Hkv, tokens, d] bf16 keys; None when no fused
    encoder writes this codec's state."""
    from kernels.triton.encoders import encoder_unsupported, fused_encoder

    codec = make_codec(codec_name, bits, d, seed=0, layer=0, num_heads=Hkv, device=dev)
    if encoder_unsupported(codec, dev) is not None:
        return None
    # the reference: the same codec forced onto the PyTorch path ('auto' would take the fused one on CUDA)
    ref = make_codec(codec_name, bits, d, seed=0, layer=0, num_heads=Hkv, device=dev, backend="torch")
    fused = fused_encoder(codec.fused_layout())
    k = torch.randn(1, Hkv, tokens, d, device=dev).to(torch.bfloat16)
    a, b = fused(codec, k), ref.encode(k)
    same = {f: float((a.tensors[f] == b.tensors[f]).float().mean())
            for f in a.tensors if a.tensors[f].dtype == torch.uint8}
    t_fused = time_eager(lambda: fused(codec, k), rep_ms)
    t_ref = time_eager(lambda: ref.encode(k), rep_ms)
    n = Hkv * tokens
    return {"codec": codec_name, "bits": bits, "vectors": n, "fused_s": t_fused, "torch_s": t_ref,
            "fused_vec_per_s": n / t_fused, "torch_vec_per_s": n / t_ref, "speedup": t_ref / t_fused,
            "bytes_equal_frac": same}


def encode_line(r: dict) -> str:
    """The line ``harness bench`` prints for one encode row."""
    return (f"encode {r['codec']}@{r['bits']}: fused {r['fused_vec_per_s'] / 1e6:.1f} M vec/s, torch "
            f"{r['torch_vec_per_s'] / 1e6:.2f} M vec/s ({r['speedup']:.0f}x), bytes equal {r['bytes_equal_frac']}")


def encode_rows(rows: list, codecs: list[str], bits: list[int], tokens: int, dev, rep_ms: int) -> None:
    """Append to ``rows`` (bench.json's "encode") one row per codec and bits that a fused encoder
    writes, printing each as it is measured."""
    for name in codecs:
        for b in bits:
            r = bench_encode(name, b, ENCODE_HEADS, ENCODE_DIM, tokens, dev, rep_ms)
            if r is None:
                continue
            rows.append(r)
            print(encode_line(r), flush=True)
