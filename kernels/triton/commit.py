"""A graphed decode step's per-layer codec work in one launch: :class:`FusedCommit`.

A graphed decode step (:mod:`adapters.cache.static_kv`) keeps a codec layer's native window in a ring of
R + 1 slots and its committed states in stores of fixed capacity. Each step it writes the step's key and
value into the free slot, attends, and commits the oldest window token: encoded as the eager commit
encodes it, written at the device position, its finiteness noted on the device. As separate operations
that is some 15 small kernels per layer (two window writes, two gathers of the slot, two encoders and
their two-launch non-finite notes, five field writes), each a few microseconds of launch and tail in a
captured step: most of the ~1 ms the codec added to a 7.3 ms step at 32k context over 28 layers
(docs/results.md). Here one launch does all of it, two programs per BT (sequence, KV head) rows, one for the
keys and one for the values (so the two encoders' latencies overlap rather than add up):

- writes the step's k (v) [B, H, 1, d] into ring slot ``new_slot`` (an index on the device);
- reads ring slot ``slot``, the oldest token (a ring of one slot, R = 0, commits the step's own token);
- encodes the key by :func:`.octopus_encode.octopus_rows` or :func:`.turboquant_encode.turboquant_rows`
  (the codec's ``fused_layout()`` says which) and the value by :func:`.value_encode.value_rows`: the
  standalone encoders' own bodies, so the same bytes as ``codec.encode`` and ``codec.encode_values`` on
  the fused path (a row's bytes do not depend on the rows encoded with it: :func:`._common.sum_rows`);
- writes every field of both states at token ``pos`` (on the device) of the stores' buffers;
- notes a key or value that is not finite in the device flags of the non-finite check
  (:meth:`kernels.checks.DeferredFinite.flag`), in place of its two launches a note.

It runs before the step's attention, which reads the new token from the ring, so the committed row is
in the store before the attention reads the store: the attention reads the store by per-sequence lengths
that end before ``pos``, so that row is masked out (as the rows past the lengths, which hold an earlier
rollout's tokens, are).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.fused_layout import KeyCodes
from kernels.triton import octopus_encode, turboquant_encode, value_encode
from kernels.triton._common import head_layout, rows_per_program
from kernels.triton.octopus_encode import octopus_rows
from kernels.triton.turboquant_encode import turboquant_rows
from kernels.triton.value_encode import value_rows

@triton.jit
def _oldest(NEW, RING, new_at, r64, slot, rm, sd, D: tl.constexpr, NP: tl.constexpr, SLOTS: tl.constexpr):
    """The committed token of each row as the encoders read it: fp32 [BT, NP], zero past the head dim."""
    c = tl.arange(0, NP)
    m = rm[:, None] & (c < D)[None, :]
    if SLOTS == 1:  # no window: the step's own token
        x = tl.load(NEW + new_at[:, None] + c[None, :] * sd, mask=m, other=0.0)
    else:
        x = tl.load(RING + ((r64 * SLOTS + slot) * D)[:, None] + c[None, :], mask=m, other=0.0)
    return x.to(tl.float32)


@triton.jit
def _note_nonfinite(FLAG, x, rows, rm):
    """NaN into the flag where a row of x holds a value that is not finite (NaN compares false with the
    largest float32)."""
    bad = tl.min((tl.abs(x) <= 3.4028234663852886e38).to(tl.int32), 1) == 0
    tl.store(FLAG + rows * 0, tl.full(rows.shape, float("nan"), tl.float32), mask=rm & bad)


@triton.jit
def _commit_kernel(
    K_NEW, V_NEW, RING_K, RING_V, NEW_SLOT, SLOT, POS,
    K_NORM, K_CODES, V_CODES, V_SCALE, V_ZERO, BAD_K, BAD_V,
    SIGNS, THR, GRID, RHO_THR,
    N, H, HR, CAP, skb, skh, skd, svb, svh, svd, rot_scale, QMAX,
    D: tl.constexpr, DP: tl.constexpr, SLOTS: tl.constexpr, BT: tl.constexpr,
    KEYS: tl.constexpr, NPK: tl.constexpr, LOG2K: tl.constexpr, KB: tl.constexpr, KR: tl.constexpr,
    NT: tl.constexpr, NTP: tl.constexpr, KCB: tl.constexpr, KCBP: tl.constexpr, LOCAL: tl.constexpr,
    NPV: tl.constexpr, GROUP: tl.constexpr, NG: tl.constexpr, VBITS: tl.constexpr, VCB: tl.constexpr,
    VCBP: tl.constexpr,
):
    rows = tl.program_id(0) * BT + tl.arange(0, BT)
    rm = rows < N
    r64 = rows.to(tl.int64)
    b = r64 // H
    h = r64 % H
    new_slot = tl.load(NEW_SLOT)
    slot = tl.load(SLOT)
    at = r64 * CAP + tl.load(POS)  # the committed token's row in the stores' [N, CAP, ...] buffers
    c = tl.arange(0, DP)
    cm = rm[:, None] & (c < D)[None, :]
    ring = ((r64 * SLOTS + new_slot) * D)[:, None] + c[None, :]
    # keys on axis 1's program 0, values on program 1: the two encoders run side by side, not one after the other
    if tl.program_id(1) == 0:
        k_at = b * skb + h * skh
        tl.store(RING_K + ring, tl.load(K_NEW + k_at[:, None] + c[None, :] * skd, mask=cm), mask=cm)  # the step's token
        xk = _oldest(K_NEW, RING_K, k_at, r64, slot, rm, skd, D, NPK, SLOTS)
        if KEYS == 0:
            norm, kc = octopus_rows(xk, r64 % HR, SIGNS, THR, GRID, RHO_THR, rot_scale,
                                    BT, NPK, LOG2K, NT, NTP, KB, KR, KCBP, LOCAL)
        else:
            norm, kc = turboquant_rows(xk, r64 % HR, SIGNS, THR, rot_scale, BT, NPK, LOG2K, KB, KCBP)
        tl.store(K_NORM + at, norm, mask=rm)
        # names of their own in each branch: Triton wants a name bound in both branches to keep one type
        jk = tl.arange(0, KCBP)
        tl.store(K_CODES + at[:, None] * KCB + jk[None, :], kc.to(tl.uint8), mask=rm[:, None] & (jk < KCB)[None, :])
        _note_nonfinite(BAD_K, xk, rows, rm)
    else:
        v_at = b * svb + h * svh
        tl.store(RING_V + ring, tl.load(V_NEW + v_at[:, None] + c[None, :] * svd, mask=cm), mask=cm)
        xv = _oldest(V_NEW, RING_V, v_at, r64, slot, rm, svd, D, NPV, SLOTS)
        packed, scale, zero = value_rows(xv, QMAX, BT, NPV, GROUP, NG, VBITS, VCBP)
        jv = tl.arange(0, VCBP)
        tl.store(V_CODES + at[:, None] * VCB + jv[None, :], packed.to(tl.uint8), mask=rm[:, None] & (jv < VCB)[None, :])
        g = tl.arange(0, NG)
        side = at[:, None] * NG + g[None, :]
        tl.store(V_SCALE + side, scale, mask=rm[:, None])
        tl.store(V_ZERO + side, zero, mask=rm[:, None])
        _note_nonfinite(BAD_V, xv, rows, rm)


def _key_side(codec, device) -> tuple[tuple[torch.Tensor, ...], float, dict, tuple[str, str]]:
    """The key encoder's tables (4 pointers), rotation scale and constexprs, as the commit kernel names them,
    and the key state's (norm, codes) fields."""
    layout = codec.fused_layout()
    fields = (layout.norm_field, layout.codes_field)
    if layout.keys == KeyCodes.OCTAHEDRAL:
        tables, scale, c = octopus_encode.encoder_args(codec, layout, device)
        return tables, scale, dict(KEYS=0, NPK=c["NP"], LOG2K=c["LOG2N"], KB=c["BU"], KR=c["BR"], NT=c["NT"],
                                   NTP=c["NTP"], KCB=c["UB"], KCBP=c["UBP"], LOCAL=c["LOCAL"]), fields
    (signs, thr), scale, c = turboquant_encode.encoder_args(codec, layout, device)
    return (signs, thr, thr, thr), scale, dict(KEYS=1, NPK=c["NP"], LOG2K=c["LOG2N"], KB=c["BITS"], KR=0, NT=1,
                                               NTP=1, KCB=c["CB"], KCBP=c["CBP"], LOCAL=False), fields


class FusedCommit:
    """One layer's window write and commit, bound to its buffers (module docstring); ``commit(k, v)`` per
    step, k and v [B, H, 1, d] (any strides).

    ``codec``: one :func:`kernels.triton.encoders.commit_unsupported` lets through. ``ring_k``, ``ring_v``:
    the window's slots [B, H, S, d], contiguous. ``keys``, ``values``: the stores' buffers by field, each
    [B, H, capacity, k] contiguous (the key state's fields and the value quantizer's "codes", "scale",
    "zero"). ``new_slot``, ``slot``, ``pos``: int64 [1] on the device, read at every launch. ``flags``: the
    (keys, values) flags of a :class:`kernels.checks.DeferredFinite`."""

    def __init__(self, codec, ring_k: torch.Tensor, ring_v: torch.Tensor, keys: dict, values: dict,
                 new_slot: torch.Tensor, slot: torch.Tensor, pos: torch.Tensor,
                 flags: tuple[torch.Tensor, torch.Tensor]):
        B, H, S, d = ring_k.shape
        dev = ring_k.device
        tables, rot_scale, kc, (norm, codes) = _key_side(codec, dev)
        qmax, vc = value_encode.encoder_args(codec.value_quantizer)
        fields = [keys[norm], keys[codes], values["codes"], values["scale"], values["zero"]]
        widths = [1, kc["KCB"], vc["CB"], vc["NG"], vc["NG"]]
        cap = fields[0].shape[2]
        for t, w in zip([ring_v] + fields, [d] + widths):
            if tuple(t.shape) != ((B, H, S) if t is ring_v else (B, H, cap)) + (w,) or not t.is_contiguous():
                raise ValueError(f"the commit writes contiguous [{B}, {H}, {S if t is ring_v else cap}, {w}] buffers, "
                                 f"got {tuple(t.shape)} (contiguous: {t.is_contiguous()})")
        if not ring_k.is_contiguous():
            raise ValueError("the commit writes a contiguous ring of window slots")
        _, hr = head_layout((B, H, 1, d), codec.fused_layout().rotation.num_heads)
        bt, self._warps = rows_per_program(B * H)
        self._grid = (triton.cdiv(B * H, bt), 2)  # axis 1: keys, values
        self._shape = (B, H, 1, d)
        self._front = (ring_k, ring_v, new_slot, slot, pos, *fields, *flags, *tables)
        self._sizes = (B * H, H, hr, cap)
        self._scalars = (rot_scale, qmax)
        self._consts = dict(D=d, DP=triton.next_power_of_2(d), SLOTS=S, BT=bt, **kc, NPV=vc["NP"],
                            GROUP=vc["GROUP"], NG=vc["NG"], VBITS=vc["BITS"], VCB=vc["CB"], VCBP=vc["CBP"])

    def __call__(self, k: torch.Tensor, v: torch.Tensor) -> None:
        if tuple(k.shape) != self._shape or tuple(v.shape) != self._shape:
            raise ValueError(f"the commit takes one token per sequence and head {self._shape}, got "
                             f"{tuple(k.shape)}, {tuple(v.shape)}")
        _commit_kernel[self._grid](
            k, v, *self._front, *self._sizes, k.stride(0), k.stride(1), k.stride(3), v.stride(0), v.stride(1),
            v.stride(3), *self._scalars, **self._consts, enable_fp_fusion=False, num_warps=self._warps,
        )
