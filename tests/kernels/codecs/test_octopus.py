"""OCTOPUS and OCTOPUS-QJL (PyTorch reference): layout, rate, rounding, quality (the QJL estimator: test_octopus_qjl.py)."""
import json
import math

import pytest
import torch
from helpers.tolerances import U16, gamma
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from kernels import CodecConfig, Encoded, make_codec
from kernels.joint_rounding import (decode_triplets, direction_cosine, encode_triplets, local_full_agreement,
                                    round_directions)
from kernels.lloyd_max import codebook
from kernels.octahedral import octa_decode
from kernels.packing import BitField
from kernels.rotation import Rotation, next_pow2

DIMS = (64, 80, 96, 128, 256)
# TurboQuant-MSE (Lloyd-Max per coordinate on the rotated sphere) unit-vector MSE at b = 2, 3, 4
TURBOQUANT_MSE = {2: 0.116, 3: 0.034, 4: 0.0093}


def _keys(*shape, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


def _unit_mse(k, k_hat):
    n = k.norm(dim=-1, keepdim=True)
    return float((((k - k_hat.float()) / n) ** 2).sum(-1).mean())


def _hand_bytes(d, b_u, b_r, qjl=False):
    """Bytes per vector from the spec: fp32 norm + 2nt b_u-bit + nt b_r-bit codes (+ d_pad sign bits + fp16)."""
    d_pad = next_pow2(d)
    nt = math.ceil(d_pad / 3)
    n = 4 + math.ceil(2 * nt * b_u / 8) + math.ceil(nt * b_r / 8)
    return n + (math.ceil(d_pad / 8) + 2 if qjl else 0)


def _y_hat_by_hand(st, d, b_u, b_r):
    """The rotated-frame reconstruction y_hat [..., d_pad] straight from the documented state layout."""
    d_pad = next_pow2(d)
    nt = math.ceil(d_pad / 3)
    code = BitField(nt, 2 * b_u + b_r).unpack(st.tensors["u"])  # fused u | v << b_u | r << 2 b_u per triplet
    iu, iv, ir = code & ((1 << b_u) - 1), (code >> b_u) & ((1 << b_u) - 1), code >> (2 * b_u)
    oc, rc = codebook("octa", d_pad, b_u), codebook("triplet_norm", d_pad, b_r)
    return (rc[ir].unsqueeze(-1) * octa_decode(torch.stack((oc[iu], oc[iv]), -1))).flatten(-2)[..., :d_pad]


# --- joint rounding -------------------------------------------------------------------------

@pytest.mark.parametrize("b_u", [2, 3, 4, 5])
def test_local_search_matches_full_grid(b_u):
    # triplets as the codec sees them: 3 coordinates of a randomly rotated unit vector
    k = _keys(400, 128, seed=b_u)
    y = Rotation(128, seed=3).forward(k / k.norm(dim=-1, keepdim=True))
    t = torch.nn.functional.pad(y, (0, 1)).reshape(-1, 3)
    assert local_full_agreement(t, b_u) >= 0.99
    assert local_full_agreement(_keys(20000, 3, seed=10 + b_u), b_u) >= 0.99


@pytest.mark.parametrize("b_u", [2, 3, 4, 5])
def test_joint_never_worse_than_nearest(b_u):
    s = _keys(20000, 3, seed=20 + b_u)
    s = s / s.norm(dim=-1, keepdim=True)
    near = direction_cosine(s, *round_directions(s, b_u, "nearest"), b_u)
    joint = direction_cosine(s, *round_directions(s, b_u, "local"), b_u)
    full = direction_cosine(s, *round_directions(s, b_u, "full"), b_u)
    # the nearest pair is one of the candidates: each side's cosine a 3-term float32 dot of unit vectors, within
    # gamma(3) of exact
    assert bool((joint >= near - 2 * gamma(3)).all())
    assert bool((full >= joint - 2 * gamma(3)).all())
    assert float(joint.mean()) > float(near.mean())
    # the full-grid choice is the best of all pairs, checked by brute force on a few directions
    c = codebook("octa", 0, b_u)
    cu, cv = torch.meshgrid(c, c, indexing="ij")
    dirs = octa_decode(torch.stack((cu, cv), -1)).reshape(-1, 3)
    best = (s[:200] @ dirs.T).max(-1).values
    torch.testing.assert_close(full[:200], best, rtol=0, atol=2 * gamma(3))  # 3-term dots of unit vectors


def test_joint_rounding_lowers_mse():
    k = _keys(1024, 128, seed=4)
    mse = {r: _unit_mse(k, (c := make_codec("octopus", 3, 128, rounding=r)).decode(c.encode(k)))
           for r in ("nearest", "local", "full")}
    assert mse["local"] < mse["nearest"]
    # the searches pick different pairs in under 1% of triplets (test_local_search_matches_full_grid); there the
    # full search's better direction can still lose after the norm code's rounding: by less than their error
    assert mse["full"] <= mse["local"] * 1.01


# --- quality ------------------------------------------------------------------------------

def test_mse_decreases_with_bits_and_respects_rate_bound():
    k = _keys(2048, 128, seed=5)
    prev = float("inf")
    for b in (1, 2, 3, 4):
        c = make_codec("octopus", b, 128)
        st = c.encode(k)
        k_hat = c.decode(st)
        mse = _unit_mse(k, k_hat)
        assert mse < prev
        prev = mse
        # no quantizer beats the rate-distortion bound of the sphere, 4^-(true bits per coordinate)
        assert mse >= 4.0 ** -st.bits_per_coord()
        if b in TURBOQUANT_MSE:
            # b + 1/3 bits per coordinate go to the direction, more than TurboQuant-MSE's b:
            # OCTOPUS must beat the b-bit Lloyd-Max figure (measured: 0.083, 0.024, 0.0067)
            assert mse < TURBOQUANT_MSE[b]
        if b == 3:
            assert float(torch.nn.functional.cosine_similarity(k, k_hat, dim=-1).min()) > 0.95


@pytest.mark.parametrize("d", DIMS)
def test_all_head_dims(d):
    k = _keys(3, 7, d, seed=d)
    for name, b in (("octopus", 3), ("octopus-qjl", 4)):
        c = make_codec(name, b, d)
        st = c.encode(k)
        k_hat = c.decode(st)
        assert k_hat.shape == k.shape
        assert float(torch.nn.functional.cosine_similarity(k, k_hat, dim=-1).mean()) > 0.97


# --- state layout and rate ------------------------------------------------------------------

@pytest.mark.parametrize("d", DIMS)
@pytest.mark.parametrize("name,b", [("octopus", 1), ("octopus", 2), ("octopus", 4), ("octopus-qjl", 2),
                                    ("octopus-qjl", 3)])
def test_layout_and_nbytes(name, b, d):
    shape = (2, 3, 5, d)
    c = make_codec(name, b, d)
    st = c.encode(_keys(*shape, seed=1))
    qjl = name == "octopus-qjl"
    b_u, b_r = (b, b - 2) if qjl else (b + 1, b - 1)
    nt = math.ceil(next_pow2(d) / 3)
    t = st.tensors
    assert set(t) == ({"norm", "u", "qjl", "rnorm"} if qjl else {"norm", "u"})
    assert t["norm"].dtype == torch.float32 and t["norm"].shape == (2, 3, 5, 1)
    # the fused triplet codes keep the bytes of the two packed fields they replaced
    assert t["u"].dtype == torch.uint8
    assert t["u"].shape == (2, 3, 5, math.ceil(2 * nt * b_u / 8) + math.ceil(nt * b_r / 8))
    if qjl:
        assert t["qjl"].dtype == torch.uint8 and t["qjl"].shape == (2, 3, 5, next_pow2(d) // 8)
        assert t["rnorm"].dtype == torch.float16 and t["rnorm"].shape == (2, 3, 5, 1)
    per_vec = _hand_bytes(d, b_u, b_r, qjl)
    assert st.nbytes() == c.expected_nbytes(shape) == 30 * per_vec
    assert st.bits_per_coord() == 8 * per_vec / d  # 8 * 30 per_vec / (30 d): one rounding of the same rational


@pytest.mark.parametrize("d,b", [(128, 3), (80, 2), (96, 5)])
def test_reconstruction_follows_documented_layout(d, b):
    """Decode by hand from the spec (what the Triton kernel does) and compare."""
    c = make_codec("octopus", b, d, seed=11, layer=2)
    k = _keys(4, 9, d, seed=2)
    st = c.encode(k)
    y_hat = _y_hat_by_hand(st, d, b + 1, b - 1)
    ref = st.tensors["norm"] * Rotation(d, seed=11, layer=2).inverse(y_hat)
    # y_hat's product of centroids (a rounding each side) through the inverse butterfly (log2 d_pad stages and
    # the scaling, relative to the l2 norm) and the norm's product
    stages = next_pow2(d).bit_length() - 1
    bound = gamma(stages + 4) * st.tensors["norm"] * y_hat.norm(dim=-1, keepdim=True)
    assert bool(((c.decode(st) - ref).abs() <= bound).all())


def test_qjl_fields_follow_spec():
    d, b = 96, 3
    c = make_codec("octopus-qjl", b, d, seed=5, layer=1)
    k = _keys(6, d, seed=3)
    st = c.encode(k)
    d_pad = next_pow2(d)
    plain = make_codec("octopus", b - 1, d, seed=5, layer=1)
    ps = plain.encode(k)
    for f in ("norm", "u"):
        assert torch.equal(st.tensors[f], ps.tensors[f])  # the MSE stage is OCTOPUS at b - 1
    R = Rotation(d, seed=5, layer=1)
    y = R.forward(k / k.norm(dim=-1, keepdim=True))
    y_hat = _y_hat_by_hand(ps, d, b, b - 2)  # all d_pad coordinates, padded ones included
    r = ps.tensors["norm"] * (y - y_hat)
    signs = Rotation(d_pad, seed=5, layer=1, purpose="qjl").forward(r) >= 0
    assert torch.equal(BitField(d_pad, 1).unpack(st.tensors["qjl"]).bool(), signs)
    # fp16 storage (U16), and r's 128-term norm summed in another order (gamma(128), both sides)
    torch.testing.assert_close(st.tensors["rnorm"].float(), r.norm(dim=-1, keepdim=True), rtol=U16 + 2 * gamma(128),
                               atol=0)


def test_seeds_and_layers():
    k = _keys(16, 128, seed=6)
    for name in ("octopus", "octopus-qjl"):
        a = make_codec(name, 3, 128, seed=1).encode(k)
        b = make_codec(name, 3, 128, seed=1).encode(k)
        assert all(torch.equal(a.tensors[f], b.tensors[f]) for f in a.tensors)
        for other in (make_codec(name, 3, 128, seed=2), make_codec(name, 3, 128, seed=1, layer=1)):
            o = other.encode(k)
            assert not torch.equal(a.tensors["u"], o.tensors["u"])


def test_cat_and_config_round_trip():
    k = _keys(2, 10, 64, seed=7)
    c = make_codec("octopus-qjl", 3, 64, split=(3, 2), seed=3)
    whole = c.encode(k)
    parts = Encoded.cat([c.encode(k[:, :4]), c.encode(k[:, 4:])])
    assert all(torch.equal(whole.tensors[f], parts.tensors[f]) for f in whole.tensors)
    cfg = c.config.to_json()
    assert cfg["options"] == {"split": [3, 2], "rounding": "local"}
    again = make_codec(CodecConfig.from_json(json.loads(json.dumps(cfg))))
    assert torch.equal(again.encode(k).tensors["u"], whole.tensors["u"])
    with pytest.raises(ValueError, match="supported"):
        make_codec("octopus-qjl", 1, 64)


# --- edge cases --------------------------------------------------------------------------------

@pytest.mark.parametrize("name,b", [("octopus", 1), ("octopus", 3), ("octopus-qjl", 2)])
def test_zero_vectors_decode_to_zero(name, b):
    k = _keys(5, 80, seed=8)
    k[1] = 0
    k[3] = 0
    c = make_codec(name, b, 80)
    st = c.encode(k)
    k_hat = c.decode(st)
    assert bool(torch.isfinite(k_hat).all())
    assert bool((k_hat[1] == 0).all()) and bool((k_hat[3] == 0).all())
    s = c.score(_keys(2, 80, seed=9), st)
    assert bool(torch.isfinite(s).all()) and bool((s[:, 1] == 0).all())


def test_zero_triplets_decode_near_zero():
    d = 128
    c = make_codec("octopus", 3, d)
    smallest = float(codebook("triplet_norm", d, 2)[0])
    # exactly zero triplets, straight into the triplet quantizer
    t = _keys(50, 43, 3, seed=9)
    t[:, 1] = 0
    t[7] = 0
    iu, iv, ir = encode_triplets(t, 4, 2, d)
    t_hat = decode_triplets(iu, iv, ir, 4, 2, d)
    assert bool(torch.isfinite(t_hat).all())
    # the smallest length times a decoded unit direction: its product, the direction's own rounding and the
    # 3-term norm's, a few U32 each
    top = smallest * (1 + gamma(6))
    assert float(t_hat[:, 1].norm(dim=-1).max()) <= top
    assert float(t_hat[7].norm(dim=-1).max()) <= top
    # zero triplets in the rotated frame of real keys (one vector with a single non-zero coordinate)
    y = _keys(4, d, seed=10)
    y[:, 3:6] = 0
    y[2] = 0
    y[2, 60] = 1.0
    k = c.rot.inverse(y / y.norm(dim=-1, keepdim=True)) * 3.0
    st = c.encode(k)
    y_hat = c.stage.decode_rotated(st.tensors)
    # decode is still the documented norm * R^T y_hat (no 0/0 from a zero triplet), and the norm is the key's
    # k = 3 R^T (y / |y|) in float32: the unit vector's (gamma(d)), the butterfly's and scaling's (l2-relative) and
    # the product's rounding, and the 128-term norm that reads it back
    torch.testing.assert_close(st.tensors["norm"], torch.full((4, 1), 3.0),
                               rtol=2 * gamma(d) + gamma(d.bit_length() - 1 + 4), atol=0)
    assert torch.equal(c.decode(st), st.tensors["norm"] * c.rot.inverse(y_hat))  # the same operations
    norms = torch.nn.functional.pad(y_hat, (0, 1)).reshape(4, 43, 3).norm(dim=-1)
    zero = torch.nn.functional.pad(y, (0, 1)).reshape(4, 43, 3).norm(dim=-1) == 0
    assert int(zero.sum()) == 3 + 42
    assert float(norms[zero].max()) <= top


def test_non_finite_input_names_index():
    c = make_codec("octopus", 2, 64)
    k = _keys(3, 4, 64, seed=10)
    k[1, 2, 17] = float("nan")
    with pytest.raises(ValueError, match=r"\(1, 2, 17\)"):
        c.encode(k)
    k[1, 2, 17] = 0
    k[0, 3, 5] = float("-inf")
    with pytest.raises(ValueError, match=r"\(0, 3, 5\)"):
        make_codec("octopus-qjl", 3, 64).encode(k)


# --- dtypes, heads, speed -----------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", ["octopus", "octopus-qjl"])
def test_half_dtypes(name, dtype):
    c = make_codec(name, 3, 96)
    k = _keys(2, 8, 96, seed=17, dtype=dtype)
    st = c.encode(k)
    ref = c.encode(k.float())  # computations are float32: identical codes
    assert all(torch.equal(st.tensors[f], ref.tensors[f]) for f in st.tensors)
    out = c.decode(st)
    assert out.dtype == dtype and out.shape == k.shape
    assert float(torch.nn.functional.cosine_similarity(k.float(), out.float(), dim=-1).min()) > 0.95


@pytest.mark.parametrize("name", ["octopus", "octopus-qjl"])
def test_num_heads(name):
    d, T = 64, 6
    c = make_codec(name, 3, d, num_heads=4)
    k = _keys(2, 4, T, d, seed=18)
    out = c.decode(c.encode(k))
    assert out.shape == (2, 4, T, d)
    assert float(torch.nn.functional.cosine_similarity(k, out, dim=-1).min()) > 0.9
    same = _keys(d, seed=19).expand(1, 4, 1, d).contiguous()  # one key in every head
    u = c.encode(same).tensors["u"]
    assert not torch.equal(u[0, 0], u[0, 1])  # per-head rotation signs
    with pytest.raises(ValueError, match="expected inputs"):
        c.encode(_keys(2, 3, T, d))


class _Work(TorchDispatchMode):
    """Counts the tensor operations run inside it and the elements they write: the work a clock would time."""

    def __init__(self):
        super().__init__()
        self.ops = self.elements = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops += 1
        self.elements += sum(t.numel() for t in tree_leaves(out) if isinstance(t, torch.Tensor))
        return out


def _encode_work(codec, keys):
    with _Work() as w:
        codec.encode(keys)
    return w


def test_encode_speed():
    """Encode is a fixed sequence of tensor operations over all keys at once (no Python loop over tokens or
    triplets, no full-grid search): its operation count does not grow with the keys, its elements grow in
    proportion, and the 3x3 joint search adds 9 three-term candidates a triplet to nearest rounding. Counted,
    not timed (it was 0.1-0.3 s on 2 CPU cores for 4096 x 128 keys, bounded at 2 s: a loaded machine's clock)."""
    k = _keys(4096, 128, seed=20)
    c, near = make_codec("octopus", 4, 128), make_codec("octopus", 4, 128, rounding="nearest")
    c.encode(k[:8]), near.encode(k[:8])  # codebooks
    small, large = _encode_work(c, k[:512]), _encode_work(c, k)
    assert large.ops == small.ops and large.elements <= 8 * small.elements
    # per triplet, 9 candidates, each two clamped indices (4 writes), a grid index (2), 3 coordinates gathered,
    # a view of the direction and the product (9), a 3-term sum (1); then the pick (a few): per coordinate, a third
    extra_per_coord = (9 * (4 + 2 + 9 + 1) + 6) / 3
    assert large.elements <= _encode_work(near, k).elements + extra_per_coord * k.numel()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", ["octopus", "octopus-qjl"])
def test_cuda_matches_cpu(name):
    k = _keys(2, 4, 33, 128, seed=21)
    cpu = make_codec(name, 3, 128, num_heads=4)
    gpu = make_codec(name, 3, 128, num_heads=4, device="cuda")
    a, b = cpu.encode(k), gpu.encode(k.cuda())
    assert all(b.tensors[f].is_cuda for f in b.tensors)
    mismatch = (a.tensors["u"] != b.tensors["u"].cpu()).float().mean()
    # GPU and CPU sum the norm, the butterfly and the 3-term dots in other orders (a few U32): a code flips only
    # where a value lies that close to a decision boundary, ~1e-5 of them; 1e-3 of the bytes is 100 times that
    assert float(mismatch) < 1e-3
    ka, kb = cpu.decode(a), gpu.decode(b).cpu()
    # each flipped code moves its triplet by one cell, at most ~0.3 of the triplet at 3 bits: 1e-3 of the
    # codes moves the keys by at most 0.3 sqrt(1e-3) ~ 1e-2 of their norm
    assert float((kb - ka).norm() / ka.norm()) < 1e-2
    q = _keys(2, 4, 5, 128, seed=22)
    sa, sb = cpu.score(q, a), gpu.score(q.cuda(), b).cpu()
    assert float((sb - sa).norm() / sa.norm()) < 1e-2


def test_unknown_option_is_an_error():
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['splitt'\]"):
        make_codec("octopus", 3, 64, splitt=(3, 3))
