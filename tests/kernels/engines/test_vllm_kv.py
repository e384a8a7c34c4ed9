"""vLLM's KV-cache dtypes as codecs (kernels/engines/vllm_kv.py), against independent references: fp8 against
torch's own dtype casts and a numpy rounding from the format's definition, the stored bytes against
vLLM's layout, the per-token-head arithmetic (float32, int8 truncated) and int4's zero point hidden in
the scale's mantissa, against numpy."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from helpers.distortion_refs import fp8_round  # noqa: E402
from helpers.tolerances import U32, U64, gamma  # noqa: E402

from kernels import make_codec  # noqa: E402
from kernels.rotation import fwht as hadamard  # noqa: E402
from kernels.engines.vllm_kv import rht_signs  # noqa: E402

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
    # float32 against float64: y_hat's product (one rounding), the butterfly's log2(d) stages and the scaling,
    # each coordinate a signed sum of all d terms, so within gamma(log2 d + 3) of sum |y_hat| / d
    bound = gamma(d.bit_length() - 1 + 3) * np.abs(y_hat).sum(-1, keepdims=True) / d
    assert (np.abs(c.decode(s).double().numpy() - ref) <= bound).all()


def test_int4_refuses_a_head_dim_vllm_cannot_rotate():
    with pytest.raises(ValueError, match="power-of-2 head dim, got 80"):
        make_codec("vllm-int4-per-token-head", 4, 80)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_value_bits_are_the_presets_own(name):
    make_codec(name, PRESETS[name], 128, value_bits=PRESETS[name])
    with pytest.raises(ValueError, match="stores values as its engine does"):
        make_codec(name, PRESETS[name], 128, value_bits=2)


# --- vLLM's TurboQuant presets (kernels/engines/vllm_turboquant.py) -------------------------------------------
TQ = {"vllm-turboquant-k8v4": (8, 4), "vllm-turboquant-4bit-nc": (4, 4), "vllm-turboquant-k3v4-nc": (3, 4),
      "vllm-turboquant-3bit-nc": (3, 3)}


@pytest.mark.parametrize("name", sorted(TQ))
def test_turboquant_presets_store_vllms_slot(name):
    """vLLM's TurboQuantConfig: key_packed_size = d (fp8) or ceil(d b / 8) + 2 (fp16 norm); value_packed_size =
    ceil(d vb / 8) + 4 (fp16 scale and zero)."""
    kb, vb = TQ[name]
    for d in (64, 128, 256):
        c = make_codec(name, kb, d, num_heads=2)
        x = _keys(n=16, d=d, seed=5)
        key_bytes = d if kb == 8 else -(-d * kb // 8) + 2
        assert c.encode(x).nbytes() == x[..., 0].numel() * key_bytes
        assert c.encode_values(x).nbytes() == x[..., 0].numel() * (-(-d * vb // 8) + 4)


def test_turboquant_centroids_are_lloyd_max_for_the_rotated_coordinates():
    """vLLM solves Lloyd-Max for N(0, 1/d) by trapezoids: against the independent grid solution, and the
    published N(0, 1) figures scaled by 1/sqrt(d) (Max 1960: 3 bits 0.2451, 0.7560, 1.3440, 2.1520)."""
    from helpers.distortion_refs import _gauss_lloyd_max

    from kernels.engines.vllm_turboquant import lloyd_max_centroids

    # not a rounding: vLLM's own solver (200 iterations from evenly spaced centroids, 200-step trapezoids) stops
    # short of the fixed point the fine grid reaches in 500; its residual, 1.7e-4 at 3 bits and 0.9e-4 at 4
    # (0.02 sigma of N(0, 1/128)), is what a faithful port keeps: 2e-4 pins it
    for bits in (3, 4):
        np.testing.assert_allclose(lloyd_max_centroids(128, bits).numpy(), _gauss_lloyd_max(128, bits), atol=2e-4)
    # Max's figures to their printed digit (5e-5), and that residual in units of sigma (2e-4 sqrt(128) = 2.3e-3)
    np.testing.assert_allclose(lloyd_max_centroids(128, 3).numpy()[4:] * np.sqrt(128), [0.2451, 0.7560, 1.3440, 2.1520],
                               atol=5e-5 + 2e-4 * np.sqrt(128))


def test_turboquant_keys_and_values_by_numpy():
    from kernels.engines.vllm_turboquant import lloyd_max_centroids

    d = 64
    x = _keys(n=32, d=d, seed=6)
    c = make_codec("vllm-turboquant-4bit-nc", 4, d, num_heads=2)
    s = c.encode(x)
    xs = x.numpy().astype(np.float64)
    h = c.rotation.numpy().astype(np.float64)
    # entries ±c, one float32 c = (1 + e) / sqrt(d), |e| <= u: h h = d c^2 I, a d-term float64 sum
    np.testing.assert_allclose(h @ h, np.eye(d), rtol=0, atol=2 * U32 + U32 ** 2 + gamma(d, U64))
    norm = np.linalg.norm(xs, axis=-1, keepdims=True)
    y = (xs / (norm + 1e-8)) @ h
    cents = lloyd_max_centroids(d, 4).numpy().astype(np.float64)
    idx = (y[..., None] >= (cents[1:] + cents[:-1]) / 2).sum(-1)  # the midpoints at or below each coordinate
    got = c.key_field.unpack(s.tensors["codes"]).numpy()
    # float32 against float64 rotation (a few U32 of a coordinate ~ 1 / sqrt(d)): a code differs only where its
    # coordinate lies that close to one of 15 midpoints, ~1e-5 of the 8192 codes; 1e-3 of them is 8
    assert (got != idx).mean() < 1e-3
    q = cents[got]
    q = q / np.sqrt((q * q).sum(-1, keepdims=True) + 1e-16)  # norm correction
    ref = (q * norm.astype(np.float16).astype(np.float64)) @ h
    # float32 against float64: the correction's d-term norm and division, the product with the norm and with h
    # (d terms, sum |q_j h_ji| <= ||q|| = 1 by Cauchy-Schwarz), each within gamma of the row's norm
    bound = gamma(2 * d + 4) * norm.astype(np.float16).astype(np.float64)
    assert (np.abs(c.decode(s).double().numpy() - ref) <= bound).all()
    v = c.encode_values(x)
    lo, hi = xs.min(-1, keepdims=True), xs.max(-1, keepdims=True)
    scale = np.maximum((hi - lo) / 15, 1e-8).astype(np.float32)
    codes = np.clip(np.trunc((xs.astype(np.float32) - lo.astype(np.float32)) / scale + 0.5), 0, 15)
    np.testing.assert_array_equal(c.value_field.unpack(v.tensors["codes"]).numpy(), codes)
    want = codes * scale.astype(np.float16) + lo.astype(np.float16)
    # float32's product and sum (a rounding each) against float64's exact ones
    bound = gamma(2) * (np.abs(codes * scale.astype(np.float16)) + np.abs(lo.astype(np.float16)))
    assert (np.abs(c.decode_values(v).double().numpy() - want) <= bound).all()


@pytest.mark.engine_boundaries
def test_turboquant_keeps_the_boundary_layers_native():
    """vLLM's get_boundary_skip_layers: the first and last two layers (at most half of them) stay uncompressed."""
    from adapters.cache.config import CacheConfig
    from adapters.cache.kv_cache import CompressedKVCache

    cache = CompressedKVCache(CacheConfig(codec="vllm-turboquant-k3v4-nc", bits=3, protect=[5]), 8, 2, 64)
    assert [i for i, layer in enumerate(cache.layers) if layer.codec is None] == [0, 1, 5, 6, 7]
    cache = CompressedKVCache(CacheConfig(codec="vllm-turboquant-k3v4-nc", bits=3), 3, 2, 64)
    assert [layer.codec is None for layer in cache.layers] == [True, False, True]  # n = min(2, 3 // 2) = 1 each end
    assert CacheConfig(codec="vllm-int8-per-token-head", bits=8).protected_layers(8) == set()
    off = CacheConfig(codec="vllm-turboquant-k3v4-nc", bits=3, options={"boundary_layers": 0})
    assert off.protected_layers(8) == set()  # an experiment's choice, not vLLM's


# --- SGLang's fp8 dtypes (kernels/engines/sglang_kv.py) -------------------------------------------------------
@pytest.mark.parametrize("name, kind", [("sglang-fp8-e4m3", "e4m3"), ("sglang-fp8-e5m2", "e5m2")])
def test_sglang_fp8_is_torchs_cast_after_a_division_in_the_models_dtype(name, kind):
    dtype = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}[kind]
    x = (_keys(n=16, d=128, seed=7) * 40).to(torch.bfloat16)
    c = make_codec(name, 8, 128)
    np.testing.assert_array_equal(c.decode(c.encode(x)).float().numpy(), x.to(dtype).to(torch.bfloat16).float().numpy())
    np.testing.assert_array_equal(c.decode(c.encode(x.float())).double().numpy(),
                                  fp8_round(x.double().numpy(), kind) if kind == "e4m3" else
                                  x.float().to(dtype).double().numpy())  # e4m3: the definition, saturating
    scaled = make_codec(name, 8, 128, k_scale=3.0)
    want = (x / torch.tensor(3.0, dtype=torch.bfloat16)).to(dtype).float() * 3.0  # divided in bfloat16
    np.testing.assert_array_equal(scaled.decode(scaled.encode(x)).float().numpy(), want.to(torch.bfloat16).float().numpy())
    big = torch.full((1, 1, 1, 128), 1e6)  # beyond the format: whatever this torch's cast makes of it (vLLM saturates)
    got = make_codec(name, 8, 128).decode(make_codec(name, 8, 128).encode(big))[0, 0, 0, 0]
    want = big.to(dtype).float()[0, 0, 0, 0]
    assert torch.equal(got, want) or (got.isnan() and want.isnan())


# --- fp4: vLLM's nvfp4 and SGLang's fp4_e2m1 ------------------------------------------------------------
E2M1_GRID = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def e2m1_round(y: np.ndarray, ties: str) -> np.ndarray:
    """The nearest e2m1 magnitude by distance (saturating at 6), a tie to the even code ('even') or the larger
    magnitude ('away'), the sign kept: from the format's definition, not the codec's midpoint counts."""
    a = np.minimum(np.abs(y), 6.0)
    dist = np.abs(a[..., None] - E2M1_GRID)
    best = dist.min(-1, keepdims=True)
    tied = np.isclose(dist, best, rtol=0, atol=0)
    idx = np.arange(8)
    if ties == "even":
        pick = np.where(tied, (idx % 2) * 16 + idx, 99).argmin(-1)  # an even code first
    else:
        pick = np.where(tied, idx, -1).argmax(-1)  # the larger magnitude
    return np.sign(y) * E2M1_GRID[pick]


@pytest.mark.parametrize("name, ties", [("vllm-nvfp4", "even"), ("sglang-fp4-e2m1", "away")])
def test_fp4_layout_scales_and_rounding(name, ties):
    d = 128
    x = _keys(seed=9) * torch.rand(2, 2, 64, d, generator=torch.Generator().manual_seed(1)).pow(3) * 4
    x[0, 0, 0, :16] = torch.tensor([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.1, 0, 0, 0, 0, 0, 0, 0])  # ties
    x[0, 0, 1, :16] = 0.0  # an empty block
    c = make_codec(name, 4, d, num_heads=2)
    s = c.encode(x)
    codes, sf = s.tensors["codes"], s.tensors["scale"]
    assert codes.shape == (2, 2, 64, d // 2) and sf.shape == (2, 2, 64, d // 16) and sf.dtype == torch.uint8
    assert s.nbytes() == x[..., 0].numel() * (d // 2 + d // 16) == c.expected_nbytes(x.shape)
    xb = x.double().numpy().reshape(2, 2, 64, d // 16, 16)
    amax = np.abs(xb).max(-1, keepdims=True)
    if name == "vllm-nvfp4":  # the block scale is amax / 6 as torch casts it to e4m3; the codes x / scale
        scale = sf.view(torch.float8_e4m3fn).double().numpy()[..., None]
        np.testing.assert_array_equal(scale, fp8_round(amax.astype(np.float32) * np.float32(1 / 6), "e4m3"))
        assert torch.equal(sf.view(torch.float8_e4m3fn).float(),  # torch's own cast, the same float32 product
                           (x.unflatten(-1, (-1, 16)).abs().amax(-1) * (1 / 6)).to(torch.float8_e4m3fn).float())
    else:  # a power of two: the smallest 2^e with amax / 2^e <= 6
        e = sf.numpy().astype(np.float64)[..., None] - 127
        np.testing.assert_array_equal(e, np.ceil(np.log2(np.maximum(amax / 6, 1e-10))))
        scale = 2.0 ** e
    y = np.where(scale > 0, xb / np.where(scale > 0, scale, 1), 0)
    ref = e2m1_round(y, ties) * scale
    got = c.decode(s).double().numpy().reshape(ref.shape)
    np.testing.assert_array_equal(got, ref)  # a 2-bit e2m1 significand times a 4-bit scale: exact in float32
    want = np.searchsorted(E2M1_GRID, np.abs(ref / np.where(scale > 0, scale, 1))) | (y < 0) * 8
    want = want.reshape(2, 2, 64, d)
    packed = codes.numpy()
    np.testing.assert_array_equal(packed & 15, want[..., 0::2])  # element 2i in the low nibble
    np.testing.assert_array_equal(packed >> 4, want[..., 1::2])
    assert torch.equal(c.decode_values(c.encode_values(x)), c.decode(s))  # values are stored as keys are


def test_nvfp4_per_layer_scale():
    x = _keys(seed=10) * 3000  # amax / 6 beyond e4m3's 448 without a scale
    c = make_codec("vllm-nvfp4", 4, 128, k_scale=8.0)
    plain = make_codec("vllm-nvfp4", 4, 128)
    # dividing and multiplying by a power of two is exact
    np.testing.assert_array_equal(c.decode(c.encode(x)).numpy(), 8.0 * plain.decode(plain.encode(x / 8.0)).numpy())
    with pytest.raises(ValueError, match="blocks of 16"):
        make_codec("vllm-nvfp4", 4, 72)
