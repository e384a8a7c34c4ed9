"""LMDeploy's TurboMind and TensorRT-LLM caches as codecs (kernels/engines/lmdeploy.py, trtllm.py) against numpy
written from their kernels (helpers/engine_refs.py: TurboMind's half-precision steps, each correctly rounded), the
int4 nibble order, the int8 and fp8 roundings, and the byte counts."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import engine_refs as E
from helpers.distortion_refs import fp8_round

from kernels import make_codec
from kernels.engines.lmdeploy import pack_u4


def _keys(n=24, d=128, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 2, n, d, generator=g) * (0.05 + 3 * torch.rand(2, 2, n, 1, generator=g))
    x[0, 0, 0] = 0.5  # a constant token-head: scale 0, 1 / 0, code 0
    return x.to(dtype)


@pytest.mark.parametrize("name, bits", [("lmdeploy-int8", 8), ("lmdeploy-int4", 4)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_turbomind_codes_scale_zero(name, bits, dtype):
    x = _keys(dtype=dtype)
    half = "bfloat16" if dtype == torch.bfloat16 else "float16"  # 'auto': a float32 model runs in float16
    c = make_codec(name, bits, 128)
    s = c.encode(x)
    q, scale, zero = E.turbomind(x.float().numpy(), bits, half)
    codes = s.tensors["codes"].numpy()
    if bits == 4:  # per 8 codes (v0|v2, v4|v6, v1|v3, v5|v7), the first of each pair low
        v = q.reshape(*q.shape[:-1], -1, 8)
        want = np.stack([v[..., a] | (v[..., b] << 4) for a, b in ((0, 2), (4, 6), (1, 3), (5, 7))], -1)
        np.testing.assert_array_equal(codes, want.reshape(codes.shape))
    else:
        np.testing.assert_array_equal(codes, q)
    assert s.tensors["scale"].dtype == getattr(torch, half)
    np.testing.assert_array_equal(s.tensors["scale"].float().numpy(), scale)
    np.testing.assert_array_equal(s.tensors["zero"].float().numpy(), zero)
    want = torch.from_numpy(E.turbomind_dequantized(q, scale, zero, half)).to(dtype)
    assert torch.equal(c.decode(s), want)
    assert s.nbytes() == x[..., 0].numel() * (128 * bits // 8 + 4) == c.expected_nbytes(tuple(x.shape))


def test_int4_pack_order():
    q = torch.arange(8, dtype=torch.uint8).reshape(1, 8)
    assert pack_u4(q).tolist() == [[0 | 2 << 4, 4 | 6 << 4, 1 | 3 << 4, 5 | 7 << 4]]


def test_half_precision_arithmetic_is_an_option():
    """dtype='float32' keeps every step in float32: other codes where the half roundings move a value across a
    rounding boundary, and a scale and zero of 4 bytes each."""
    x = _keys()
    half, full = make_codec("lmdeploy-int8", 8, 128), make_codec("lmdeploy-int8", 8, 128, dtype="float32")
    sh, sf = half.encode(x), full.encode(x)
    assert not torch.equal(sh.tensors["codes"], sf.tensors["codes"])
    assert sf.nbytes() - sh.nbytes() == x[..., 0].numel() * 4
    err = lambda c, s: float(((c.decode(s) - x) ** 2).sum())  # noqa: E731
    assert err(full, sf) < err(half, sh)  # float16's steps add their rounding to the 8-bit codes'


def test_trtllm_int8_rounds_to_nearest_even_and_saturates():
    x = torch.zeros(1, 1, 1, 128)
    x[..., :5] = torch.tensor([2.5, 3.5, -2.5, 200.0, -300.0])
    s = make_codec("trtllm-int8", 8, 128).encode(x)
    assert s.tensors["codes"].view(torch.int8)[0, 0, 0, :5].tolist() == [2, 4, -2, 127, -128]  # cvt.rni.sat.s8
    c = make_codec("trtllm-int8", 8, 128, kv_scale=0.05)
    y = _keys()
    want = np.clip(np.rint(y.numpy() * np.float32(1 / 0.05)), -128, 127) * 0.05
    np.testing.assert_allclose(c.decode(c.encode(y)).numpy(), want, rtol=1e-6)  # the float32 product once
    assert torch.equal(c.decode_values(c.encode_values(y)), c.decode(c.encode(y)))  # one scale for both


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_trtllm_fp8_scales_in_the_models_type(dtype):
    x = _keys(dtype=dtype) * 30
    c = make_codec("trtllm-fp8", 8, 128, kv_scale=3.0)
    s = c.encode(x)
    y = (x * torch.tensor(1 / 3.0).to(x.dtype if dtype != torch.float32 else torch.float32)).float().double().numpy()
    np.testing.assert_array_equal(s.tensors["codes"].view(torch.float8_e4m3fn).double().numpy(), fp8_round(y, "e4m3"))
    assert s.nbytes() == x.numel()


def test_trtllm_nvfp4_is_the_nvfp4_vllm_took_over():
    x = _keys()
    a, b = make_codec("trtllm-nvfp4", 4, 128, k_scale=2.0), make_codec("vllm-nvfp4", 4, 128, k_scale=2.0)
    sa, sb = a.encode(x), b.encode(x)
    assert all(torch.equal(sa.tensors[k], sb.tensors[k]) for k in sb.tensors) and sa.tensors.keys() == sb.tensors.keys()
