"""The per-token fused decode attention (kernels/triton/token_attention.py) over the engines' presets,
against the PyTorch reference (kernels.attention.decode_attention_torch: the preset's own dequantization,
then float32 attention).

Runs on CUDA when present, else on the CPU under TRITON_INTERPRET=1 (small shapes). The kernel scores
exact fp16 codes on tensor cores and rounds each value to fp16 once, so outputs agree to five fp16
roundings of a term, to first order (tests/helpers/decode_checks.py: ``out_rtol``), and log-sum-exps to the
bound of their largest score's rounding (``lse_atol``).
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
from kernels.attention import decide_attention, decode_attention, decode_attention_torch  # noqa: E402
from kernels.registry import CODECS  # noqa: E402

for _m in ("kernels.triton.combine", "kernels.triton.token_attention"):
    if _m in sys.modules and not CUDA:  # compiled before TRITON_INTERPRET was set
        importlib.reload(sys.modules[_m])
from kernels.triton.token_attention import decode_attention_fused, supports  # noqa: E402
from helpers.decode_checks import lse_atol, out_rtol, ref_lse, rel_err  # noqa: E402
from helpers.tolerances import U16, sum_rel  # noqa: E402

DEV = "cuda" if CUDA else "cpu"
ENGINE = sorted(n for n, cls in CODECS.items() if getattr(cls, "engine_preset", False))
BITS = {n: CODECS[n].bits_supported[0] for n in ENGINE}
# transformers' quantized cache attends through the model's own attention on what its layers dequantize
LIBRARY_CACHES = {"hf-quanto", "hf-hqq"}
PRESETS = [n for n in ENGINE if n not in LIBRARY_CACHES]


def _case(name, d=64, B=2, Hkv=2, G=3, T=45, W=5, seed=0, dtype=torch.float32, **options):
    if CODECS[name].head_dim_unsupported(d) is not None:  # mlx-g128: groups of 128
        d = 128
    g = torch.Generator().manual_seed(seed)
    codec = make_codec(name, BITS[name], d, num_heads=Hkv, device=DEV, **options)
    k = torch.randn(B, Hkv, T, d, generator=g) * (1 + torch.rand(B, Hkv, T, 1, generator=g) * 3)
    v = torch.randn(B, Hkv, T, d, generator=g) + 0.5
    q = (torch.randn(B, Hkv * G, 1, d, generator=g) * 2).to(dtype)
    ks, vs = codec.encode(k.to(DEV)), codec.encode_values(v.to(DEV))
    wk = torch.randn(B, Hkv, W, d, generator=g).to(dtype).to(DEV) if W else None
    wv = torch.randn(B, Hkv, W, d, generator=g).to(dtype).to(DEV) if W else None
    return codec, q.to(DEV), ks, vs, wk, wv


def test_every_engine_preset_but_transformers_cache_declares_a_token_layout():
    assert len(PRESETS) >= 13
    for name in ENGINE:
        codec = make_codec(name, BITS[name], 128)
        assert (supports(codec) is None) == (name in PRESETS), name


@pytest.mark.parametrize("name", PRESETS)
def test_preset_matches_reference(name):
    """Output and log-sum-exp (the scores) of every preset, with GQA, a native window and ragged lengths."""
    codec, q, ks, vs, wk, wv = _case(name, seed=len(name))
    lengths = torch.tensor([45, 30], dtype=torch.int32, device=DEV)
    out, lse = decode_attention_fused(q, ks, vs, codec, wk, wv, lengths, return_lse=True)
    ref = decode_attention_torch(q, ks, vs, codec, wk, wv, lengths)
    assert out.shape == q.shape and out.dtype == q.dtype and torch.isfinite(out).all()
    assert rel_err(out, ref) < out_rtol(torch.float32)
    d = q.shape[-1]
    want = ref_lse(q, ks, codec, wk, lengths, 1 / math.sqrt(d))
    assert ((lse - want).abs() <= lse_atol(q, codec.decode(ks), 1 / math.sqrt(d), wk)).all()


@pytest.mark.parametrize("name", ["vllm-fp8", "sglang-fp8-e5m2"])
def test_per_tensor_scales(name):
    """Checkpoint scales multiply every key and value (a constant, not a field)."""
    codec, q, ks, vs, wk, wv = _case(name, W=0, k_scale=0.25, v_scale=3.0)
    out = decode_attention_fused(q, ks, vs, codec)
    assert rel_err(out, decode_attention_torch(q, ks, vs, codec)) < out_rtol(torch.float32)


@pytest.mark.parametrize("name", ["vllm-int4-per-token-head", "vllm-turboquant-3bit-nc"])
@pytest.mark.parametrize("d, dtype", [(128, torch.bfloat16), (32, torch.float16)])
def test_head_dims_and_dtypes(name, d, dtype):
    codec, q, ks, vs, wk, wv = _case(name, d=d, B=1, G=7, T=70, W=8, seed=d, dtype=dtype)
    out = decode_attention_fused(q, ks, vs, codec, wk, wv)
    ref = decode_attention_torch(q, ks, vs, codec, wk, wv)
    assert out.dtype == dtype and rel_err(out, ref) < out_rtol(dtype)


def test_splits_agree():
    """One split or many: the merge by log-sum-exp gives the same attention."""
    codec, q, ks, vs, wk, wv = _case("vllm-int8-per-token-head", B=1, T=200, W=0)
    one = decode_attention_fused(q, ks, vs, codec, num_splits=1)
    many = decode_attention_fused(q, ks, vs, codec, num_splits=4)
    # each side's partial outputs rounded to fp16 once, its fp32 softmax sums over 200 tokens in another order
    assert rel_err(one, many) < 2 * U16 + sum_rel(200)


def test_dispatch_sends_presets_to_the_token_kernel():
    """On a CUDA device 'auto' picks the Triton path for a preset (the table-lookup kernel refuses it), and
    decode_attention with backend='triton' runs the per-token kernel."""
    codec, q, ks, vs, wk, wv = _case("vllm-fp8-per-token-head", W=0)
    decision = decide_attention(q, codec, 2, "auto", device="cuda")
    assert decision.path == "triton" and decision.reason("lut") is not None
    out = decode_attention(q, ks, vs, codec, backend="triton")
    torch.testing.assert_close(out, decode_attention_fused(q, ks, vs, codec), rtol=0, atol=0)
    assert "no per-token fused kernel" in supports(make_codec("kivi", 2, 64))


@pytest.mark.parametrize("name", ["llamacpp-q4_1", "llamacpp-q5_0", "llamacpp-q5_1"])
def test_ggml_nibble_halves_and_fifth_bits_unrotated(name):
    """ggml's code order (byte j of a block: coordinates j and j + 16) and q5's fifth bits (``qh``) read in place,
    without llama.cpp's rotation to mix coordinates: an error in either moves a coordinate's value."""
    codec, q, ks, vs, wk, wv = _case(name, B=1, T=40, W=0, seed=3, rotate=False)
    assert codec.token_layout().keys.rotation is None
    out = decode_attention_fused(q, ks, vs, codec)
    assert rel_err(out, decode_attention_torch(q, ks, vs, codec)) < out_rtol(torch.float32)
