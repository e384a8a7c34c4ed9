"""Shared codec machinery: packing, rotation, Lloyd–Max, value quantization, registry, seeds."""
import json
import math
import re

import pytest
import torch
from helpers.tolerances import U16, U32, U64, gamma

from kernels import derive_seed, list_codecs, make_codec, private_generator
from kernels.checks import check_finite
from kernels.lloyd_max import SHIPPED_DIR, codebook, density, lloyd_max_grid, mse_of, quantize, train
from kernels.packing import pack_bits, unpack_bits
from kernels.rotation import Rotation, fwht, hadamard_matrix, next_pow2
from kernels.values import ValueQuantizer


@pytest.mark.parametrize("bits", [1, 2, 3, 4, 5, 7, 8, 12, 16])
@pytest.mark.parametrize("n", [1, 5, 43, 128])
def test_pack_round_trip(bits, n):
    g = torch.Generator().manual_seed(bits * 1000 + n)
    codes = torch.randint(0, 1 << bits, (3, 4, n), generator=g)
    packed = pack_bits(codes, bits)
    assert packed.dtype == torch.uint8 and packed.shape == (3, 4, (n * bits + 7) // 8)
    assert torch.equal(unpack_bits(packed, bits, n), codes)


def test_pack_layout_is_the_documented_bitstream():
    # code i sits at bit offset i*bits, LSB first: check against a hand-built bit string
    codes = torch.tensor([5, 2, 7, 1, 6])  # 3 bits each
    bitstring = "".join(format(int(c), "03b")[::-1] for c in codes)  # LSB-first per code
    bitstring += "0" * (-len(bitstring) % 8)
    expect = [int(bitstring[i:i + 8][::-1], 2) for i in range(0, len(bitstring), 8)]
    assert pack_bits(codes, 3).tolist() == expect
    row = pack_bits(codes, 3)
    for i, c in enumerate(codes.tolist()):
        o = i * 3
        lo = int(row[o >> 3])
        hi = int(row[(o >> 3) + 1]) if (o >> 3) + 1 < len(row) else 0
        assert ((lo | hi << 8) >> (o & 7)) & 7 == c


def test_pack_rejects_out_of_range():
    with pytest.raises(ValueError, match="out of range"):
        pack_bits(torch.tensor([8]), 3)


def test_fwht_matches_hadamard_matrix():
    g = torch.Generator().manual_seed(0)
    for n in (2, 8, 64, 128):
        x = torch.randn(5, n, dtype=torch.float64, generator=g)
        H = hadamard_matrix(n, dtype=torch.float64)
        # entries ±1: each output is a signed sum of the n inputs, log2(n) roundings by the butterfly and
        # n - 1 by the product, each relative to at most sum |x_i|
        bound = (gamma(n.bit_length() - 1, U64) + gamma(n - 1, U64)) * x.abs().sum(-1, keepdim=True)
        assert ((fwht(x) - x @ H.T).abs() <= bound).all()
        assert torch.equal(H @ H.T, n * torch.eye(n, dtype=torch.float64))  # integers: exact in float64


@pytest.mark.parametrize("d", [64, 80, 96, 128, 256])
def test_rotation_orthogonal_with_exact_inverse(d):
    rot = Rotation(d, seed=3, layer=2, num_heads=4)
    n, stages = rot.padded, rot.padded.bit_length() - 1
    assert n == next_pow2(d)
    for h in range(4):
        R = rot.matrix(h).double()
        # entries ±c, one float32 c = (1 + e) / sqrt(n), |e| <= u: R R^T = n c^2 I exactly in float64
        torch.testing.assert_close(R @ R.T, torch.eye(n, dtype=torch.float64), rtol=0, atol=2 * U32 + U32 ** 2)
    x = torch.randn(2, 4, 9, d, generator=torch.Generator().manual_seed(d))
    y = rot.forward(x)
    # each butterfly stage and the scaling round once, relative to the l2 norm (the stages are orthogonal
    # up to sqrt 2); each norm is a sum of squares (gamma(n) / 2) and a square root
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1), rtol=gamma(stages + 2) + gamma(n) + 2 * U32, atol=0)
    # forward and inverse: twice the transform's relative l2 error, which bounds every coordinate's
    assert ((rot.inverse(y) - x).abs() <= gamma(2 * stages + 4) * x.norm(dim=-1, keepdim=True)).all()
    # per-head signs differ, per-layer signs differ, same (seed, layer) is identical
    assert not torch.equal(rot.signs[0], rot.signs[1])
    assert not torch.equal(Rotation(d, seed=3, layer=1, num_heads=4).signs, rot.signs)
    assert torch.equal(Rotation(d, seed=3, layer=2, num_heads=4).signs, rot.signs)


def test_lloyd_max_gaussian_reference_figures():
    # Max (1960) / the TurboQuant paper: 0.3634, 0.1175, 0.03455, 0.00950, each to half a unit of its last digit
    x, w = density("gauss", 0)
    for b, ref, half_digit in zip(range(1, 5), (0.3634, 0.1175, 0.03455, 0.00950), (5e-5, 5e-5, 5e-6, 5e-6)):
        c, _ = lloyd_max_grid(x, w, 1 << b)
        assert mse_of(c, x, w) == pytest.approx(ref, abs=half_digit)  # the reference's printed precision
    # 1 bit: centroids ±sqrt(2/pi), up to the grid: the point at the threshold 0 puts its mass phi(0) dx in
    # one cell of mass 1/2
    c, _ = lloyd_max_grid(x, w, 2)
    dx = float(x[1] - x[0])
    assert c[1].item() == pytest.approx(math.sqrt(2 / math.pi), rel=2 * dx / math.sqrt(2 * math.pi))


def test_lloyd_max_on_samples_matches_density():
    g = torch.Generator().manual_seed(0)
    s = torch.randn(400_000, generator=g, dtype=torch.float64)
    c, _ = lloyd_max_grid(s, torch.ones_like(s), 4)
    x, w = density("gauss", 0)
    cd, _ = lloyd_max_grid(x, w, 4)
    # within 4 standard errors of the sampled fixed point, estimated from 8 independent eighths of the sample
    # (a fixed point moves with every cell's mean through the thresholds: more than one cell's error)
    eighths = torch.stack([lloyd_max_grid(part, torch.ones_like(part), 4)[0] for part in s.view(8, -1)])
    se = eighths.std(0) / math.sqrt(8)
    assert ((c - cd).abs() <= 4 * se).all(), ((c - cd).abs() / se).tolist()


def test_shipped_codebook_regenerates_exactly():
    shipped = json.loads((SHIPPED_DIR / "coord.json").read_text())
    assert shipped["coord/d64/b3"] == [float(v) for v in train("coord", 64, 3).tolist()]
    shipped = json.loads((SHIPPED_DIR / "triplet_norm.json").read_text())
    assert shipped["triplet_norm/d128/b2"] == [float(v) for v in train("triplet_norm", 128, 2).tolist()]


def test_coord_codebook_is_scaled_gaussian_at_large_d():
    # sqrt(d) * coordinate of a uniform unit vector has density phi(t) (1 + (3t^2/2 - t^4/4 - 3/4) / d + O(d^-2)):
    # its 2-bit centroids are the Gaussian's to 1/d (the first-order term moves the outer pair by 0.67 / d)
    c = codebook("coord", 256, 2) * 16
    g = codebook("gauss", 0, 2)
    torch.testing.assert_close(c, g, rtol=0, atol=1 / 256)


def test_unshipped_codebook_is_trained_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("KVCODEC_CACHE", str(tmp_path))
    from kernels import lloyd_max

    lloyd_max._codebook_cached.cache_clear()
    c = codebook("coord", 512, 2)
    # sqrt(d) * a coordinate of a uniform unit vector is ~N(0, 1) at d = 512: Max's (1960) 2-bit centroids, to
    # half a unit of their last printed digit and the 1/d of test_coord_codebook_is_scaled_gaussian_at_large_d
    assert c.shape == (4,)
    torch.testing.assert_close(c * math.sqrt(512), torch.tensor([-1.510, -0.4528, 0.4528, 1.510]), rtol=0,
                               atol=5e-4 + 1 / 512)
    assert list((tmp_path / "codebooks").glob("coord_d512_b2.json"))
    lloyd_max._codebook_cached.cache_clear()


def test_quantize_is_nearest_centroid():
    c = torch.tensor([-1.0, 0.0, 2.0])
    x = torch.tensor([-3.0, -0.6, -0.4, 0.9, 1.1, 5.0])
    assert quantize(x, c).tolist() == [0, 0, 1, 1, 2, 2]
    ref = (x[:, None] - c[None]).abs().argmin(-1)
    assert torch.equal(quantize(x, c), ref)


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("d", [64, 80])
def test_value_quantizer_error_and_bytes(bits, d):
    vq = ValueQuantizer(bits, d, group_size=32)
    v = torch.randn(2, 3, 7, d, generator=torch.Generator().manual_seed(bits * 100 + d))
    st = vq.encode(v)
    vh = vq.decode(st)
    assert vh.shape == v.shape
    # error per coordinate at most half a step of the fp16 scale (the step, rounded up by U16), plus the fp16
    # zero's rounding (U16 |lo|: codes below it clamp to 0), the top codes' clamp where the scale rounded down
    # (U16 of the range, which the zero's rounding widens), and float32's rounding of the read-back
    groups = torch.nn.functional.pad(v, (0, vq.padded - d)).reshape(2, 3, 7, -1, 32)
    lo, hi = groups.amin(-1), groups.amax(-1)
    step = (hi - lo) / ((1 << bits) - 1)
    bound = step / 2 * (1 + U16) + U16 * (lo.abs() + 2 * (hi - lo)) + gamma(4) * groups.abs().amax(-1)
    assert torch.all((vh - v).abs() <= bound.repeat_interleave(32, -1)[..., :d])
    assert st.nbytes() == vq.expected_nbytes(v.shape) == 2 * 3 * 7 * ((vq.padded * bits + 7) // 8 + 4 * vq.padded // 32)


def test_unknown_codec_lists_available():
    with pytest.raises(ValueError, match="Unknown codec 'nope'. Available: .*none"):
        make_codec("nope", 2, 64)


def test_bits_outside_range_lists_supported():
    with pytest.raises(ValueError, match=r"does not support bits=3; supported: \[16, 32\]"):
        make_codec("none", 3, 64)


def test_non_finite_error_names_the_index():
    x = torch.zeros(2, 5, 8)
    x[1, 3, 6] = float("nan")
    with pytest.raises(ValueError, match=r"index \(1, 3, 6\)"):
        check_finite(x)
    codec = make_codec("none", 16, 8)
    with pytest.raises(ValueError, match="non-finite"):
        codec.encode(x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_check_finite_finds_every_kind_anywhere(dtype):
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for dev in devices:
        x = torch.randn(3, 7, 40).to(dtype).to(dev)
        check_finite(x)  # finite: nothing
        check_finite(x[:, :, :0])  # empty: nothing
        for bad, idx in ((float("nan"), (0, 0, 0)), (float("inf"), (2, 6, 39)), (-float("inf"), (1, 4, 17))):
            y = x.clone()
            y[idx] = bad
            with pytest.raises(ValueError, match=re.escape(f"index {idx}")):
                check_finite(y)


def test_seeds_are_stable_and_private():
    assert derive_seed(1, 2, "x") == derive_seed(1, 2, "x") != derive_seed(1, 3, "x")
    a = torch.randn(4, generator=private_generator(0, "a"))
    torch.manual_seed(123)  # the global RNG must not matter
    b = torch.randn(4, generator=private_generator(0, "a"))
    assert torch.equal(a, b)


def test_registry_lists_bits():
    assert list_codecs()["none"] == (16, 32)
