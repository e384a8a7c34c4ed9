"""The table-lookup decode kernel's QJL residual stage (TurboQuant-prod, OCTOPUS-QJL), on the CPU: the
constants and refusals of a residual, the sketch matrices lut_qprep multiplies the query by against
each codec's own score, and the kernel's fragment index arithmetic emulated in the mma layout. The
kernel itself against the reference: tests/kernels/cuda/test_decode_lut.py (QJL codecs in CODECS)."""
from __future__ import annotations

import pytest
import torch

from kernels import make_codec
from kernels.cuda.decode_lut import launch_plan, supports
from helpers.decode_checks import LUT_CODECS, LUT_QJL_CODECS, score_atol
from helpers.tolerances import U64, gamma

CODECS, QJL = LUT_CODECS, LUT_QJL_CODECS


def test_qjl_constants_and_refusals():
    """A QJL residual compiles the kernel's QJL stage (HAS_QJL) and needs lut_qprep (it makes the query's
    sketch): qprep 'cta' is refused; so is OCTOPUS's unfused table without a length code (b_r = 0);
    a sketch of other than head_dim rows is refused by supports()."""
    import dataclasses

    from kernels.cuda.decode_lut import _Plan

    for name in QJL:
        run = launch_plan(make_codec(name, 3, 128), torch.bfloat16, 7)
        macros = run.constants.macros
        assert macros["HAS_QJL"] == 1 and macros["QUERY_PREP"] == 1 and run.config.qprep == "auto"
        with pytest.raises(ValueError, match="qprep 'cta' cannot serve a QJL residual"):
            launch_plan(make_codec(name, 3, 128), torch.bfloat16, 7, {"qprep": "cta"})
    assert launch_plan(make_codec("octopus", 3, 128), torch.bfloat16, 7).constants.macros["HAS_QJL"] == 0
    for name in CODECS:  # the launcher's per-codec plan builds on the CPU too (tables, signs, sketch)
        codec = make_codec(name, 3, 128, num_heads=2)
        plan = _Plan(codec, "cpu", launch_plan(codec, torch.bfloat16, 7).lookup)
        assert plan.skm.shape == ((2, 128, 128) if name in QJL else (1, 1, 1)), name
        assert (plan.qjl_fields is not None) == (name in QJL) and plan.skm_stride == (128 * 128 if name in QJL else 0)
    with pytest.raises(ValueError, match="needs a triplet-length code"):
        launch_plan(make_codec("octopus", 1, 128), torch.bfloat16, 7, {"fused": False})
    codec = make_codec("turboquant-prod", 3, 128)
    layout = codec.fused_layout()
    short = dataclasses.replace(layout, residual=dataclasses.replace(layout.residual, m=64))
    codec.fused_layout = lambda: short
    assert "QJL sketch of 64 rows, not head_dim 128" in supports(codec)


@pytest.mark.parametrize("name", QJL)
@pytest.mark.parametrize("num_heads", [1, 3])
def test_sketch_matrices_give_the_codecs_score(name, num_heads):
    """The QJL term the kernel computes from M (what lut_qprep multiplies the query by) and the stored
    fields, coef * rnorm * <M q, 2 bits - 1>, is the codec's own score minus its MSE stage's <q, k>."""
    from kernels.cuda.decode_lut import sketch_matrices
    from kernels.packing import BitField

    g = torch.Generator().manual_seed(1)
    codec = make_codec(name, 3, 128, seed=4, layer=3, num_heads=num_heads)
    k = torch.randn(2, num_heads, 9, 128, generator=g) * (1 + torch.rand(2, num_heads, 9, 1, generator=g))
    q = torch.randn(2, num_heads, 5, 128, generator=g)
    st = codec.encode(k)
    layout = codec.fused_layout()
    res = layout.residual
    M = sketch_matrices(layout)
    assert M.shape == (num_heads, 128, 128) and M.dtype == torch.float32
    pm1 = BitField(res.m, 1).unpack(st.tensors[res.bits_field]).float() * 2 - 1  # [B, H, T, m]
    rnorm = st.tensors[res.norm_field].float().transpose(-1, -2)  # [B, H, 1, T]
    got = res.coef * rnorm * ((q @ M.transpose(-1, -2)) @ pm1.transpose(-1, -2))
    k_mse = codec.stage.decode(st.tensors)
    want = codec.score(q, st) - q @ k_mse.transpose(-1, -2)
    # want is a difference of two float32 scores (each within score_atol of exact, a 128-term sketch and
    # butterflies on top); got a 128-term product with M and a 128-term sum of ±1 times the sketch, |M q| and
    # |got| at most |coef| rnorm ||q|| m (M's rows have unit norm)
    n = 2 * 128 + 16
    bound = (score_atol(q, codec.decode(st), n) + score_atol(q, k_mse, n)
             + gamma(n) * abs(res.coef) * rnorm * q.norm(dim=-1, keepdim=True) * res.m)
    assert bool(((got - want).abs() <= bound).all()), float((got - want).abs().max())


@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("G", [1, 7, 8])
def test_qjl_fragments_pair_each_sign_with_its_sketch_row(D, G):
    """The kernel's QJL product, emulated from its index arithmetic: lut_split's A registers from the
    stored sign row (thread c's word c at D = 128, half word c spread by __byte_perm(x, 0, 0x4140) at
    D = 64; qjl_pm1(w, 15 - s) and qjl_pm1(w, 15 - QJL_KSTEPS - s): bit 15 and 31 -> the fp16 sign, bit 1 = +1)
    and lut_qprep's B registers (slot t of k-step s of lane 4 r + c holds row sk_coord(c, s, t)),
    multiplied in the mma.m16n8k16 fragment layout, give (2 bits - 1) . Sq^T for 16 real tokens."""
    from kernels.packing import BitField

    gen = torch.Generator().manual_seed(D + G)
    QJL_KSTEPS = D // 16
    bits = torch.randint(0, 2, (16, D), generator=gen)
    rows = BitField(D, 1).pack(bits)  # the stored field, [16, D / 8] uint8
    sq = torch.randn(G, D, generator=gen, dtype=torch.float64)

    def sk_coord(c, s, t):
        return 4 * QJL_KSTEPS * c + s + QJL_KSTEPS * (0, 2, 1, 3)[t]

    def word(tok, c):
        b = [int(x) for x in rows[tok]]
        if D == 128:
            return b[4 * c] | b[4 * c + 1] << 8 | b[4 * c + 2] << 16 | b[4 * c + 3] << 24
        return b[2 * c] | b[2 * c + 1] << 16  # __byte_perm(half word, 0, 0x4140): bytes (b0, 0, b1, 0)

    def pm1(w, sh):  # lop3((w << sh), 0x80008000, 0x3C003C00, (~a & b) | c) as two fp16: (lo, hi)
        x = (w << sh) & 0xFFFFFFFF
        return tuple(-1.0 if (x >> bit) & 1 == 0 else 1.0 for bit in (15, 31))

    def f64(v):
        return torch.tensor(v, dtype=torch.float64)

    assert sorted(sk_coord(c, s, t) for c in range(4) for s in range(QJL_KSTEPS) for t in range(4)) == list(range(D))
    acc = torch.zeros(16, 8, dtype=torch.float64)
    for s in range(QJL_KSTEPS):
        A = torch.full((16, 16), float("nan"), dtype=torch.float64)
        Bm = torch.full((16, 8), float("nan"), dtype=torch.float64)
        for lane in range(32):
            r, c = lane >> 2, lane & 3
            w0, w1 = word(r, c), word(r + 8, c)
            A[r, 2 * c:2 * c + 2] = f64(pm1(w0, 15 - s))
            A[r + 8, 2 * c:2 * c + 2] = f64(pm1(w1, 15 - s))
            A[r, 2 * c + 8:2 * c + 10] = f64(pm1(w0, 15 - QJL_KSTEPS - s))
            A[r + 8, 2 * c + 8:2 * c + 10] = f64(pm1(w1, 15 - QJL_KSTEPS - s))
            x = [float(sq[r, sk_coord(c, s, t)]) if r < G else 0.0 for t in range(4)]
            Bm[2 * c:2 * c + 2, r] = f64(x[:2])  # b0 = pack_h2(x, y)
            Bm[2 * c + 8:2 * c + 10, r] = f64(x[2:])  # b1 = pack_h2(z, w)
        acc += A @ Bm
    want = (bits.double() * 2 - 1) @ sq.T
    # ±1 times float64 features: exact products; two orders of a D-term float64 sum
    bound = 2 * gamma(D, U64) * float(sq.abs().sum(-1).max())
    torch.testing.assert_close(acc[:, :G], want, rtol=0, atol=bound)
    assert not acc[:, G:].any()


def test_sketch_heads_are_checked():
    """A declared sketch whose heads are neither 1 nor the rotation's is refused (lut_qprep indexes the
    sketch by KV head)."""
    import dataclasses

    codec = make_codec("turboquant-prod", 3, 128, num_heads=2)
    layout = codec.fused_layout()
    three = torch.randn(3, 128, 128)
    codec.fused_layout = lambda: dataclasses.replace(layout, residual=dataclasses.replace(layout.residual,
                                                                                          matrix=three))
    assert "the QJL sketch has 3 heads, the rotation 2" in supports(codec)
    one = make_codec("turboquant-prod", 3, 128, num_heads=1)
    lay1 = one.fused_layout()
    one.fused_layout = lambda: dataclasses.replace(lay1, residual=dataclasses.replace(lay1.residual, matrix=three))
    assert supports(one) is None and "rotation or sketch has 3 heads, the cache 4" in supports(one, Hkv=4)
