"""Split-K flash-decoding attention over per-token scalar codes: the engines' KV-cache presets.

One decode step, ``q [B, Hq, 1, d]`` against a prefix stored as a codec's
:class:`kernels.token_layout.TokenLayout` declares it (fp8, int8 or b-bit codes with per-token or
per-tensor scales, zero points, codebooks, rotations) plus a native window ``[B, Hkv, W, d]``:

1. The query is rotated once by the key side's matrix (``q @ M_k^T``: scores are ``y . (M_k q)``).
2. ``_token_split_kernel``, grid ``(splits, B * Hkv)``: one program serves the G = Hq / Hkv query
   heads of one KV head (padded to 16) over one chunk of tokens; per block of BLOCK_N tokens it reads
   the key codes into registers as numbers (:func:`_codes_tile`), scores them on fp16 tensor cores
   (``[BLOCK_N, d] @ [d, GP]``) times the per-token scale, runs an online softmax, reads the values the
   same way (scale and offset applied) and accumulates ``out [GP, d] += p^T @ values``. It writes the
   normalised partial output (fp16) and the log2-sum-exp of each split, as
   :mod:`.decode_attention` does.
3. The partial outputs are rotated back by the value side's matrix, where it has one (one matmul over
   every split's partials: the merge is linear).
4. ``_combine_kernel`` (:mod:`.combine`, shared with :mod:`.decode_attention`) merges the splits and
   attends the native window in the same softmax.

No token is materialised in full precision outside registers. Codes are exact in fp16 (fp8, int8,
4-bit codes minus their zero point); per-token scales multiply the fp32 scores, block scales multiply the
codes before the fp16 tensor-core dot (an MX block of tiny values can then fall to fp16's subnormals);
a value is rounded to fp16 once, after its scale, as the table kernels round theirs.

Supported (else :func:`supports` says why and the dispatcher falls back to PyTorch): head dims that are
powers of two from 32 to 256, code widths of 1, 2, 3, 4 or 8 bits (and 5: ggml's q5 nibbles with their fifth
bits in a field of their own), block scales of 16 or more coordinates (a power of two; bytes, or numbers as
ggml's and MLX's are, with a zero per block where the format has one), normalization on the key side only. The query is the codec's ``prepare_query`` of q
(llama.cpp dots its cache with a q8 query); the native window sees q itself.
"""
from __future__ import annotations

import math
import weakref
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from kernels.triton import interpreting
from kernels.triton._unpack import _row_words, _unpack_tile
from kernels.triton.combine import Split, Tile, _store_partials, launch_combine
from kernels._lengths import as_lengths
from kernels.split_k import num_sms, split_plan
from kernels.token_layout import BlockScale, Element, Offset, TokenCodes, TokenLayout

_LOG2E = 1.4426950408889634
# Element / Offset as the kernel's integer constants
_ELEMENT = {Element.E4M3: 0, Element.E5M2: 1, Element.INT8: 2, Element.UINT: 3, Element.CODEBOOK: 4,
            Element.E2M1: 5}
_OFFSET = {Offset.NONE: 0, Offset.PACKED_ZP: 1, Offset.ZERO: 2}
_BLOCK_SCALE = {BlockScale.E4M3: 0, BlockScale.UE8M0: 1, BlockScale.FIELD: 2}


class SideFormat(NamedTuple):
    """How one side (keys or values) is stored, as the kernel reads it (its constexpr groups KEYS, VALUES;
    from the codec's :class:`kernels.token_layout.TokenCodes`)."""

    ELEMENT: int          #: what a code is: 0 e4m3, 1 e5m2, 2 int8, 3 unsigned int, 4 codebook index, 5 e2m1
    BITS: int             #: bits per code
    ROW_BYTES: int        #: bytes per token of the codes field
    HAS_SCALE: bool       #: a scale field (per token, or per block of GROUP coordinates)
    OFFSET: int           #: 0 none, 1 a zero point packed in the scale's low mantissa bits, 2 an additive zero field
    NORMALIZE: bool       #: the token's codes are scaled to unit norm (keys only)
    GROUP: int            #: coordinates per block scale (0: one scale per token)
    BLOCK_SCALE: int      #: a block scale's format: 0 e4m3, 1 ue8m0, 2 a number (the field's float dtype)
    ZERO_POINT: float     #: a constant taken from every code before its scale
    CHUNK: int            #: coordinates per chunk read at once (a scale block, or 64)
    HW_FP8: bool          #: e4m3 converted by the hardware (sm_89+ compiled), else by integer arithmetic
    HALVES: bool          #: 4-bit codes in ggml's order (byte j of a block of 32: coordinates j and j + 16)
    HIGH: bool            #: a fifth bit per coordinate in a field of its own (ggml's q5 ``qh``)


class SideFields(NamedTuple):
    """One side's state pointers of one (batch, KV head), at its token 0, and its per-tensor scale."""

    codes: object
    scale: object         #: the scale field (or a placeholder where there is none)
    zero: object          #: the zero field (or a placeholder)
    codebook: object      #: the codebook (or a placeholder)
    scale_const: object   #: the per-tensor scale, where there is no scale field
    high: object          #: the fifth-bit field (or a placeholder)


@triton.jit
def _e4m3(c):
    """fp8 e4m3 bit patterns (int32) as float32: the 7 magnitude bits are an fp16 pattern 2^8 too small
    (subnormals included); 0x7f / 0xff, e4m3's NaN, as NaN."""
    mag = (((c & 127) << 7).to(tl.int16).to(tl.float16, bitcast=True)).to(tl.float32) * 256.0
    y = tl.where((c & 128) != 0, -mag, mag)
    return tl.where((c & 127) == 127, float("nan"), y)


@triton.jit
def _chunk(CODES, SCALE, ZERO, offs, mask_n, C0: tl.constexpr, SIDE: tl.constexpr, CB, zp, HIGH):
    """Coordinates [C0, C0 + SIDE.CHUNK) of tokens ``offs`` as float32 [BLOCK_N, CHUNK]: the codes read as
    numbers (whole 32-bit words per thread, :mod:`._unpack`; ggml's nibbles byte by byte, with the fifth
    bits of its q5 types from ``HIGH``), less the constant and the packed zero point
    ``zp`` [BLOCK_N], times the block's scale and plus its zero where the chunk is one scale group
    (CHUNK == GROUP). 0 where masked."""
    CW: tl.constexpr = SIDE.CHUNK
    ROW: tl.constexpr = SIDE.ROW_BYTES
    if SIDE.HALVES:  # ggml: a block's byte j holds coordinate j (low nibble) and j + 16 (high); CHUNK is the block
        col = tl.arange(0, CW)
        byte = tl.load(CODES + offs[:, None] * ROW + C0 // 2 + (col % 16)[None, :], mask=mask_n[:, None], other=0)
        c = (byte.to(tl.int32) >> (4 * (col // 16))[None, :]) & 15
        if SIDE.HIGH:  # coordinate j's fifth bit: bit j % 8 of byte j / 8 (a little-endian uint32 per block)
            hb = tl.load(HIGH + offs[:, None] * (ROW // 4) + C0 // 8 + (col // 8)[None, :], mask=mask_n[:, None],
                         other=0)
            c = c | (((hb.to(tl.int32) >> (col % 8)[None, :]) & 1) << 4)
    elif SIDE.BITS == 8:  # bytes: a plain tile load, converted by the hardware where it can
        byte = tl.load(CODES + offs[:, None] * ROW + C0 + tl.arange(0, CW)[None, :], mask=mask_n[:, None], other=0)
        c = byte.to(tl.int32)
    else:
        w0, w1, w2 = _row_words(CODES + offs * ROW, mask_n, C0, CW, SIDE.BITS)
        c = _unpack_tile(w0, w1, w2, offs.shape[0], CW, SIDE.BITS, 0, 0.0, 0.0, CB)
    if SIDE.ELEMENT == 0:
        if SIDE.HW_FP8:
            y = byte.to(tl.float8e4nv, bitcast=True).to(tl.float32)
        else:
            y = _e4m3(c)
    elif SIDE.ELEMENT == 1:  # e5m2 is the high byte of an fp16
        y = ((c << 8).to(tl.int16).to(tl.float16, bitcast=True)).to(tl.float32)
    elif SIDE.ELEMENT == 2:  # int8, two's complement
        y = byte.to(tl.int8, bitcast=True).to(tl.float32)
    elif SIDE.ELEMENT == 3:
        y = c.to(tl.float32)
    elif SIDE.ELEMENT == 4:
        y = tl.load(CB + c)
    else:  # e2m1: magnitudes m / 2 below 2, then (2 + low bit) * 2^(m / 2 - 2)
        m = c & 7
        big = (2 + (m & 1)).to(tl.float32) * tl.exp2(((m >> 1) - 2).to(tl.float32))
        mag = tl.where(m < 2, m.to(tl.float32) * 0.5, big)
        y = tl.where((c & 8) != 0, -mag, mag)
    if SIDE.ZERO_POINT != 0.0:
        y = y - SIDE.ZERO_POINT
    if SIDE.OFFSET == 1:
        y = y - zp[:, None]
    if SIDE.GROUP > 0:  # one scale for the chunk's coordinates (and one zero)
        gi = offs * (ROW * 8 // SIDE.BITS // SIDE.GROUP) + C0 // SIDE.GROUP
        if SIDE.BLOCK_SCALE == 2:
            y = y * tl.load(SCALE + gi, mask=mask_n, other=0.0).to(tl.float32)[:, None]
        else:
            sb = tl.load(SCALE + gi, mask=mask_n, other=0).to(tl.int32)
            if SIDE.BLOCK_SCALE == 0:
                y = y * _e4m3(sb)[:, None]
            else:
                y = y * tl.exp2((sb - 127).to(tl.float32))[:, None]
        if SIDE.OFFSET == 2:
            y = y + tl.load(ZERO + gi, mask=mask_n, other=0.0).to(tl.float32)[:, None]
    return y


@triton.jit
def _token_scale(side: SideFields, offs, mask_n, SIDE: tl.constexpr):
    """One side's per-token factors of tokens ``offs``: (scale, zero point, additive zero), [BLOCK_N] each."""
    sc = tl.zeros([offs.shape[0]], tl.float32) + side.scale_const
    if SIDE.HAS_SCALE and SIDE.GROUP == 0:
        sc = tl.load(side.scale + offs, mask=mask_n, other=0.0).to(tl.float32)
    zp = tl.zeros([offs.shape[0]], tl.float32)
    if SIDE.OFFSET == 1:  # the zero point rides in the scale's low 4 mantissa bits
        bits = sc.to(tl.int32, bitcast=True)
        zp = (bits & 15).to(tl.float32)
        sc = (bits & -16).to(tl.float32, bitcast=True)
    zero = tl.zeros([offs.shape[0]], tl.float32)
    if SIDE.OFFSET == 2 and SIDE.GROUP == 0:  # per token (a group's zero is added to its codes by _chunk)
        zero = tl.load(side.zero + offs, mask=mask_n, other=0.0).to(tl.float32)
    return sc, zp, zero


@triton.jit
def _token_block(start, hi, state, query, keys: SideFields, values: SideFields, TILE: tl.constexpr,
                 KEYS: tl.constexpr, VALUES: tl.constexpr):
    """BLOCK_N tokens from ``start`` (prefix end ``hi``): scores, online softmax, values. ``query`` =
    (features^T per key chunk [K_CHUNK, GP] fp16, their sums [GP], the score scale into the log2 domain);
    state (m, l [GP], acc: chunks [V_CHUNK, GP]) -> the next state."""
    BLOCK_N: tl.constexpr = TILE.BLOCK_N
    D: tl.constexpr = TILE.HEAD_DIM
    m_i, l_i, acc = state
    fk, fsum, s_scale = query
    offs = start + tl.arange(0, BLOCK_N)
    mask_n = offs < hi
    ks, kzp, kz = _token_scale(keys, offs, mask_n, KEYS)
    # scores transposed, [BLOCK_N, GP]: the tokens on the M side of the tensor-core product
    raw = tl.zeros([BLOCK_N, fk[0].shape[1]], tl.float32)
    nrm2 = tl.zeros([BLOCK_N], tl.float32)
    for c in tl.static_range(D // KEYS.CHUNK):
        y = _chunk(keys.codes, keys.scale, keys.zero, offs, mask_n, c * KEYS.CHUNK, KEYS, keys.codebook, kzp,
                   keys.high)
        if KEYS.NORMALIZE:
            nrm2 += tl.sum(y * y, 1)
        raw = tl.dot(y.to(tl.float16), fk[c], raw)
    if KEYS.NORMALIZE:
        ks = ks / tl.sqrt(nrm2 + 1e-16)
    s = raw * ks[:, None] + kz[:, None] * fsum[None, :]
    s = tl.where(mask_n[:, None], s * s_scale, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 0))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[None, :])
    l_i = l_i * alpha + tl.sum(p, 0)
    p16 = p.to(tl.float16)
    vs, vzp, vz = _token_scale(values, offs, mask_n, VALUES)
    acc_new = ()
    for c in tl.static_range(D // VALUES.CHUNK):
        y = _chunk(values.codes, values.scale, values.zero, offs, mask_n, c * VALUES.CHUNK, VALUES, values.codebook,
                   vzp, values.high)
        v = tl.where(mask_n[:, None], y * vs[:, None] + vz[:, None], 0.0).to(tl.float16)
        acc_new = acc_new + (tl.dot(tl.trans(v), p16, acc[c] * alpha[None, :]),)
    return m_new, l_i, acc_new


@triton.jit(do_not_specialize=["T_alloc", "chunk", "num_splits"])
def _token_split_kernel(
    QF, KC, KS, KZ, KCB, KH, VC, VS, VZ, VCB, VH, LENS, OACC, OML,
    T_alloc, H, chunk, num_splits, k_scale, v_scale, sm_scale_log2,
    TILE: tl.constexpr, SPLIT: tl.constexpr, KEYS: tl.constexpr, VALUES: tl.constexpr,
):
    BLOCK_N: tl.constexpr = TILE.BLOCK_N
    GP: tl.constexpr = TILE.HEADS_PADDED
    D: tl.constexpr = TILE.HEAD_DIM
    K_CW: tl.constexpr = KEYS.CHUNK
    V_CW: tl.constexpr = VALUES.CHUNK
    pid_s = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    if SPLIT.HAS_LENS:
        L = tl.minimum(tl.load(LENS + b), T_alloc)
    else:
        L = T_alloc
    lo = pid_s * chunk
    hi = tl.minimum(lo + chunk, L)

    # the rotated query of the G heads in chunks [K_CW, GP] fp16, kept in range by a power of two
    g = tl.arange(0, GP)
    qrow = QF + (pid_bh * TILE.HEADS + g)[:, None] * D
    qn2 = tl.zeros([GP], tl.float32)
    for c in tl.static_range(D // K_CW):
        qc = tl.load(qrow + c * K_CW + tl.arange(0, K_CW)[None, :], mask=(g < TILE.HEADS)[:, None], other=0.0)
        qn2 += tl.sum(qc * qc, 1)
    qmax = tl.max(tl.sqrt(qn2), 0)
    qsc = tl.where(qmax > 16384.0, tl.exp2(tl.ceil(tl.log2(qmax / 16384.0))), 1.0)
    fk = ()
    fsum = tl.zeros([GP], tl.float32)  # what an additive key zero adds to each score
    for c in tl.static_range(D // K_CW):
        qc = tl.load(qrow + c * K_CW + tl.arange(0, K_CW)[None, :], mask=(g < TILE.HEADS)[:, None], other=0.0)
        f = tl.trans((qc / qsc).to(tl.float16))
        fsum += tl.sum(f.to(tl.float32), 0)
        fk = fk + (f,)
    query = (fk, fsum, sm_scale_log2 * qsc)

    t0 = pid_bh.to(tl.int64) * T_alloc  # this (batch, head)'s token 0
    KC += t0 * KEYS.ROW_BYTES
    VC += t0 * VALUES.ROW_BYTES
    KS += t0 * (D // KEYS.GROUP if KEYS.GROUP > 0 else 1)  # a scale per token, or per group of coordinates
    VS += t0 * (D // VALUES.GROUP if VALUES.GROUP > 0 else 1)
    KZ += t0 * (D // KEYS.GROUP if KEYS.GROUP > 0 else 1)  # a zero per token, or per group
    VZ += t0 * (D // VALUES.GROUP if VALUES.GROUP > 0 else 1)
    if KEYS.HIGH:  # a fifth bit per coordinate: d / 8 bytes a token
        KH += t0 * (KEYS.ROW_BYTES // 4)
    if VALUES.HIGH:
        VH += t0 * (VALUES.ROW_BYTES // 4)
    keys = SideFields(KC, KS, KZ, KCB, k_scale, KH)
    values = SideFields(VC, VS, VZ, VCB, v_scale, VH)
    m_i = tl.full([GP], -1.0e30, tl.float32)
    l_i = tl.zeros([GP], tl.float32)
    acc = ()  # transposed output accumulator, chunks [V_CW, GP]
    for c in tl.static_range(D // V_CW):
        acc = acc + (tl.zeros([V_CW, GP], tl.float32),)
    state = (m_i, l_i, acc)
    if SPLIT.STATIC_ITERS > 0:  # the interpreter cannot loop to a run-time bound
        for it in range(0, SPLIT.STATIC_ITERS):
            state = _token_block(lo + it * BLOCK_N, hi, state, query, keys, values, TILE, KEYS, VALUES)
    else:
        for start in range(lo, hi, BLOCK_N):
            state = _token_block(start, hi, state, query, keys, values, TILE, KEYS, VALUES)

    _store_partials(OACC, OML, state, pid_bh * num_splits + pid_s, g, TILE, V_CW)


def _hw_fp8(device) -> bool:
    """Whether e4m3 bytes convert in hardware (sm_89 and later), else by integer arithmetic (:func:`_e4m3`:
    older GPUs and the interpreter)."""
    dev = torch.device(device)
    return not interpreting() and dev.type == "cuda" and torch.cuda.get_device_capability(dev) >= (8, 9)


def supports(codec, q_dtype=torch.bfloat16) -> str | None:
    """None when this kernel handles the codec (from its declared token layout), else why not."""
    layout = codec.token_layout()
    if layout is None:
        return f"codec '{codec.name}' has no per-token fused kernel (it declares no token layout)"
    D = codec.head_dim
    if D < 32 or D > 256 or D & (D - 1):
        return f"head_dim {D} is not a power of two from 32 to 256"
    if q_dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return f"query dtype {q_dtype} not supported"
    for side in (layout.keys, layout.values):
        if side.bits not in (1, 2, 3, 4, 8):
            return f"code width {side.bits} not in (1, 2, 3, 4, 8)"
        if side.group is not None and (side.group < 16 or side.group & (side.group - 1) or side.bits == 3
                                       or side.group * side.bits % 32):
            return (f"block scales of {side.group} coordinates at {side.bits} bits "
                    "(the kernel reads groups of a power of two >= 16, at 1, 2, 4 or 8 bits)")
    if layout.values.normalize:
        return "normalized values (the kernel normalizes keys only)"
    return None


class _SidePlan:
    """One side's device constants: codebook and rotation on the device, the kernel's constexpr group."""

    def __init__(self, side: TokenCodes, D: int, device):
        self.side = side
        self.codebook = None if side.codebook is None else side.codebook.float().to(device).contiguous()
        self.rotation = None if side.rotation is None else side.rotation.float().to(device).contiguous()
        self.format = SideFormat(ELEMENT=_ELEMENT[side.element], BITS=side.bits, ROW_BYTES=side.row_bytes(D),
                                 HAS_SCALE=side.scale_field is not None, OFFSET=_OFFSET[side.offset],
                                 NORMALIZE=side.normalize, GROUP=side.group or 0,
                                 BLOCK_SCALE=_BLOCK_SCALE[side.block_scale], ZERO_POINT=float(side.zero_point),
                                 CHUNK=side.group or min(64, D),  # coordinates per chunk: a scale group, or 64
                                 HW_FP8=_hw_fp8(device), HALVES=side.halves, HIGH=side.high_field is not None)


_PLANS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _plans(codec, device) -> tuple[_SidePlan, _SidePlan]:
    """Built once per (codec, device) and kept while the codec lives (a decode loop asks every step)."""
    per_codec = _PLANS.setdefault(codec, {})
    key = str(device)
    if key not in per_codec:
        layout: TokenLayout = codec.token_layout()
        per_codec[key] = (_SidePlan(layout.keys, codec.head_dim, device),
                          _SidePlan(layout.values, codec.head_dim, device))
    return per_codec[key]


def _fields(state, plan: _SidePlan, fallback):
    side = plan.side
    t = state.tensors
    codes = t[side.codes_field].contiguous()
    scale = t[side.scale_field].contiguous() if side.scale_field else fallback
    zero = t[side.zero_field].contiguous() if side.zero_field else fallback
    high = t[side.high_field].contiguous() if side.high_field else fallback
    return codes, scale, zero, plan.codebook if plan.codebook is not None else fallback, high


def decode_attention_fused(q, key_state, value_state, codec, window_k=None, window_v=None, lengths=None,
                           window_lengths=None, scale=None, *, return_lse: bool = False, block_n: int = 64,
                           num_splits: int | None = None, num_warps: int = 4):
    """Fused decode attention over a token layout. Shapes as :func:`kernels.attention.decode_attention`;
    returns out [B, Hq, 1, d] in q's dtype, and with ``return_lse`` also lse [B, Hq] float32 (the natural
    log-sum-exp of the scaled scores). ``block_n`` tokens per block (a multiple of 64); ``num_splits``
    splits per (batch, KV head) (default: sized to fill the device)."""
    B, Hq, Tq, D = q.shape
    assert Tq == 1, "decode attention takes one query token"
    dev = q.device
    kp, vp = _plans(codec, dev)
    codes_k = key_state.tensors[kp.side.codes_field]
    Hkv, T = codes_k.shape[-3], codes_k.shape[-2]
    G = Hq // Hkv
    GP = max(16, triton.next_power_of_2(G))
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    lens = None if lengths is None else as_lengths(lengths, B, dev)
    qf = codec.prepare_query(q).reshape(B * Hq, D).float()  # as the engine dots it with its cache (llama.cpp: q8)
    if kp.rotation is not None:  # scores are y . (M q): rotate the query once
        qf = qf @ kp.rotation.T
    qf = qf.contiguous()

    # 4 programs of 4 warps per SM
    num_splits, chunk, per = split_plan(T, block_n, B * Hkv, 4 * num_sms(dev), num_splits)

    kc, ks, kz, kcb, kh = _fields(key_state, kp, qf)
    vc, vs, vz, vcb, vh = _fields(value_state, vp, qf)
    oacc = torch.empty(B * Hkv * num_splits * GP, D, dtype=torch.float16, device=dev)
    oml = torch.empty(B * Hkv * num_splits * GP, dtype=torch.float32, device=dev)
    sm_scale_log2 = scale * _LOG2E
    _token_split_kernel[(num_splits, B * Hkv)](
        qf, kc, ks, kz, kcb, kh, vc, vs, vz, vcb, vh, lens if lens is not None else qf, oacc, oml,
        T, Hkv, chunk, num_splits, float(kp.side.scale), float(vp.side.scale), sm_scale_log2,
        TILE=Tile(HEAD_DIM=D, BLOCK_N=block_n, HEADS=G, HEADS_PADDED=GP),
        SPLIT=Split(STATIC_ITERS=per if interpreting() else 0, HAS_LENS=lens is not None),
        KEYS=kp.format, VALUES=vp.format, num_warps=num_warps,
    )
    if vp.rotation is not None:  # partials back to the model's frame: the merge below is linear in them
        oacc = (oacc.float() @ vp.rotation).to(torch.float16)

    out, lse, _ = launch_combine(q, window_k, window_v, window_lengths, oacc, oml, Hkv, GP, num_splits,
                                 sm_scale_log2, return_lse)
    return (out, lse) if return_lse else out
