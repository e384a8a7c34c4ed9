"""mlx-lm's quantized cache as codecs (kernels/engines/mlx.py): codes, scales and biases against a numpy Metal
``affine_quantize`` (helpers/engine_refs.py) bit for bit, the packing and byte counts from the format, and against
mlx's own quantizer where it installs (its CPU backend, which differs from Metal only in the two places the
numpy reference names)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import engine_refs as E

import kernels.engines.mlx as mlx_codec
from kernels import make_codec
from kernels.packing import BitField

BITS = (2, 3, 4, 5, 6, 8)


def _keys(n=40, d=128, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 2, n, d, generator=g) * (0.05 + 3 * torch.rand(2, 2, n, 1, generator=g))
    x[0, 0, 0] = -x[0, 0, 0].abs() - 0.1  # every group negative: Metal's maximum is 0, not the group's
    x[0, 0, 1] = 0.0
    return x.to(dtype)


@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_codes_scales_and_bias_are_metals(group, bits, dtype):
    x = _keys(dtype=dtype)
    c = make_codec(f"mlx-g{group}", bits, 128)
    s = c.encode(x)
    q, scale, bias = E.mlx_affine(x.float().numpy(), group, bits, metal=True)
    np.testing.assert_array_equal(BitField(128, bits).unpack(s.tensors["codes"]).numpy(), q)
    assert s.tensors["scale"].dtype == dtype  # kept in the model's dtype, as mlx-lm allocates them
    np.testing.assert_array_equal(s.tensors["scale"].numpy(), scale.astype(x.numpy().dtype))
    np.testing.assert_array_equal(s.tensors["bias"].numpy(), bias.astype(x.numpy().dtype))
    # read back in float32 from the stored (model-dtype) scale and bias
    want = E.mlx_dequantized(q, s.tensors["scale"].float().numpy(), s.tensors["bias"].float().numpy(), group)
    np.testing.assert_array_equal(c.decode(s).float().numpy(), want.astype(x.numpy().dtype).astype(np.float32))
    side = 2 * 128 // group * x.element_size()
    assert s.nbytes() == x[..., 0].numel() * (128 * bits // 8 + side) == c.expected_nbytes(tuple(x.shape), dtype)


def test_codes_pack_least_significant_bits_first():
    """mlx's uint32 words (2, 4, 8 bits) and 3-, 5-, 6-bit packs of 8 are one little-endian bitstream."""
    x = _keys()
    for bits in BITS:
        codes = make_codec("mlx-g64", bits, 128).encode(x).tensors["codes"].numpy()
        q = E.mlx_affine(x.numpy(), 64, bits)[0]
        stream = np.unpackbits(codes, axis=-1, bitorder="little").reshape(*q.shape, bits)
        np.testing.assert_array_equal((stream * (1 << np.arange(bits))).sum(-1), q)


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_against_mlxs_own_quantizer(bits, dtype, monkeypatch):
    """mx.quantize on the CPU: the group's own maximum and ties to even. On groups with a positive value and with
    the codec rounding ties to even, the bytes are mlx's."""
    mx = pytest.importorskip("mlx.core")
    x = _keys(dtype=dtype)[:, :, 2:]  # groups with a positive value
    arr = mx.array(x.float().numpy()).astype(mx.float16 if dtype == torch.float16 else mx.float32)
    wq, sc, bi = mx.quantize(arr, group_size=64, bits=bits)
    monkeypatch.setattr(mlx_codec, "round_half_away", torch.round)  # the CPU backend's std::rint
    s = make_codec("mlx-g64", bits, 128).encode(x)
    np.testing.assert_array_equal(s.tensors["codes"].numpy(), np.array(wq).view(np.uint8).reshape(s.tensors["codes"].shape))
    np.testing.assert_array_equal(s.tensors["scale"].float().numpy(), np.array(sc.astype(mx.float32)))
    np.testing.assert_array_equal(s.tensors["bias"].float().numpy(), np.array(bi.astype(mx.float32)))


def test_metal_and_cpu_differ_where_named():
    """An all-negative group on [-2, -0.5]: Metal's maximum 0 spreads the 16 levels over [-2, 0] (scale 2 / 15), the
    CPU's over [-2, -0.5] (scale 0.1)."""
    x = -torch.linspace(0.5, 2.0, 64).reshape(1, 1, 1, 64)
    _, scale, _ = E.mlx_affine(x.numpy(), 64, 4, metal=True)
    _, scale_cpu, _ = E.mlx_affine(x.numpy(), 64, 4, metal=False)
    t = make_codec("mlx-g64", 4, 64).encode(x).tensors
    assert t["scale"].item() == scale.item() == np.float32(-2) / np.float32(-15)
    assert scale_cpu.item() == np.float32(0.1)


def test_quantized_kv_start_options():
    c = make_codec("mlx-g64", 4, 128)  # generate_step's default 0: the first call native, every later as stored
    assert c.native_tokens(0) is None and not c.stores_before_attending(0) and c.stores_before_attending(10)
    late = make_codec("mlx-g64", 4, 128, quantized_kv_start=5000)  # mlx_lm.generate's default
    assert late.native_tokens(4999) == 4999 and late.native_tokens(5000) is None
    assert not late.stores_before_attending(4999) and late.stores_before_attending(5000)
    with pytest.raises(ValueError, match=r"quantized_kv_start=-1: -1 is out of range \(0 <= value\)"):
        make_codec("mlx-g64", 4, 128, quantized_kv_start=-1)
