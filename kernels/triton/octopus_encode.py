"""Fused OCTOPUS key encoder: norm, rotation, triplets, octahedral fold, Lloyd-Max with the 3x3
joint rounding, and bit packing in one kernel; it writes the reference state
(:class:`kernels.fused_layout.FusedLayout`, OCTAHEDRAL keys: OCTOPUS): "norm" fp32 [..., T, 1] and
the fused triplet codes u | v << b_u | r << 2 b_u (:class:`kernels.fused_layout.TripletCodes`)
packed in one uint8 row per token.

Every step follows the PyTorch reference operation for operation (IEEE division and square
root, the same butterfly order, no multiply-add contraction), so the state matches the
reference byte for byte except where float summation order differs (the key norm, the
3-term dot products) and moves a value across a decision boundary: tests/kernels/triton/test_triton_encode.py
states the tolerance (a tiny fraction of codes, each off by one neighbour).
"""
from __future__ import annotations

import math
import weakref

import torch
import triton
import triton.language as tl

from kernels.checks import check_input
from kernels.encoded import Encoded
from kernels.fused_layout import FusedLayout, KeyCodes
from kernels.joint_rounding import direction_grid
from kernels.triton._common import (count_below, fwht_rows, head_layout, load_rows, pack_bytes, rotation_signs, rows_per_program,
                      sum_rows, thresholds)

@triton.jit
def octopus_rows(
    x, head, SIGNS, OC_THR, GRID, RHO_THR, rot_scale,
    BT: tl.constexpr, NP: tl.constexpr, LOG2N: tl.constexpr, NT: tl.constexpr, NTP: tl.constexpr,
    BU: tl.constexpr, BR: tl.constexpr, UBP: tl.constexpr, LOCAL: tl.constexpr,
):
    """BT keys x fp32 [BT, NP] (zero past the head dim), each of rotation head ``head`` [BT] -> (norm fp32
    [BT], the row's bytes int32 [BT, UBP]: the fused triplet codes, zero past them). The encoder's whole
    body: the standalone kernel below and the decode step's fused commit (:mod:`.commit`) both run it."""
    cols = tl.arange(0, NP)
    # norm and unit direction (zero keys stay zero)
    norm = tl.sqrt_rn(sum_rows(x * x, BT, NP, LOG2N))
    unit = tl.div_rn(x, tl.where(norm > 0, norm, 1.0)[:, None])
    sg = tl.load(SIGNS + head[:, None] * NP + cols[None, :])
    y = fwht_rows(unit * sg, BT, NP, LOG2N) * rot_scale  # [BT, NP]

    # triplets (x, y, z) = y[3i : 3i + 3], zero past the padded dim
    i = tl.arange(0, NTP)
    ti = (i < NT)[None, :]
    c0 = 3 * i
    tx = tl.where(ti & (c0 < NP)[None, :], tl.gather(y, tl.broadcast_to(tl.minimum(c0, NP - 1)[None, :], [BT, NTP]), 1), 0.0)
    ty = tl.where(ti & (c0 + 1 < NP)[None, :], tl.gather(y, tl.broadcast_to(tl.minimum(c0 + 1, NP - 1)[None, :], [BT, NTP]), 1), 0.0)
    tz = tl.where(ti & (c0 + 2 < NP)[None, :], tl.gather(y, tl.broadcast_to(tl.minimum(c0 + 2, NP - 1)[None, :], [BT, NTP]), 1), 0.0)
    rho = tl.sqrt_rn(tx * tx + ty * ty + tz * tz)
    rs = tl.where(rho > 0, rho, 1.0)
    sx = tl.div_rn(tx, rs)
    sy = tl.div_rn(ty, rs)
    sz = tl.div_rn(tz, rs)

    # octahedral fold of s (kernels.octahedral.octa_encode)
    l1 = tl.maximum(tl.abs(sx) + tl.abs(sy) + tl.abs(sz), 1.1754943508222875e-38)
    px = tl.div_rn(sx, l1)
    py = tl.div_rn(sy, l1)
    pz = tl.div_rn(sz, l1)
    lower = pz < 0
    fu = tl.where(lower, tl.where(px >= 0, 1.0 - tl.abs(py), -(1.0 - tl.abs(py))), px)
    fv = tl.where(lower, tl.where(py >= 0, 1.0 - tl.abs(px), -(1.0 - tl.abs(px))), py)
    K: tl.constexpr = 1 << BU
    iu = count_below(fu, OC_THR, K - 1)
    iv = count_below(fv, OC_THR, K - 1)

    # 3x3 joint rounding: the candidate pair whose decoded direction maximises <s_hat, s>
    if LOCAL:
        best = tl.full([BT, NTP], float("-inf"), tl.float32)
        bu = iu
        bv = iv
        for k in tl.static_range(9):
            # offsets in joint_rounding._OFFSETS order: the centre, then row-major without it
            # (m = k - 1 + [k >= 5] walks the 3x3 grid; [k >= 1] zeroes the centre's offset)
            cu = tl.minimum(tl.maximum(iu + ((k - 1 + (k + 3) // 8) // 3 - 1) * ((k + 7) // 8), 0), K - 1)
            cv = tl.minimum(tl.maximum(iv + ((k - 1 + (k + 3) // 8) % 3 - 1) * ((k + 7) // 8), 0), K - 1)
            gp = GRID + (cu * K + cv) * 3
            sc = tl.load(gp) * sx + tl.load(gp + 1) * sy + tl.load(gp + 2) * sz
            better = sc > best
            best = tl.where(better, sc, best)
            bu = tl.where(better, cu, bu)
            bv = tl.where(better, cv, bv)
        iu = bu
        iv = bv
    gp = GRID + (iu * K + iv) * 3
    proj = rho * (tl.load(gp) * sx + tl.load(gp + 1) * sy + tl.load(gp + 2) * sz)
    ir = count_below(proj, RHO_THR, (1 << BR) - 1)
    # one fused code per triplet, the row's bytes past the codes zero
    return norm, pack_bytes(iu | (iv << BU) | (ir << (2 * BU)), NT, NTP, 2 * BU + BR, UBP)


# token counts change with every call: no specialisation on them (one compiled kernel for all)
@triton.jit(do_not_specialize=["N", "T"])
def _octopus_encode_kernel(
    X, SIGNS, OC_THR, GRID, RHO_THR, NORM_OUT, U_OUT, N, T, H, rot_scale,
    D: tl.constexpr, NP: tl.constexpr, LOG2N: tl.constexpr, BT: tl.constexpr, NT: tl.constexpr,
    NTP: tl.constexpr, BU: tl.constexpr, BR: tl.constexpr, UB: tl.constexpr, UBP: tl.constexpr,
    LOCAL: tl.constexpr,
):
    rows, rm, x = load_rows(X, N, D, NP, BT)
    norm, ub = octopus_rows(x, (rows // T) % H, SIGNS, OC_THR, GRID, RHO_THR, rot_scale,
                            BT, NP, LOG2N, NT, NTP, BU, BR, UBP, LOCAL)
    tl.store(NORM_OUT + rows, norm, mask=rm)
    j = tl.arange(0, UBP)
    tl.store(U_OUT + rows[:, None].to(tl.int64) * UB + j[None, :], ub.to(tl.uint8), mask=rm[:, None] & (j < UB)[None, :])


class _Tables:
    def __init__(self, layout: FusedLayout, device):
        b_u = layout.bits[0]
        octa, triplet_norm = layout.codebooks
        self.oc_thr = thresholds(octa).to(device)
        self.grid = direction_grid(b_u).to(device).contiguous()
        self.rho_thr = thresholds(triplet_norm).to(device)
        self.signs = rotation_signs(layout.rotation, device)


# per codec, per device; weak keys so the tables go when the codec does
_TABLES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def encoder_args(codec, layout: FusedLayout, device) -> tuple[tuple[torch.Tensor, ...], float, dict]:
    """What :func:`octopus_rows` takes for ``codec``'s ``layout`` (its ``fused_layout()``) on ``device``: its
    tables (signs, octahedral thresholds, direction grid, triplet-length thresholds), the rotation's scale
    and the constexprs (``UB``: the row's bytes)."""
    why = supports(layout)
    if why:
        raise ValueError(why)
    per = _TABLES.setdefault(codec, {})
    tab = per.get(str(device))
    if tab is None:
        tab = per[str(device)] = _Tables(layout, device)
    NP, NT, UB = layout.padded, layout.triplets, layout.codes.nbytes
    consts = dict(NP=NP, LOG2N=NP.bit_length() - 1, NT=NT, NTP=triton.next_power_of_2(NT), BU=layout.bits[0],
                  BR=layout.bits[1], UB=UB, UBP=triton.next_power_of_2(UB), LOCAL=layout.rounding == "local")
    return (tab.signs, tab.oc_thr, tab.grid, tab.rho_thr), 1.0 / math.sqrt(NP), consts


def supports(layout: FusedLayout | None) -> str | None:
    """None when this encoder writes ``layout``'s key codes, else why not."""
    if layout is None or layout.keys != KeyCodes.OCTAHEDRAL:
        return f"not an OCTOPUS (octahedral) key layout: {layout.keys.value if layout else 'no fused layout'}"
    if layout.rounding not in ("local", "nearest"):
        return f"rounding '{layout.rounding}' has no fused kernel (local, nearest)"
    b_u, b_r = layout.bits
    if b_u > 7 or b_r > 8:
        return f"split (b_u={b_u}, b_r={b_r}) too wide for the fused encoder"
    return None


def octopus_encode(codec, keys: torch.Tensor, block_t: int | None = None, defer=None) -> Encoded:
    """keys [..., T, d] (``[..., H, T, d]`` when the codec has per-head signs) -> the OCTAHEDRAL key codes
    of ``codec.fused_layout()`` (norm and fused triplet codes), as ``codec.encode(keys)`` writes them (for
    OCTOPUS-QJL: its OCTOPUS stage's fields)."""
    layout, dev = codec.fused_layout(), keys.device
    tables, rot_scale, consts = encoder_args(codec, layout, dev)
    check_input(keys, codec.head_dim, defer=defer)  # defer: Codec.encode's
    x = keys.reshape(-1, codec.head_dim).contiguous()
    N = x.shape[0]
    T, H = head_layout(tuple(keys.shape), layout.rotation.num_heads)
    lead = tuple(keys.shape[:-1])
    norm = torch.empty(lead + (1,), dtype=torch.float32, device=dev)
    u = torch.empty(lead + (consts["UB"],), dtype=torch.uint8, device=dev)
    # rows per program and warps: fewer for a decode step's few rows (rows_per_program)
    bt, warps = (block_t, 4) if block_t else rows_per_program(N)
    if N:
        _octopus_encode_kernel[(triton.cdiv(N, bt),)](
            x, *tables, norm, u, N, T, H, rot_scale, D=codec.head_dim, BT=bt, **consts,
            enable_fp_fusion=False, num_warps=warps,
        )
    fields = {layout.norm_field: norm, layout.codes_field: u}
    return Encoded(fields, tuple(keys.shape), keys.dtype)
