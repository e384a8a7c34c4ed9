"""Fused decode attention (kernels/triton/decode_attention.py) against the PyTorch reference
(kernels.attention.decode_attention_torch, i.e. codec.score + codec.decode_values).

Runs on CUDA when present, else on the CPU under TRITON_INTERPRET=1 (small shapes).
Tolerances (tests/helpers/decode_checks.py): the kernel feeds fp16 tensor-core dots (rotated query,
reconstructed keys, probabilities, values) and stores each split's partial output in fp16, so the
output is within five fp16 roundings of a term, to first order, of the reference's, plus each
side's rounding to the output dtype (``out_rtol``);
the log-sum-exp within the bound of its largest score's fp16 rounding (``lse_atol``).
"""
from __future__ import annotations

import importlib
import math
import os
import sys

import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
triton = pytest.importorskip("triton")

from kernels import make_codec  # noqa: E402
from kernels.attention import decode_attention, decode_attention_torch  # noqa: E402

# a module imported before TRITON_INTERPRET was set holds compiled (not interpreted) kernels
for _m in ("kernels.triton._common", "kernels.triton._unpack", "kernels.triton.combine",
           "kernels.triton.decode_attention"):
    if _m in sys.modules and not CUDA:
        importlib.reload(sys.modules[_m])
from kernels.triton.decode_attention import decode_attention_fused  # noqa: E402
from helpers.decode_checks import lse_atol, out_rtol, ref_lse as _ref_lse, rel_err as _rel, score_keys  # noqa: E402

DEV = "cuda" if CUDA else "cpu"
FUSED = ("octopus", "octopus-qjl", "turboquant-mse", "turboquant-prod")
OUT_TOL = {dtype: out_rtol(dtype) for dtype in (torch.float32, torch.float16, torch.bfloat16)}  # 2.4e-3, 3.4e-3, 1.0e-2


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _case(name, bits, d, B, Hkv, G, T, W, seed=0, dtype=torch.bfloat16, q_scale=2.0, num_heads=None):
    g = _gen(seed)
    codec = make_codec(name, bits, d, seed=seed, layer=1, num_heads=Hkv if num_heads is None else num_heads,
                       device=DEV)
    k = torch.randn(B, Hkv, T, d, generator=g)
    k = k * (1 + torch.rand(B, Hkv, T, 1, generator=g) * 3)  # keys of varied norms
    v = torch.randn(B, Hkv, T, d, generator=g)
    q = (torch.randn(B, Hkv * G, 1, d, generator=g) * q_scale).to(dtype)
    ks = codec.encode(k.to(DEV))
    vs = codec.encode_values(v.to(DEV))
    wk = torch.randn(B, Hkv, W, d, generator=g).to(dtype).to(DEV) if W else None
    wv = torch.randn(B, Hkv, W, d, generator=g).to(dtype).to(DEV) if W else None
    return codec, q.to(DEV), ks, vs, wk, wv


@pytest.mark.parametrize("name", FUSED)
@pytest.mark.parametrize("bits", [2, 3, 4])
def test_codecs_bits(name, bits):
    """Every fused codec at every bit width: output and log-sum-exp (i.e. the scores)."""
    codec, q, ks, vs, wk, wv = _case(name, bits, 64, B=2, Hkv=2, G=3, T=45, W=5, seed=bits, dtype=torch.float32)
    lengths = torch.tensor([45, 30], dtype=torch.int32)
    out, lse = decode_attention_fused(q, ks, vs, codec, wk, wv, lengths.to(DEV), return_lse=True)
    ref = decode_attention_torch(q, ks, vs, codec, wk, wv, lengths.to(DEV))
    assert out.shape == q.shape and out.dtype == q.dtype
    assert torch.isfinite(out).all()
    assert _rel(out, ref) < OUT_TOL[torch.float32]
    ref_lse = _ref_lse(q, ks, codec, wk, lengths.to(DEV), 1 / math.sqrt(64))
    assert ((lse - ref_lse).abs() <= lse_atol(q, score_keys(codec, ks), 1 / math.sqrt(64), wk)).all()


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", ["octopus", "turboquant-prod"])
def test_head_dims_dtypes(name, d, dtype):
    codec, q, ks, vs, wk, wv = _case(name, 3, d, B=1, Hkv=2, G=7, T=70, W=8, seed=d, dtype=dtype)
    out = decode_attention_fused(q, ks, vs, codec, wk, wv)
    ref = decode_attention_torch(q, ks, vs, codec, wk, wv)
    assert out.dtype == dtype
    assert _rel(out, ref) < OUT_TOL[dtype]


@pytest.mark.parametrize("G", [1, 4, 16])
def test_gqa_groups(G):
    """MHA (G=1), GQA, and a group that fills the whole padded tile."""
    codec, q, ks, vs, wk, wv = _case("octopus-qjl", 3, 64, B=1, Hkv=2, G=G, T=33, W=3, seed=G)
    out = decode_attention_fused(q, ks, vs, codec, wk, wv)
    ref = decode_attention_torch(q, ks, vs, codec, wk, wv)
    assert _rel(out, ref) < OUT_TOL[torch.bfloat16]


def test_batch_lengths_and_window_lengths():
    """Per-sequence lengths (including an empty prefix) and per-sequence window lengths."""
    codec, q, ks, vs, wk, wv = _case("octopus", 2, 64, B=3, Hkv=1, G=2, T=40, W=6, seed=7, dtype=torch.float32)
    lengths = torch.tensor([40, 0, 17], dtype=torch.int32, device=DEV)
    wlen = torch.tensor([6, 2, 0], dtype=torch.int32, device=DEV)
    out = decode_attention_fused(q, ks, vs, codec, wk, wv, lengths, wlen)
    ref = decode_attention_torch(q, ks, vs, codec, wk, wv, lengths, window_lengths=wlen)
    assert _rel(out, ref) < OUT_TOL[torch.float32]


def test_no_window_and_nothing_to_attend():
    codec, q, ks, vs, _, _ = _case("turboquant-mse", 2, 64, B=2, Hkv=1, G=1, T=20, W=0, seed=3, dtype=torch.float32)
    lengths = torch.tensor([20, 0], dtype=torch.int32, device=DEV)
    out = decode_attention_fused(q, ks, vs, codec, None, None, lengths)
    ref = decode_attention_torch(q, ks, vs, codec, None, None, lengths)
    assert torch.equal(out[1], torch.zeros_like(out[1]))  # an empty sequence attends nothing
    assert _rel(out[0], ref[0]) < OUT_TOL[torch.float32]


def test_many_splits_and_shared_rotation():
    """More splits than one combine pass (a full pass of 8 and a partial one), a last block cut short,
    and a codec built with num_heads=1 (every head shares the rotation)."""
    codec, q, ks, vs, wk, wv = _case("octopus", 3, 64, B=1, Hkv=1, G=2, T=64 * 12 - 5, W=4, seed=11,
                                     dtype=torch.float32, num_heads=1)
    out = decode_attention_fused(q, ks, vs, codec, wk, wv, num_splits=12, combine_block=8)
    ref = decode_attention_torch(q, ks, vs, codec, wk, wv)
    assert _rel(out, ref) < OUT_TOL[torch.float32]
    with pytest.raises(ValueError, match="multiple of 64"):
        decode_attention_fused(q, ks, vs, codec, wk, wv, block_n=16)


def test_large_query_norm_is_rescaled():
    """Queries whose rotated coordinates would overflow fp16 are scaled by a power of two."""
    codec, q, ks, vs, wk, wv = _case("turboquant-mse", 4, 64, B=1, Hkv=1, G=2, T=20, W=2, seed=5,
                                     dtype=torch.float32, q_scale=1e4)
    scale = 1e-4
    out = decode_attention_fused(q, ks, vs, codec, wk, wv, scale=scale)
    ref = decode_attention_torch(q, ks, vs, codec, wk, wv, scale=scale)
    assert torch.isfinite(out).all() and _rel(out, ref) < OUT_TOL[torch.float32]


def test_dispatch_backends(monkeypatch):
    codec, q, ks, vs, wk, wv = _case("octopus", 3, 64, B=1, Hkv=1, G=2, T=20, W=2, seed=2)
    ref = decode_attention_torch(q, ks, vs, codec, wk, wv)
    assert torch.equal(decode_attention(q, ks, vs, codec, wk, wv, backend="torch"), ref)
    fused = decode_attention(q, ks, vs, codec, wk, wv, backend="triton")
    assert _rel(fused, ref) < OUT_TOL[torch.bfloat16]
    monkeypatch.setenv("KVCODEC_BACKEND", "torch")
    assert torch.equal(decode_attention(q, ks, vs, codec, wk, wv), ref)
    monkeypatch.setenv("KVCODEC_BACKEND", "triton")
    assert _rel(decode_attention(q, ks, vs, codec, wk, wv), ref) < OUT_TOL[torch.bfloat16]
    with pytest.raises(ValueError, match="Unknown backend"):
        decode_attention(q, ks, vs, codec, wk, wv, backend="cuda")


def test_dispatch_falls_back_for_uncovered_codec():
    codec, q, ks, vs, wk, wv = _case("turboquant-mse", 5, 64, B=1, Hkv=1, G=1, T=10, W=2, seed=1)
    ref = decode_attention_torch(q, ks, vs, codec, wk, wv)
    assert torch.equal(decode_attention(q, ks, vs, codec, wk, wv, backend="auto"), ref)
    with pytest.raises(RuntimeError, match="code width 5"):
        decode_attention(q, ks, vs, codec, wk, wv, backend="triton")


@pytest.mark.parametrize("split,value_bits,value_group", [((6, 3), 8, 128), ((3, 0), 1, 32), ((5, 2), 2, 64)])
def test_octopus_splits_and_value_layouts(split, value_bits, value_group):
    """Code windows of 3 words (4 fused 15-bit triplet codes), no norm codes (b_r = 0), and value groups smaller than,
    equal to and larger than one 64-coordinate chunk, at 8, 1 and 2 value bits."""
    g = _gen(11)
    d, B, Hkv, G, T = 128, 2, 2, 3, 70
    codec = make_codec("octopus", 3, d, seed=3, layer=0, num_heads=Hkv, split=split, value_bits=value_bits,
                       value_group=value_group, device=DEV)
    k = torch.randn(B, Hkv, T, d, generator=g) * 2
    v = torch.randn(B, Hkv, T, d, generator=g) + torch.rand(B, Hkv, T, 1, generator=g) * 4  # offset groups
    q = torch.randn(B, Hkv * G, 1, d, generator=g).to(DEV)
    ks, vs = codec.encode(k.to(DEV)), codec.encode_values(v.to(DEV))
    out, lse = decode_attention_fused(q, ks, vs, codec, lengths=[T, 33], return_lse=True)
    ref = decode_attention_torch(q, ks, vs, codec, lengths=[T, 33])
    assert _rel(out, ref) < OUT_TOL[torch.float32]
    ref_lse = _ref_lse(q, ks, codec, None, [T, 33], 1 / math.sqrt(d))
    assert ((lse - ref_lse).abs() <= lse_atol(q, score_keys(codec, ks), 1 / math.sqrt(d))).all()


def test_value_group_smaller_than_a_word_falls_back():
    """1-bit values in groups of 16: one 32-bit word would span two scales, so the kernel declines."""
    codec = make_codec("octopus", 3, 64, seed=0, num_heads=1, value_bits=1, value_group=16, device=DEV)
    g = _gen(2)
    k, v = torch.randn(1, 1, 9, 64, generator=g).to(DEV), torch.randn(1, 1, 9, 64, generator=g).to(DEV)
    q = torch.randn(1, 2, 1, 64, generator=g).to(DEV)
    ks, vs = codec.encode(k), codec.encode_values(v)
    with pytest.raises(RuntimeError, match="value group 16 at 1 bits"):
        decode_attention(q, ks, vs, codec, backend="triton")
    assert torch.equal(decode_attention(q, ks, vs, codec), decode_attention_torch(q, ks, vs, codec))


@pytest.mark.skipif(not CUDA, reason="counts compiled kernels (the interpreter compiles nothing)")
def test_growing_cache_compiles_each_kernel_once():
    """A decode loop grows T by one token per step: lengths are run-time values, so the kernels are
    not recompiled when T, the split count or the field sizes cross a multiple of 16."""
    from kernels.triton import combine, decode_attention as da

    codec, q, ks, vs, wk, wv = _case("octopus", 3, 64, B=1, Hkv=2, G=2, T=1200, W=3, seed=4)

    def variants(fn):
        return sum(len(c[0]) for c in fn.device_caches.values())

    decode_attention_fused(q, _tail_state(ks, 1000), _tail_state(vs, 1000), codec, wk, wv)
    before = (variants(da._split_kernel), variants(combine._combine_kernel))
    for T in range(1001, 1200, 7):
        decode_attention_fused(q, _tail_state(ks, T), _tail_state(vs, T), codec, wk, wv)
    assert (variants(da._split_kernel), variants(combine._combine_kernel)) == before


def _tail_state(state, T):
    """The first T tokens of an encoded state, as a fresh contiguous state."""
    from kernels import Encoded

    return Encoded({k: t[..., :T, :].contiguous() for k, t in state.tensors.items()},
                   tuple(state.shape[:-2]) + (T, state.shape[-1]), state.dtype)
