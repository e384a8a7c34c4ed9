"""Fused value encoder: per-token group-wise asymmetric quantization and bit packing in one kernel.

Writes the state of :meth:`kernels.values.ValueQuantizer.encode` byte for byte ("codes" uint8
[..., T, BitField(padded, bits).nbytes], "scale" and "zero" fp16 [..., T, padded / group]): the
same operations in the same order (group minimum and maximum, the fp16 zero point, the scale
(max - zero) / qmax rounded to fp16, IEEE division, round half to even, clamp), so nothing moves
across a rounding boundary. One launch instead of the reference's ~30 small PyTorch operations
and its two device syncs (the packer's range check): a decode step encodes one token per layer,
so the reference's launches, not its arithmetic, were the cost (scripts/gpu_profile_generate.py).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton import unavailable as triton_unavailable
from kernels.encoded import Encoded
from kernels.triton._common import load_rows, pack_bytes, rows_per_program


@triton.jit
def _round_half_even(y):
    """torch.round of fp32 y (ties to even), exactly: y - floor(y) is exact where it matters (the
    result is clamped at 0, so y < 0 only has to stay <= 0)."""
    f = tl.floor(y)
    d = y - f
    h = f * 0.5
    odd = (h - tl.floor(h)) != 0.0
    return f + tl.where((d > 0.5) | ((d == 0.5) & odd), 1.0, 0.0)


@triton.jit
def value_rows(
    x, QMAX, BT: tl.constexpr, NP: tl.constexpr, GROUP: tl.constexpr, NG: tl.constexpr, BITS: tl.constexpr,
    CBP: tl.constexpr,
):
    """BT values x fp32 [BT, NP] (zero past the head dim: the reference's padding) -> (packed codes int32
    [BT, CBP], scale fp16 [BT, NG], zero fp16 [BT, NG]). The encoder's whole body: the standalone kernel
    below and the decode step's fused commit (:mod:`.commit`) both run it."""
    g = tl.reshape(x, [BT, NG, GROUP])
    lo = tl.min(g, 2)
    hi = tl.max(g, 2)
    zero = lo.to(tl.float16)
    zf = zero.to(tl.float32)
    scale = tl.div_rn(hi - zf, QMAX).to(tl.float16)
    sf = scale.to(tl.float32)
    safe = tl.where(sf > 0, sf, 1.0)
    y = tl.div_rn(g - zf[:, :, None], safe[:, :, None])
    r = tl.minimum(tl.maximum(_round_half_even(y), 0.0), QMAX)
    codes = tl.reshape(r.to(tl.int32), [BT, NP])
    return pack_bytes(codes, NP, NP, BITS, CBP), scale, zero


# token counts change with every call: no specialisation on them (one compiled kernel for all)
@triton.jit(do_not_specialize=["N"])
def _value_encode_kernel(
    X, CODES, SCALE, ZERO, N, QMAX,
    D: tl.constexpr, NP: tl.constexpr, GROUP: tl.constexpr, NG: tl.constexpr, BITS: tl.constexpr,
    CB: tl.constexpr, CBP: tl.constexpr, BT: tl.constexpr,
):
    rows, rm, x = load_rows(X, N, D, NP, BT)  # coordinates past the head dim: the reference's zero padding
    packed, scale, zero = value_rows(x, QMAX, BT, NP, GROUP, NG, BITS, CBP)
    j = tl.arange(0, CBP)
    tl.store(CODES + rows[:, None].to(tl.int64) * CB + j[None, :], packed.to(tl.uint8),
             mask=rm[:, None] & (j < CB)[None, :])
    k = tl.arange(0, NG)
    side = rows[:, None].to(tl.int64) * NG + k[None, :]
    tl.store(SCALE + side, scale, mask=rm[:, None])
    tl.store(ZERO + side, zero, mask=rm[:, None])


def value_encoder_unsupported(vq, device) -> str | None:
    """None when the fused encoder writes ``vq``'s (a :class:`kernels.values.ValueQuantizer`) state
    on ``device``, else why not."""
    from kernels.values import ValueQuantizer

    if not isinstance(vq, ValueQuantizer):
        return f"values in {type(vq).__name__}'s own format, not the per-token group quantizer"
    why = triton_unavailable(device)
    if why is not None:
        return why
    ng = vq.padded // vq.group
    if not 1 <= vq.bits <= 8:
        return f"value bits {vq.bits} outside 1..8"
    if vq.group & (vq.group - 1) or ng & (ng - 1):
        return f"value group {vq.group} x {ng} groups: the fused encoder needs powers of two"
    return None


def encoder_args(vq) -> tuple[float, dict]:
    """What :func:`value_rows` takes for ``vq`` (a :class:`kernels.values.ValueQuantizer` it covers): QMAX and
    the constexprs (``CB``: the row's code bytes)."""
    NP, G, CB = vq.padded, vq.group, vq.field.nbytes
    return float((1 << vq.bits) - 1), dict(NP=NP, GROUP=G, NG=NP // G, BITS=vq.bits, CB=CB,
                                           CBP=triton.next_power_of_2(CB))


def value_encode(vq, values: torch.Tensor, block_t: int | None = None) -> Encoded:
    """values [..., T, d] (fp32/fp16/bf16, checked by the caller) -> ``vq.encode(values)``'s state."""
    why = value_encoder_unsupported(vq, values.device)
    if why:
        raise ValueError(why)
    qmax, consts = encoder_args(vq)
    x = values.reshape(-1, vq.head_dim)
    if not x.is_contiguous():
        x = x.contiguous()
    N = x.shape[0]
    lead = tuple(values.shape[:-1])
    dev = values.device
    codes = torch.empty(lead + (consts["CB"],), dtype=torch.uint8, device=dev)
    scale = torch.empty(lead + (consts["NG"],), dtype=torch.float16, device=dev)
    zero = torch.empty(lead + (consts["NG"],), dtype=torch.float16, device=dev)
    # rows per program and warps: fewer for a decode step's few rows (rows_per_program)
    bt, warps = (block_t, 4) if block_t else rows_per_program(N)
    if N:
        _value_encode_kernel[(triton.cdiv(N, bt),)](
            x, codes, scale, zero, N, qmax, D=vq.head_dim, BT=bt, **consts,
            enable_fp_fusion=False, num_warps=warps,
        )
    return Encoded({"codes": codes, "scale": scale, "zero": zero}, tuple(values.shape), values.dtype)
