"""Device helpers that read the codecs' packed per-token fields inside the fused kernels.

Layouts (kernels.packing.BitField): code i of a token's row sits at bits [i*BITS, (i+1)*BITS),
LSB first; rows of ``NCODES * BITS % 32 == 0`` bits are read as 32-bit words. Each thread keeps
whole words and all the codes in them: :func:`_codes` builds the code axis with ``tl.join``
from constant shifts, so no tile needs a layout conversion before it is consumed.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _leaf(w0, w1, w2, OFF: tl.constexpr, BITS: tl.constexpr, MODE: tl.constexpr, sc, zr, CB):
    """The BITS-bit code at bit OFF of the little-endian words w0 | w1 << 32 | w2 << 64, as
    MODE 0: int32 code; 1: fp16 zero + scale * code; 2: fp16 codebook CB[code]; 3: fp16 bit (0/1)."""
    if OFF // 32 == 0:
        lo = w0
        nx = w1
    elif OFF // 32 == 1:
        lo = w1
        nx = w2
    else:
        lo = w2
        nx = w2
    c = lo >> (OFF % 32)
    if OFF % 32 + BITS > 32:  # the code continues in the next word
        c = c | (nx << (32 - OFF % 32))
    c = (c & ((1 << BITS) - 1)).to(tl.int32)
    if MODE == 1:
        f = (c | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0  # exact int -> float
        return (f * sc + zr).to(tl.float16)
    elif MODE == 2:
        return tl.load(CB + c).to(tl.float16)
    elif MODE == 3:
        return c.to(tl.float16)
    else:
        return c


@triton.jit
def _codes(w0, w1, w2, OFF: tl.constexpr, STEP: tl.constexpr, K: tl.constexpr, BITS: tl.constexpr,
           MODE: tl.constexpr, sc, zr, CB):
    """Codes at bit offsets OFF + k * STEP (k < K) of each word (group), stacked on log2(K) new
    trailing axes of size 2 in the order of k's bits, so that a reshape flattens them as k: every
    thread keeps the K codes of its words in registers and the shifts are constants."""
    if K == 1:
        return _leaf(w0, w1, w2, OFF, BITS, MODE, sc, zr, CB)
    else:
        return tl.join(_codes(w0, w1, w2, OFF, 2 * STEP, K // 2, BITS, MODE, sc, zr, CB),
                       _codes(w0, w1, w2, OFF + STEP, 2 * STEP, K // 2, BITS, MODE, sc, zr, CB))


@triton.jit
def _row_words(row, mask_n, C0: tl.constexpr, NCODES: tl.constexpr, BITS: tl.constexpr):
    """Word tiles holding codes [C0, C0 + NCODES) of packed rows (4-byte aligned; C0 a multiple
    of 32). -> (w0, w1, w2) [BLOCK_N, NW] uint32: for BITS in (1, 2, 4, 8) w0 holds word j
    (w1 = w2 = w0); for BITS = 3, (w0, w1, w2) are the three words of each 96-bit group of 32 codes."""
    wp = row.to(tl.pointer_type(tl.uint32)) + C0 * BITS // 32
    if 32 % BITS == 0:
        # one word per thread element: a vectorised (16-byte) load would give the tile a layout that
        # the code tree below must convert through shared memory
        wi = tl.max_contiguous(tl.arange(0, NCODES * BITS // 32), 1)
        w0 = tl.load(wp[:, None] + wi[None, :], mask=mask_n[:, None], other=0)
        w1 = w0
        w2 = w0
    else:
        base = wp[:, None] + 3 * tl.arange(0, NCODES // 32)[None, :]
        w0 = tl.load(base, mask=mask_n[:, None], other=0)
        w1 = tl.load(base + 1, mask=mask_n[:, None], other=0)
        w2 = tl.load(base + 2, mask=mask_n[:, None], other=0)
    return w0, w1, w2


@triton.jit
def _unpack_tile(w0, w1, w2, BLOCK_N: tl.constexpr, NCODES: tl.constexpr, BITS: tl.constexpr,
                 MODE: tl.constexpr, sc, zr, CB):
    """Words from :func:`_row_words` -> [BLOCK_N, NCODES] (code i of a row at bits [i*BITS, ...),
    kernels.packing.BitField), converted as :func:`_leaf` says."""
    K: tl.constexpr = 32 // BITS if 32 % BITS == 0 else 32
    return tl.reshape(_codes(w0, w1, w2, 0, BITS, K, BITS, MODE, sc, zr, CB), [BLOCK_N, NCODES])


@triton.jit
def _bit_window(WORDS, bit0, mask, nwords, THREE: tl.constexpr):
    """The 64 bits from absolute bit offset bit0 (int64 tensor) of a 4-byte aligned byte array
    read as uint32 words (nwords of them): two aligned words and a funnel shift, a third word
    when THREE (else only the low 64 - (bit0 % 32) >= 33 bits are valid). -> uint64."""
    wi = bit0 >> 5
    sh = (bit0 & 31).to(tl.uint64)
    w0 = tl.load(WORDS + wi, mask=mask, other=0).to(tl.uint64)
    w1 = tl.load(WORDS + wi + 1, mask=mask & (wi + 1 < nwords), other=0).to(tl.uint64)
    win = ((w1 << 32) | w0) >> sh
    if THREE:
        w2 = tl.load(WORDS + wi + 2, mask=mask & (wi + 2 < nwords), other=0).to(tl.uint64)
        win = (win & 0xFFFFFFFF) | ((((w2 << 32) | w1) >> sh) << 32)
    return win


@triton.jit
def _octa_lane(uw, K: tl.constexpr, OC, RHO, BU: tl.constexpr, BR: tl.constexpr):
    """Triplet K of the 4-triplet groups whose fused codes u | v << BU | r << 2 BU are the bit
    window uw -> rotated-frame (x, y, z), each fp16: rho_c[r] * octa_decode(oc[u], oc[v])."""
    W: tl.constexpr = 2 * BU + BR
    code = ((uw >> (K * W)) & ((1 << W) - 1)).to(tl.int32)
    cu = tl.load(OC + (code & ((1 << BU) - 1)))
    cv = tl.load(OC + ((code >> BU) & ((1 << BU) - 1)))
    if BR > 0:
        rho = tl.load(RHO + (code >> (2 * BU)))
    else:
        rho = tl.load(RHO)
    au = tl.abs(cu)
    av = tl.abs(cv)
    z = 1.0 - au - av
    lower = z < 0
    # lower hemisphere: (1 - |v|, 1 - |u|) with the signs of (u, v) (centroids are never 0),
    # the sign copied bitwise: one LOP3 instead of a compare and a predicated add
    sign = -2147483648
    fx = ((1.0 - av).to(tl.int32, bitcast=True) | (cu.to(tl.int32, bitcast=True) & sign)).to(tl.float32, bitcast=True)
    fy = ((1.0 - au).to(tl.int32, bitcast=True) | (cv.to(tl.int32, bitcast=True) & sign)).to(tl.float32, bitcast=True)
    x = tl.where(lower, fx, cu)
    y = tl.where(lower, fy, cv)
    inv = rho * tl.rsqrt(x * x + y * y + z * z)
    return (x * inv).to(tl.float16), (y * inv).to(tl.float16), (z * inv).to(tl.float16)


@triton.jit
def _octa_chunk(KA, rows, mask_n, OC, RHO, ka_words, BLOCK_N: tl.constexpr, T0: tl.constexpr,
                TN: tl.constexpr, BU: tl.constexpr, BR: tl.constexpr, UB: tl.constexpr):
    """Triplets [T0, T0 + TN) of the tokens at global rows ``rows`` (int64) -> (x, y, z) fp16
    [BLOCK_N, TN]. Each thread element reads the fused codes of 4 consecutive triplets
    (:class:`kernels.fused_layout.TripletCodes`, 4 (2 BU + BR) <= 64 bits) as one bit window (rows
    are not word aligned) and decodes them as four lanes, joined so that each thread holds 4
    consecutive triplets of a token. Triplets past the last decode whatever bits follow (finite:
    every code is a valid index); the query features of those columns are zero."""
    W: tl.constexpr = 2 * BU + BR
    j = T0 + 4 * tl.arange(0, TN // 4)
    ubit = (rows * (8 * UB))[:, None] + (j * W)[None, :]
    uw = _bit_window(KA.to(tl.pointer_type(tl.uint32)), ubit, mask_n[:, None], ka_words, 4 * W > 33)
    x0, y0, z0 = _octa_lane(uw, 0, OC, RHO, BU, BR)
    x1, y1, z1 = _octa_lane(uw, 1, OC, RHO, BU, BR)
    x2, y2, z2 = _octa_lane(uw, 2, OC, RHO, BU, BR)
    x3, y3, z3 = _octa_lane(uw, 3, OC, RHO, BU, BR)
    x = tl.reshape(tl.join(tl.join(x0, x2), tl.join(x1, x3)), [BLOCK_N, TN])
    y = tl.reshape(tl.join(tl.join(y0, y2), tl.join(y1, y3)), [BLOCK_N, TN])
    z = tl.reshape(tl.join(tl.join(z0, z2), tl.join(z1, z3)), [BLOCK_N, TN])
    return x, y, z


@triton.jit
def _prefetch_rows(field, s0, s1, ROWB: tl.constexpr):
    """Prefetch tokens [s0, s1) of a per-token field with ROWB bytes per token into L1: one
    prefetch per 128-byte line (the lines of a block are contiguous within a (batch, head))."""
    b0 = s0 * ROWB
    off = tl.minimum(b0 + tl.arange(0, 64) * 128, tl.maximum(s1 * ROWB - 1, 0))
    p = field.to(tl.pointer_type(tl.uint8)) + off
    tl.inline_asm_elementwise("prefetch.global.L1 [$1];\n\tmov.u32 $0, 0;", "=r,l", [p], dtype=tl.int32,
                              is_pure=False, pack=1)
