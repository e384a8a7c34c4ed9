"""Table-lookup OCTOPUS decode attention (kernels/cuda/decode_lut.py) against the PyTorch reference
(kernels.attention.decode_attention_torch).

CPU: the direction tables and the index the kernel takes from the stored fused triplet codes rebuild
the reference's rotated keys (fp16 table entries: ~2e-4 relative), and :func:`supports` refuses
what the kernel does not cover. GPU (sm_90 and CuPy; skipped elsewhere): the kernel itself, at
2/3/4 bits, fused and unfused tables, head dims 64/128, GQA groups 1-8, batches with per-sequence
lengths (an empty one too), windows with per-sequence lengths, fp32/fp16/bf16 queries, many
splits and a partial last tile. Tolerances as tests/kernels/triton/test_triton_decode_attention.py: fp16
tensor-core operands (keys, query features, probabilities, P * scale) put the fp32-query output
within ~1e-3 of the fp32 reference; bf16/fp16 outputs add their own rounding.
"""
from __future__ import annotations

import math

import pytest
import torch

from kernels import make_codec
from kernels.attention import decode_attention_torch
from kernels.cuda.decode_lut import default_config, lut_tables, supports, table_keys
from decode_checks import LUT_GPU_SKIP as GPU_SKIP, lut_gpu as gpu, ref_lse as _ref_lse, rel_err as _rel

OUT_TOL = {torch.float32: 2e-3, torch.float16: 3e-3, torch.bfloat16: 8e-3}


# ---------------------------------------------------------------------------------------------
# CPU: tables and index
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bits", [2, 3, 4])
@pytest.mark.parametrize("fused", [True, False])
def test_table_rebuilds_reference_keys(bits, fused):
    g = torch.Generator().manual_seed(bits)
    codec = make_codec("octopus", bits, 128, seed=1, num_heads=2)
    k = torch.randn(2, 2, 37, 128, generator=g) * (1 + torch.rand(2, 2, 37, 1, generator=g) * 3)
    st = codec.encode(k)
    ref = codec.stage.decode_rotated(st.tensors)
    layout = codec.fused_layout()
    got = table_keys(layout, st.tensors, fused)
    err = float((got - ref).norm() / ref.norm())
    assert err < 6e-4, err  # fp16 entries (one rounding fused, two unfused)
    # every table entry is finite and the 4th slot (the MMA's padding column) is zero
    tab, rho = lut_tables(layout, fused)
    assert torch.isfinite(tab.float()).all() and torch.equal(tab[:, 3], torch.zeros_like(tab[:, 3]))
    assert tab.shape[0] == 1 << (2 * codec.stage.b_u + (codec.stage.b_r if fused else 0))


def test_tables_read_the_declared_codebooks():
    """The tables come from the layout's codebooks, not from the codec: other centroids, other table."""
    import dataclasses

    layout = make_codec("octopus", 3, 128).fused_layout()
    c, rho = layout.codebooks
    other = dataclasses.replace(layout, codebooks=(c * 0.5, rho * 2))
    t1, r1 = lut_tables(layout, True)
    t2, r2 = lut_tables(other, True)
    assert torch.allclose(r2.float(), 2 * r1.float(), rtol=1e-3) and not torch.equal(t1, t2)


def test_default_config_fits_shared_memory():
    for bits in (2, 3, 4):
        cfg = default_config(make_codec("octopus", bits, 128))
        st = make_codec("octopus", bits, 128).stage
        entries = 1 << (2 * st.b_u + (st.b_r if cfg["fused"] else 0))
        assert entries * 8 * cfg["copies"] <= 32 * 1024


def test_supports_reasons():
    assert "octahedral keys" in supports(make_codec("turboquant-mse", 3, 128))
    assert "QJL residual" in supports(make_codec("octopus-qjl", 3, 128))
    assert "no fused layout" in supports(make_codec("kivi", 2, 128))
    assert "value quantizer" in supports(make_codec("octopus", 3, 128, value_group=64))
    assert "at most 8" in supports(make_codec("octopus", 3, 128), G=16)
    assert "head_dim" in supports(make_codec("octopus", 3, 96))
    assert "split" in supports(make_codec("octopus", 3, 128, split=(6, 2)))
    if not torch.cuda.is_available():
        assert "CUDA device" in supports(make_codec("octopus", 3, 128), device="cpu")
    assert "rotation has 2 heads" in supports(make_codec("octopus", 3, 128, num_heads=2), Hkv=4)


def test_renamed_codec_gets_the_kernel():
    """The kernel reads the declared layout, never the codec's name."""
    from kernels.octopus import Octopus

    class Renamed(Octopus):
        name = "renamed-octahedral"

    codec = make_codec("octopus", 3, 128)
    codec.__class__ = Renamed
    assert supports(codec) is None


# ---------------------------------------------------------------------------------------------
# GPU: the kernel
# ---------------------------------------------------------------------------------------------
def _case(bits, d, B, Hkv, G, T, W, seed=0, dtype=torch.bfloat16, q_scale=2.0, num_heads=None, **kw):
    g = torch.Generator().manual_seed(seed)
    codec = make_codec("octopus", bits, d, seed=seed, layer=1, num_heads=Hkv if num_heads is None else num_heads,
                       device="cuda", **kw)
    k = torch.randn(B, Hkv, T, d, generator=g) * (1 + torch.rand(B, Hkv, T, 1, generator=g) * 3)
    v = torch.randn(B, Hkv, T, d, generator=g) + torch.rand(B, Hkv, T, 1, generator=g) * 2
    q = (torch.randn(B, Hkv * G, 1, d, generator=g) * q_scale).to(dtype)
    ks, vs = codec.encode(k.cuda()), codec.encode_values(v.cuda())
    wk = torch.randn(B, Hkv, W, d, generator=g).to(dtype).cuda() if W else None
    wv = torch.randn(B, Hkv, W, d, generator=g).to(dtype).cuda() if W else None
    return codec, q.cuda(), ks, vs, wk, wv


def _lut(*a, **kw):
    from kernels.cuda.decode_lut import decode_attention_lut

    return decode_attention_lut(*a, **kw)


@gpu
@pytest.mark.parametrize("bits", [2, 3, 4])
@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("merge", ["kernel", "launch"])
def test_bits_and_tables(bits, fused, merge):
    """Qwen-like group of 7, two sequences of different lengths, a window; output and lse; the
    splits merged in the kernel (last CTA) or by the separate combine launch."""
    codec, q, ks, vs, wk, wv = _case(bits, 128, B=2, Hkv=2, G=7, T=1000, W=24, seed=bits, dtype=torch.float32)
    lengths = torch.tensor([1000, 613], dtype=torch.int32, device="cuda")
    cfg = {"fused": fused, "copies": 4 if fused and bits >= 3 else default_config(codec)["copies"], "merge": merge}
    if fused and bits == 4:
        cfg["copies"] = 1  # 8192 entries: one copy (64 KB)
    out, lse = _lut(q, ks, vs, codec, wk, wv, lengths, return_lse=True, config=cfg)
    ref = decode_attention_torch(q, ks, vs, codec, wk, wv, lengths)
    assert torch.isfinite(out).all()
    assert _rel(out, ref) < OUT_TOL[torch.float32], _rel(out, ref)
    ref_lse = _ref_lse(q, ks, codec, wk, lengths, 1 / math.sqrt(128))
    assert (lse - ref_lse).abs().max() < 2e-3 * ref_lse.abs().max().clamp_min(1)


@gpu
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("G", [1, 3, 8])
def test_head_dims_dtypes_groups(d, dtype, G):
    codec, q, ks, vs, wk, wv = _case(3, d, B=1, Hkv=3, G=G, T=333, W=8, seed=d + G, dtype=dtype)
    out = _lut(q, ks, vs, codec, wk, wv)
    ref = decode_attention_torch(q, ks, vs, codec, wk, wv)
    assert out.dtype == dtype and out.shape == q.shape
    assert _rel(out, ref) < OUT_TOL[dtype], _rel(out, ref)


@gpu
def test_batch_lengths_and_window_lengths():
    """Per-sequence lengths (an empty prefix, one inside the first tile) and window lengths."""
    codec, q, ks, vs, wk, wv = _case(2, 128, B=4, Hkv=2, G=4, T=147, W=6, seed=7, dtype=torch.float32)
    lengths = torch.tensor([147, 0, 5, 100], dtype=torch.int32, device="cuda")
    wlen = torch.tensor([6, 2, 0, 3], dtype=torch.int32, device="cuda")
    out = _lut(q, ks, vs, codec, wk, wv, lengths, wlen)
    ref = decode_attention_torch(q, ks, vs, codec, wk, wv, lengths, window_lengths=wlen)
    assert _rel(out, ref) < OUT_TOL[torch.float32]
    out2 = _lut(q, ks, vs, codec, None, None, torch.tensor([147, 0, 5, 100], device="cuda"))
    ref2 = decode_attention_torch(q, ks, vs, codec, None, None, lengths)
    assert torch.equal(out2[1], torch.zeros_like(out2[1]))  # nothing to attend -> zeros
    assert _rel(out2, ref2) < OUT_TOL[torch.float32]


@gpu
@pytest.mark.parametrize("splits", [1, 7, 200])
def test_splits_shared_rotation_and_odd_lengths(splits):
    """One split, a few, more splits than tiles; a codec with one shared rotation; T not a
    multiple of 16 (a partial last tile whose tail bytes are garbage)."""
    codec, q, ks, vs, wk, wv = _case(4, 128, B=1, Hkv=2, G=2, T=16 * 70 - 5, W=4, seed=11,
                                     dtype=torch.float32, num_heads=1)
    out = _lut(q, ks, vs, codec, wk, wv, num_splits=splits)
    ref = decode_attention_torch(q, ks, vs, codec, wk, wv)
    assert _rel(out, ref) < OUT_TOL[torch.float32]


@gpu
@pytest.mark.parametrize("cfg", [{"num_warps": 2, "stages": 2}, {"num_warps": 8, "stages": 3, "mt": 2},
                                 {"mt": 2}])
def test_launch_configs(cfg):
    codec, q, ks, vs, wk, wv = _case(3, 128, B=2, Hkv=2, G=7, T=2000, W=16, seed=5)
    out = _lut(q, ks, vs, codec, wk, wv, [2000, 1377], config=cfg)
    ref = decode_attention_torch(q, ks, vs, codec, wk, wv, [2000, 1377])
    assert _rel(out, ref) < OUT_TOL[torch.bfloat16]


@gpu
def test_value_bits_independent_of_key_bits():
    for bits, vb in ((3, 2), (2, 4), (4, 3)):
        codec, q, ks, vs, wk, wv = _case(bits, 128, B=1, Hkv=1, G=5, T=500, W=3, seed=vb, dtype=torch.float32,
                                         value_bits=vb)
        out = _lut(q, ks, vs, codec, wk, wv)
        ref = decode_attention_torch(q, ks, vs, codec, wk, wv)
        assert _rel(out, ref) < OUT_TOL[torch.float32], (bits, vb)


@gpu
def test_unaligned_field_views():
    """States sliced out of a larger cache (fields not 16-byte aligned per (batch, head)): the
    kernel reads rows at any byte offset."""
    from kernels.base import Encoded

    codec, q, ks, vs, wk, wv = _case(3, 128, B=2, Hkv=3, G=2, T=301, W=0, seed=3, dtype=torch.float32)
    T = 299
    ks2 = Encoded({k: t[..., :T, :].contiguous() for k, t in ks.tensors.items()}, (2, 3, T, 128), ks.dtype)
    vs2 = Encoded({k: t[..., :T, :].contiguous() for k, t in vs.tensors.items()}, (2, 3, T, 128), vs.dtype)
    out = _lut(q, ks2, vs2, codec)
    ref = decode_attention_torch(q, ks2, vs2, codec)
    assert _rel(out, ref) < OUT_TOL[torch.float32]


@gpu
@pytest.mark.parametrize("merge", ["kernel", "launch"])
def test_merge_many_splits_long_window_repeated(merge):
    """More splits than one merge pass (128) and a window longer than one pass (32 tokens): the
    in-kernel merge's chunked loops; repeated calls give the same output (the arrival counters are
    reset by the kernel)."""
    codec, q, ks, vs, wk, wv = _case(3, 128, B=2, Hkv=2, G=7, T=16 * 300 - 3, W=70, seed=13)
    lengths = [16 * 300 - 3, 2222]
    wlen = torch.tensor([70, 33], dtype=torch.int32, device="cuda")
    cfg = {"merge": merge}
    out, lse = _lut(q, ks, vs, codec, wk, wv, lengths, wlen, num_splits=300, return_lse=True, config=cfg)
    out2 = _lut(q, ks, vs, codec, wk, wv, lengths, wlen, num_splits=300, config=cfg)
    out3 = _lut(q, ks, vs, codec, wk, wv, lengths, wlen, config=cfg)
    ref = decode_attention_torch(q, ks, vs, codec, wk, wv, lengths, window_lengths=wlen)
    assert torch.equal(out, out2)
    assert _rel(out, ref) < OUT_TOL[torch.bfloat16], _rel(out, ref)
    assert _rel(out3, ref) < OUT_TOL[torch.bfloat16], _rel(out3, ref)
