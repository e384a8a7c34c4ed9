"""Fused TurboQuant-MSE key encoder: norm, rotation, nearest coordinate centroid and bit packing in
one kernel; it writes the reference state of SCALAR key codes (:class:`kernels.fused_layout.FusedLayout`,
TurboQuant-MSE):
"norm" fp32 [..., T, 1], "codes" uint8 [..., T, BitField(d_pad, b).nbytes].

Same operations as the reference (IEEE division and square root, the reference butterfly order),
so codes match byte for byte except where the key norm's summation order moves a rotated
coordinate across a decision threshold (tests/kernels/triton/test_triton_encode.py states the tolerance).
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
from kernels.triton._common import (count_below, fwht_rows, head_layout, load_rows, pack_bytes, rotation_signs, rows_per_program,
                      sum_rows, thresholds)


@triton.jit
def turboquant_rows(
    x, head, SIGNS, THR, rot_scale,
    BT: tl.constexpr, NP: tl.constexpr, LOG2N: tl.constexpr, BITS: tl.constexpr, CBP: tl.constexpr,
):
    """BT keys x fp32 [BT, NP] (zero past the head dim), each of rotation head ``head`` [BT] -> (norm fp32
    [BT], the row's packed codes int32 [BT, CBP]). The encoder's whole body: the standalone kernel below and
    the decode step's fused commit (:mod:`.commit`) both run it."""
    cols = tl.arange(0, NP)
    norm = tl.sqrt_rn(sum_rows(x * x, BT, NP, LOG2N))
    unit = tl.div_rn(x, tl.where(norm > 0, norm, 1.0)[:, None])
    sg = tl.load(SIGNS + head[:, None] * NP + cols[None, :])
    y = fwht_rows(unit * sg, BT, NP, LOG2N) * rot_scale
    codes = count_below(y, THR, (1 << BITS) - 1)
    return norm, pack_bytes(codes, NP, NP, BITS, CBP)


# token counts change with every call: no specialisation on them (one compiled kernel for all)
@triton.jit(do_not_specialize=["N", "T"])
def _turboquant_encode_kernel(
    X, SIGNS, THR, NORM_OUT, C_OUT, N, T, H, rot_scale,
    D: tl.constexpr, NP: tl.constexpr, LOG2N: tl.constexpr, BT: tl.constexpr, BITS: tl.constexpr,
    CB: tl.constexpr, CBP: tl.constexpr,
):
    rows, rm, x = load_rows(X, N, D, NP, BT)
    norm, packed = turboquant_rows(x, (rows // T) % H, SIGNS, THR, rot_scale, BT, NP, LOG2N, BITS, CBP)
    tl.store(NORM_OUT + rows, norm, mask=rm)
    j = tl.arange(0, CBP)
    tl.store(C_OUT + rows[:, None].to(tl.int64) * CB + j[None, :], packed.to(tl.uint8),
             mask=rm[:, None] & (j < CB)[None, :])


# per codec, per device; weak keys so the tables go when the codec does
_TABLES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def supports(layout: FusedLayout | None) -> str | None:
    """None when this encoder writes ``layout``'s key codes, else why not."""
    if layout is None or layout.keys != KeyCodes.SCALAR:
        return f"not a TurboQuant (scalar-code) key layout: {layout.keys.value if layout else 'no fused layout'}"
    if layout.bits[0] > 8:
        return f"code width {layout.bits[0]} > 8"
    return None


def encoder_args(codec, layout: FusedLayout, device) -> tuple[tuple[torch.Tensor, ...], float, dict]:
    """What :func:`turboquant_rows` takes for ``codec``'s ``layout`` (its ``fused_layout()``) on ``device``:
    its tables (signs, coordinate thresholds), the rotation's scale and the constexprs (``CB``: the row's
    bytes)."""
    why = supports(layout)
    if why:
        raise ValueError(why)
    per = _TABLES.setdefault(codec, {})
    tab = per.get(str(device))
    if tab is None:
        tab = per[str(device)] = (rotation_signs(layout.rotation, device), thresholds(layout.codebooks[0]).to(device))
    NP, CB = layout.padded, layout.codes.nbytes
    consts = dict(NP=NP, LOG2N=NP.bit_length() - 1, BITS=layout.bits[0], CB=CB, CBP=triton.next_power_of_2(CB))
    return tab, 1.0 / math.sqrt(NP), consts


def turboquant_mse_encode(codec, keys: torch.Tensor, block_t: int | None = None, defer=None) -> Encoded:
    """keys [..., T, d] -> the SCALAR key codes of ``codec.fused_layout()`` ("norm", "codes"), as
    ``codec.encode(keys)`` writes them (for TurboQuant-prod: its (b-1)-bit MSE stage's fields)."""
    layout, dev = codec.fused_layout(), keys.device
    tables, rot_scale, consts = encoder_args(codec, layout, dev)
    check_input(keys, codec.head_dim, defer=defer)  # defer: Codec.encode's
    x = keys.reshape(-1, codec.head_dim).contiguous()
    N = x.shape[0]
    T, H = head_layout(tuple(keys.shape), layout.rotation.num_heads)
    lead = tuple(keys.shape[:-1])
    norm = torch.empty(lead + (1,), dtype=torch.float32, device=dev)
    codes = torch.empty(lead + (consts["CB"],), dtype=torch.uint8, device=dev)
    # rows per program and warps: fewer for a decode step's few rows (rows_per_program)
    bt, warps = (block_t, 4) if block_t else rows_per_program(N)
    if N:
        _turboquant_encode_kernel[(triton.cdiv(N, bt),)](
            x, *tables, norm, codes, N, T, H, rot_scale, D=codec.head_dim, BT=bt, **consts,
            enable_fp_fusion=False, num_warps=warps,
        )
    return Encoded({layout.norm_field: norm, layout.codes_field: codes}, tuple(keys.shape), keys.dtype)
