"""vLLM's KV-cache dtypes as codecs (kernels/vllm_kv.py), against independent references: fp8 against
torch's own dtype casts and a numpy rounding from the format's definition, the stored bytes against
vLLM's layout, the per-token-head arithmetic (float32, int8 truncated) and int4's zero point hidden in
the scale's mantissa, against numpy."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from distortion_refs import fp8_round  # noqa: E402

from kernels import make_codec  # noqa: E402
from kernels.vllm_kv import hadamard, rht_signs  # noqa: E402

PRESETS = {"vllm-fp8": 8, "vllm-fp8-e5m2": 8, "vllm-fp8-per-token-head": 8, "vllm-int8-per-token-head": 8,
           "vllm-int4-per-token-head": 4}


def _keys(n=64, d=128, seed=0, scale=1.0):
    return torch.randn(2, 2, n, d, generator=torch.Generator().manual_seed(seed)) * scale


@pytest.mark.parametrize("name, kind", [("vllm-fp8", "e4m3"), ("vllm-fp8-e5m2", "e5m2")])
def test_fp8_per_tensor_is_the_saturating_cast(name, kind):
    """Values through the whole range: subnormals, ties, the largest finite value and beyond (saturated)."""
    dtype = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}[kind]
    top = torch.finfo(dtype).max
    x = torch.cat([_keys(8, 128, seed=1, scale=s).flatten() for s in (1e-3, 0.05, 1.0, 30.0, top / 4)]
                  + [torch.tensor([top, 2 * top, -3 * top, 2.0 ** -9, 2.0 ** -10, 1.0625, 1.1875])])
    x = x[: (x.numel() // 128) * 128].reshape(1, 1, -1, 128)
    c = make_codec(name, 8, 128)
    got = c.decode(c.encode(x))
    torch.testing.assert_close(got, x.clamp(-top, top).to(dtype).float(), rtol=0, atol=0)  # torch's cast
    np.testing.assert_array_equal(got.double().numpy(), fp8_round(x.double().numpy(), kind))  # the definition
    assert c.encode(x).nbytes() == x.numel()  # one byte a coordinate: the per-layer scales are not per token


def test_fp8_per_tensor_scales_divide_on_the_way_in():
    x = _keys(seed=2) * 1000  # beyond e4m3's 448 without a scale
    c = make_codec("vllm-fp8", 8, 128, k_scale=4.0, v_scale=8.0)
    np.testing.assert_array_equal(c.decode(c.encode(x)).double().numpy(), 4.0 * fp8_round(x.double().numpy() / 4.0,
                                                                                          "e4m3"))
    np.testing.assert_array_equal(c.decode_values(c.encode_values(x)).double().numpy(),
                                  8.0 * fp8_round(x.double().numpy() / 8.0, "e4m3"))


@pytest.mark.parametrize("name", ["vllm-int8-per-token-head", "vllm-fp8-per-token-head"])
def test_per_token_head_layout_and_arithmetic(name):
    x = _keys(seed=3, scale=2.0)
    c = make_codec(name, 8, 128, num_heads=2)
    s = c.encode(x)
    codes, scale = s.tensors["codes"], s.tensors["scale"]
    assert codes.shape == (2, 2, 64, 128) and codes.dtype == torch.uint8 and scale.shape == (2, 2, 64, 1)
    assert scale.dtype == torch.float32 and s.nbytes() == x.numel() + 4 * x[..., 0].numel()  # d bytes + fp32 scale
    xs = x.numpy().astype(np.float32)
    qmax = np.float32(127.0 if "int8" in name else 448.0)
    ref_scale = np.maximum(np.abs(xs).max(-1, keepdims=True) / qmax, np.float32(1e-6))
    np.testing.assert_array_equal(scale.numpy(), ref_scale)
    y = np.clip(xs * (np.float32(1) / ref_scale), -128 if "int8" in name else -qmax, qmax)
    if "int8" in name:  # Triton's float-to-int8 store truncates toward zero
        np.testing.assert_array_equal(codes.view(torch.int8).numpy(), np.trunc(y).astype(np.int8))
    else:
        np.testing.assert_array_equal(codes.view(torch.float8_e4m3fn).double().numpy(), fp8_round(y.astype(np.float64),
                                                                                                   "e4m3"))
    assert torch.equal(c.decode_values(c.encode_values(x)), c.decode(s))  # values are stored as keys are


def test_int8_truncates_where_rounding_would_go_up():
    x = torch.zeros(1, 1, 1, 128)
    x[..., 0], x[..., 1] = 127.0, 126.9  # scale 1: 126.9 stores as 126
    c = make_codec("vllm-int8-per-token-head", 8, 128)
    assert c.encode(x).tensors["codes"].view(torch.int8)[0, 0, 0, :2].tolist() == [127, 126]


def test_int4_rotation_zero_point_and_bytes():
    d = 128
    h = hadamard(torch.eye(d))
    assert torch.equal(h @ h, d * torch.eye(d))  # the unnormalized transform: H H = d I
    signs = rht_signs(d)
    assert set(signs.unique().tolist()) == {-1.0, 1.0} and torch.equal(rht_signs(d), signs)  # fixed by vLLM
    x = _keys(seed=4)
    c = make_codec("vllm-int4-per-token-head", 4, d, num_heads=2)
    s = c.encode(x)
    assert s.tensors["codes"].shape == (2, 2, 64, d // 2) and s.nbytes() == x[..., 0].numel() * (d // 2 + 4)
    # the rotation in float32 as the codec sums it (the transform itself is checked above); then numpy: quantize
    # asymmetric with an integer zero point, hide it in the scale's low mantissa bits
    y = hadamard(x * signs).numpy()
    lo, hi = y.min(-1, keepdims=True), y.max(-1, keepdims=True)
    scale = np.maximum((hi - lo) / np.float32(15), np.float32(1e-6))
    half_away = lambda v: np.sign(v) * np.floor(np.abs(v) + 0.5)  # noqa: E731
    zp = np.clip(half_away(-lo / scale), 0, 15)
    q = np.clip(half_away(y * (np.float32(1) / scale) + zp), 0, 15).astype(np.uint8)
    packed = s.tensors["codes"].numpy()
    np.testing.assert_array_equal(packed & 15, q[..., 0::2])
    np.testing.assert_array_equal(packed >> 4, q[..., 1::2])
    bits = s.tensors["scale"].numpy().view(np.int32)
    np.testing.assert_array_equal(bits & 15, zp.astype(np.int32))
    np.testing.assert_array_equal(bits & -16, scale.view(np.int32) & -16)
    # decode: (q - zp) * scale (its low bits cleared), rotated back: s H y / d
    y_hat = (q.astype(np.float64) - zp) * (bits & -16).view(np.float32)
    ref = (y_hat @ h.numpy().T) * signs.numpy() / d
    np.testing.assert_allclose(c.decode(s).double().numpy(), ref, rtol=1e-5, atol=1e-5)


def test_int4_refuses_a_head_dim_vllm_cannot_rotate():
    with pytest.raises(ValueError, match="power-of-2 head dim, got 80"):
        make_codec("vllm-int4-per-token-head", 4, 80)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_value_bits_are_the_presets_own(name):
    make_codec(name, PRESETS[name], 128, value_bits=PRESETS[name])
    with pytest.raises(ValueError, match="stores values as vLLM does"):
        make_codec(name, PRESETS[name], 128, value_bits=2)
