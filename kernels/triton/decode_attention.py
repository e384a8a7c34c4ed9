"""Split-K flash-decoding attention that reads packed key codes and group-quantized values.

One decode step, ``q [B, Hq, 1, d]`` against a compressed prefix (codec states for keys and
values ``[B, Hkv, T, ...]``) plus a native window ``[B, Hkv, W, d]``:

1. ``_split_kernel``, grid ``(splits, B * Hkv)``: one program serves every query head of one KV
   head (GQA: the codes are read once for the G = Hq / Hkv heads, padded to 16), over one
   contiguous chunk of tokens. It rotates the query once (tensor-core dots with the codec's
   exact ±1 rotation matrix, and the QJL sketch where there is one), then per block of BLOCK_N
   tokens rebuilds the rotated keys in registers from the packed codes (OCTOPUS: octahedral
   decode of (u, v) times the triplet norm, 16 triplets at a time; TurboQuant: coordinate
   centroids, 64 at a time), scores them transposed, s^T [BLOCK_N, G] = keys @ features^T, on
   fp16 tensor cores (tokens on the M side: wgmma on Hopper), adds the QJL correction, runs an
   online softmax, dequantizes the values (zero + scale * code) and accumulates
   out^T [d, G] += values^T @ p^T. It writes the normalised output (fp16) and the log-sum-exp
   of each split. The block one ahead is prefetched into L1 while a block is computed.
2. ``_combine_kernel`` (:mod:`.combine`), grid ``(B * Hq, d / 32)``: merges the splits by log-sum-exp, attends the
   native window in the same softmax and writes the output.

No key is materialised in full precision: per block only the rotated reconstruction of BLOCK_N
tokens lives in registers (and its tensor-core staging copy in shared memory). Scores are in the
log2 domain throughout (exp2).

Packed fields are unpacked with each thread holding whole words and all the codes in them
(:func:`_codes` builds the code axis from constant shifts with ``tl.join``), which keeps the
tiles in registers without layout conversions.

What the kernel reads is the codec's declared :class:`kernels.fused_layout.FusedLayout` (through
:mod:`.decode_plan`), compiled into the constants of :class:`.decode_plan.KeyFormat` (OCTA: octahedral
triplets, else scalar codes; HAS_QJL: a QJL residual; SKETCH_SPLIT: its query features stored as bf16
hi + lo) and :class:`.decode_plan.ValueFormat`; with :class:`.combine.Tile`, :class:`.combine.Split` and
:class:`Tuning` they are the kernel's compile-time constants, in named groups.

Supported (else :func:`supports` says why and the dispatcher falls back to PyTorch): head dims
that are powers of two >= 32; scalar code widths of 1, 2, 3, 4 or 8 bits, fused octahedral triplet
codes (:class:`kernels.fused_layout.TripletCodes`) of at most 16 bits; a QJL sketch of d rows; value bits
1, 2, 3, 4 or 8 with a power-of-two group.

:func:`decode_attention_fused` is the launcher (as in :mod:`.token_attention`); its keyword-only knobs
past ``combine_block`` are for benchmarks and profiling (register caps, prefetch, ablations, the compiled
kernels).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from kernels.triton import interpreting
from kernels.triton._unpack import _octa_chunk, _prefetch_rows, _row_words, _unpack_tile
from kernels.triton.combine import Split, Tile, _store_partials, launch_combine
from kernels._lengths import as_lengths
from kernels.fused_layout import KeyCodes
from kernels.split_k import num_sms, split_plan
from kernels.triton.decode_plan import plan_for

_LOG2E = 1.4426950408889634


class Tuning(NamedTuple):
    """Knobs that change speed, not results (compile-time)."""

    PREFETCH: int         #: blocks ahead prefetched into L1 (0: none; the interpreter)
    ABLATE: int           #: profiling only, bits: 1 no key decode, 2 no value decode (the output is garbage)


class KeyFields(NamedTuple):
    """The key state's pointers of one (batch, KV head), read per block by :func:`_attend_block`."""

    norm: object          #: fp32 norm per token, at the (batch, head)'s token 0
    codes: object         #: the codes field, at the (batch, head)'s token 0
    codes_base: object    #: the codes field's start (OCTOPUS reads bit windows from it: rows are not word aligned)
    codes_words: object   #: 32-bit words of the codes field
    t0: object            #: the (batch, head)'s token 0, a row of codes_base
    qjl_bits: object      #: QJL sign bits, at token 0 (HAS_QJL)
    qjl_norm: object      #: fp16 residual norm per token, at token 0 (HAS_QJL)
    codebook: object      #: OCTOPUS: coordinate centroids; scalar codes: the centroids
    rho: object           #: OCTOPUS: the triplet lengths' centroids


class ValueFields(NamedTuple):
    """The value state's pointers of one (batch, KV head), at its token 0."""

    codes: object
    scale: object
    zero: object


class QueryFeatures(NamedTuple):
    """The query side of the scores, made once per program: ``keys`` (features^T per key chunk, [K, GP]
    fp16), ``qjl`` (the QJL sketch's, chunks [CHUNK, GP]) and ``qjl_sum`` (their sums, [GP]), the score
    scale into the log2 domain and the QJL estimator's coefficient."""

    keys: object
    qjl: object
    qjl_sum: object
    scale: object
    qjl_coef: object


@triton.jit
def _qfeat(q, qm, COL0: tl.constexpr, NCOL: tl.constexpr, NQ: tl.constexpr, D: tl.constexpr):
    """q [GP, D] fp32 @ QM[:, COL0:COL0+NCOL] -> [GP, NCOL] fp32. QM entries are exact in bf16 and
    q is exact in tf32, so the tensor-core product only rounds in the fp32 accumulation."""
    m = tl.load(qm + tl.arange(0, D)[:, None] * NQ + COL0 + tl.arange(0, NCOL)[None, :]).to(tl.float32)
    return tl.dot(q, m, input_precision="tf32")


@triton.jit
def _attend_block(start, hi, state, query: QueryFeatures, keys: KeyFields, values: ValueFields, TILE: tl.constexpr,
                  KEYS: tl.constexpr, VALUES: tl.constexpr, TUNING: tl.constexpr):
    """One block of BLOCK_N tokens from ``start`` (prefix end ``hi``): scores, online softmax, values.
    state (m, l [GP], acc: chunks [CHUNK, GP]) -> the next state. Offsets are int32."""
    BLOCK_N: tl.constexpr = TILE.BLOCK_N
    D: tl.constexpr = TILE.HEAD_DIM
    CW: tl.constexpr = KEYS.CHUNK
    TN: tl.constexpr = KEYS.TRIPLET_TILE
    NCH: tl.constexpr = KEYS.TRIPLET_CHUNKS
    ABLATE: tl.constexpr = TUNING.ABLATE
    m_i, l_i, acc = state
    fk = query.keys
    if TUNING.PREFETCH > 0:  # the block PREFETCH blocks ahead goes to L1 while this one is computed
        n0 = start + TUNING.PREFETCH * BLOCK_N
        n1 = tl.minimum(n0 + BLOCK_N, hi)
        _prefetch_rows(keys.norm, n0, n1, 4)
        _prefetch_rows(keys.codes, n0, n1, KEYS.ROW_BYTES)
        if KEYS.HAS_QJL:
            _prefetch_rows(keys.qjl_bits, n0, n1, KEYS.QJL_ROW_BYTES)
            _prefetch_rows(keys.qjl_norm, n0, n1, 2)
        _prefetch_rows(values.codes, n0, n1, VALUES.ROW_BYTES)
        _prefetch_rows(values.scale, n0, n1, 2 * VALUES.GROUPS)
        _prefetch_rows(values.zero, n0, n1, 2 * VALUES.GROUPS)
    offs = start + tl.arange(0, BLOCK_N)
    mask_n = offs < hi
    nrm = tl.load(keys.norm + offs, mask=mask_n, other=0.0)
    # scores transposed, sT [BLOCK_N, GP] = keys [BLOCK_N, K] @ features^T [K, GP]: the tokens are
    # the M side of the tensor-core product (wgmma on Hopper), the query heads the small N side
    if ABLATE & 1:  # profiling only: no key decode
        raw = tl.zeros([BLOCK_N, fk[0].shape[1]], tl.float32)
    elif KEYS.OCTA:
        rows = keys.t0 + offs  # global token rows: the code fields are read relative to their (aligned) start
        raw = tl.zeros([BLOCK_N, fk[0].shape[1]], tl.float32)
        for c in tl.static_range(NCH):  # triplet chunks of TN, each consumed at once (registers)
            x, y, z = _octa_chunk(keys.codes_base, rows, mask_n, keys.codebook, keys.rho, keys.codes_words, BLOCK_N,
                                  c * TN, TN, KEYS.BU, KEYS.BR, KEYS.ROW_BYTES)
            raw = tl.dot(x, fk[3 * c], raw)
            raw = tl.dot(y, fk[3 * c + 1], raw)
            raw = tl.dot(z, fk[3 * c + 2], raw)
    else:
        raw = tl.zeros([BLOCK_N, fk[0].shape[1]], tl.float32)
        for c in tl.static_range(D // CW):  # coordinate chunks of CW (registers)
            w0, w1, w2 = _row_words(keys.codes + offs * KEYS.ROW_BYTES, mask_n, c * CW, CW, KEYS.BITS)
            yk = _unpack_tile(w0, w1, w2, BLOCK_N, CW, KEYS.BITS, 2, 0.0, 0.0, keys.codebook)
            raw = tl.dot(yk, fk[c], raw)  # chunk c of the rotated query [CW, GP]
    s = raw * nrm[:, None]
    if KEYS.HAS_QJL:
        fj = query.qjl
        cq = tl.zeros([BLOCK_N, fj[0].shape[1]], tl.float32)
        for c in tl.static_range(D // CW):
            w0, w1, w2 = _row_words(keys.qjl_bits + offs * KEYS.QJL_ROW_BYTES, mask_n, c * CW, CW, 1)
            bits = _unpack_tile(w0, w1, w2, BLOCK_N, CW, 1, 3, 0.0, 0.0, keys.codebook)
            cq = tl.dot(bits, fj[c], cq)
        rn = tl.load(keys.qjl_norm + offs, mask=mask_n, other=0.0).to(tl.float32)
        s += (query.qjl_coef * rn)[:, None] * (2.0 * cq - query.qjl_sum[None, :])
    s = tl.where(mask_n[:, None], s * query.scale, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 0))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[None, :])
    l_i = l_i * alpha + tl.sum(p, 0)
    # values: zero + scale * code, in chunks of VALUES.CHUNK coordinates (every word, or group of three
    # words at 3 bits, lies in one value group); acc is a tuple of transposed chunks [CHUNK, GP]
    VW: tl.constexpr = VALUES.CHUNK
    KV: tl.constexpr = 32 // VALUES.BITS if 32 % VALUES.BITS == 0 else 32
    p16 = p.to(tl.float16)
    acc_new = ()
    for c in tl.static_range(D // VW if (ABLATE & 2) == 0 else 0):
        w0, w1, w2 = _row_words(values.codes + offs * VALUES.ROW_BYTES, mask_n, c * VW, VW, VALUES.BITS)
        gptr = offs[:, None] * VALUES.GROUPS + ((c * VW + tl.arange(0, w0.shape[1]) * KV) // VALUES.GROUP)[None, :]
        vs = tl.load(values.scale + gptr, mask=mask_n[:, None], other=0.0).to(tl.float32)
        vz = tl.load(values.zero + gptr, mask=mask_n[:, None], other=0.0).to(tl.float32)
        v = _unpack_tile(w0, w1, w2, BLOCK_N, VW, VALUES.BITS, 1, vs, vz, keys.codebook)
        acc_new = acc_new + (tl.dot(tl.trans(v), p16, acc[c] * alpha[None, :]),)
    if (ABLATE & 2) == 0:
        acc = acc_new
    return m_new, l_i, acc


# --------------------------------------------------------------------------------------------
# kernel 1: one (split, batch x KV head) per program
# --------------------------------------------------------------------------------------------
# the sizes that grow with the cache are plain run-time values (no specialisation on them), so a
# decode loop compiles each kernel once rather than whenever a length crosses a multiple of 16
_GROWING = ["ka_words", "T_alloc", "chunk", "num_splits"]


@triton.jit(do_not_specialize=_GROWING)
def _split_kernel(
    Q, QM, NORM, KA, QJL, RNORM, VC, VS, VZ, CB1, CB2, LENS, OACC, OML,
    ka_words, T_alloc, H, qm_head_stride, chunk, num_splits, rot_scale, qjl_feat_scale, qjl_coef,
    sm_scale_log2,
    TILE: tl.constexpr, SPLIT: tl.constexpr, KEYS: tl.constexpr, VALUES: tl.constexpr, TUNING: tl.constexpr,
):
    BLOCK_N: tl.constexpr = TILE.BLOCK_N
    GP: tl.constexpr = TILE.HEADS_PADDED
    D: tl.constexpr = TILE.HEAD_DIM
    CW: tl.constexpr = KEYS.CHUNK
    TN: tl.constexpr = KEYS.TRIPLET_TILE
    NCH: tl.constexpr = KEYS.TRIPLET_CHUNKS
    NQ: tl.constexpr = KEYS.FEATURES
    QJL_COL: tl.constexpr = KEYS.QJL_COL
    pid_s = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    if SPLIT.HAS_LENS:
        L = tl.minimum(tl.load(LENS + b), T_alloc)
    else:
        L = T_alloc
    lo = pid_s * chunk
    hi = tl.minimum(lo + chunk, L)

    # ---- prologue: the query features (rotated once per program) --------------------------
    g = tl.arange(0, GP)
    dd = tl.arange(0, D)
    q = tl.load(Q + (pid_bh * TILE.HEADS + g)[:, None] * D + dd[None, :], mask=(g < TILE.HEADS)[:, None], other=0.0)
    q = q.to(tl.float32)
    # keep fp16 features in range: scale by a power of two when some |q| is huge
    qmax = tl.max(tl.sqrt(tl.sum(q * q, 1)), 0)
    qsc = tl.where(qmax > 16384.0, tl.exp2(tl.ceil(tl.log2(qmax / 16384.0))), 1.0)
    q = q / qsc
    qm = QM + h * qm_head_stride
    # features^T per key chunk, [K, GP] fp16: OCTOPUS (x, y, z) of each chunk of TN triplets
    # (columns 3 * c * TN + {0, TN, 2 TN} of QM); TurboQuant the rotated query
    fk = ()
    if KEYS.OCTA:
        for c in tl.static_range(3 * NCH):
            fk = fk + (tl.trans((_qfeat(q, qm, c * TN, TN, NQ, D) * rot_scale).to(tl.float16)),)
    else:
        for c in tl.static_range(D // CW):
            fk = fk + (tl.trans((_qfeat(q, qm, c * CW, CW, NQ, D) * rot_scale).to(tl.float16)),)
    fj = ()
    sj = tl.zeros([GP], tl.float32)
    if KEYS.HAS_QJL:  # QJL sketch of the query, chunks [CW, GP]; sj = <features, 1>
        for c in tl.static_range(D // CW):
            f = _qfeat(q, qm, QJL_COL + c * CW, CW, NQ, D)
            if KEYS.SKETCH_SPLIT:  # the sketch is stored as bf16 hi + lo (a Gaussian one)
                f += _qfeat(q, qm, QJL_COL + D + c * CW, CW, NQ, D)
            f = (f * qjl_feat_scale).to(tl.float16)
            sj += tl.sum(f.to(tl.float32), 1)
            fj = fj + (tl.trans(f),)
    else:
        fj = fj + (fk[0],)  # placeholder (never read)
    query = QueryFeatures(fk, fj, sj, sm_scale_log2 * qsc, qjl_coef)

    # ---- main loop over this split's tokens ------------------------------------------------
    VW: tl.constexpr = VALUES.CHUNK
    m_i = tl.full([GP], -1.0e30, tl.float32)
    l_i = tl.zeros([GP], tl.float32)
    acc = ()  # transposed output accumulator, chunks [VW, GP]
    for c in tl.static_range(D // VW):
        acc = acc + (tl.zeros([VW, GP], tl.float32),)
    state = (m_i, l_i, acc)
    t0 = pid_bh.to(tl.int64) * T_alloc  # this (batch, head)'s token 0
    keys = KeyFields(NORM + t0, KA + t0 * KEYS.ROW_BYTES, KA, ka_words, t0, QJL + t0 * KEYS.QJL_ROW_BYTES,
                     RNORM + t0, CB1, CB2)
    values = ValueFields(VC + t0 * VALUES.ROW_BYTES, VS + t0 * VALUES.GROUPS, VZ + t0 * VALUES.GROUPS)
    if SPLIT.STATIC_ITERS > 0:  # the interpreter cannot loop to a run-time bound
        for it in range(0, SPLIT.STATIC_ITERS):
            state = _attend_block(lo + it * BLOCK_N, hi, state, query, keys, values, TILE, KEYS, VALUES, TUNING)
    else:
        for start in range(lo, hi, BLOCK_N):
            state = _attend_block(start, hi, state, query, keys, values, TILE, KEYS, VALUES, TUNING)

    # ---- partial results: normalised output (fp16) and log2-sum-exp per query head ----------
    _store_partials(OACC, OML, state, pid_bh * num_splits + pid_s, g, TILE, VW)


# --------------------------------------------------------------------------------------------
# launcher
# --------------------------------------------------------------------------------------------
def supports(codec, q_dtype=torch.bfloat16) -> str | None:
    """None when the fused kernel handles this codec (from its declared fused layout), else why not."""
    layout = codec.fused_layout()
    if layout is None:
        return f"codec '{codec.name}' has no fused kernel (it declares no fused layout)"
    D = codec.head_dim
    if D < 32 or D & (D - 1):
        return f"head_dim {D} is not a power of two >= 32"
    if q_dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return f"query dtype {q_dtype} not supported"
    if layout.keys == KeyCodes.OCTAHEDRAL:
        b_u, b_r = layout.bits
        if 2 * b_u + b_r > 16:  # four fused triplet codes per 64-bit window
            return f"OCTOPUS split (b_u={b_u}, b_r={b_r}) exceeds 2 b_u + b_r <= 16 bits per triplet"
    elif layout.bits[0] not in (1, 2, 3, 4, 8):
        return f"TurboQuant code width {layout.bits[0]} not in (1, 2, 3, 4, 8)"
    if layout.residual is not None and layout.residual.m != D:
        return f"QJL sketch of {layout.residual.m} rows, not head_dim {D}"
    vq = codec.value_quantizer
    if vq.bits not in (1, 2, 3, 4, 8) or vq.group & (vq.group - 1) or vq.padded != D:
        return f"value quantizer (bits={vq.bits}, group={vq.group}) not supported"
    per_word = 32 if vq.bits == 3 else 32 // vq.bits  # codes read with one scale (a word; 3 words at 3 bits)
    if vq.group < per_word:
        return f"value group {vq.group} at {vq.bits} bits is smaller than the {per_word} codes the kernel reads at once"
    return None


def decode_attention_fused(q, key_state, value_state, codec, window_k=None, window_v=None, lengths=None,
                           window_lengths=None, scale=None, *, return_lse: bool = False, block_n: int = 64,
                           num_splits: int | None = None, combine_block: int = 256, num_warps: int = 4,
                           num_stages: int = 1, maxnreg: int | None = -1, programs_per_sm: int | None = None,
                           prefetch: int = 1, ablate: int = 0, record: dict | None = None):
    """Fused decode attention over a codec's fused layout. Shapes as :func:`kernels.attention.decode_attention`;
    returns out [B, Hq, 1, d] in q's dtype, and with ``return_lse`` also lse [B, Hq] float32, the natural
    log-sum-exp of the scaled scores (tests use it to check the scores).

    ``block_n`` tokens per block (a multiple of 64); ``num_splits`` splits per (batch, KV head)
    (default: sized to fill the device); ``combine_block`` splits merged per pass of the combine
    kernel (a power of two).

    Benchmarks and profiling (harness bench, scripts/gpu_profile_decode.py): ``maxnreg`` caps registers
    so that 4 programs fit an SM (-1: 128, 168 with a QJL stage); ``programs_per_sm`` sizes the default
    split count; ``num_stages`` > 1 lets Triton pipeline the loads through shared memory (slower here);
    ``prefetch`` blocks ahead into L1; ``ablate`` (bits) drops work to see where the time goes: 1 no key
    decode, 2 no value decode, 4 no combine kernel (the output is then garbage). ``record``: a dict that
    receives the compiled kernels ("split", "combine": register and spill counts, SASS)."""
    B, Hq, Tq, D = q.shape
    assert Tq == 1, "decode attention takes one query token"
    if block_n % 64:  # tokens are the M side of the Hopper tensor-core product (64 rows per warpgroup)
        raise ValueError(f"block_n must be a multiple of 64, got {block_n}")
    dev = q.device
    plan = plan_for(codec, dev)
    if maxnreg == -1:  # default: 128 registers (4 programs of 4 warps per SM); 168 with a QJL stage
        maxnreg = 168 if plan.qjl else 128
    if programs_per_sm is None:
        programs_per_sm = 65536 // (max(maxnreg or 168, 64) * 32 * num_warps)
    t = key_state.tensors
    Hkv, T = t["norm"].shape[-3], t["norm"].shape[-2]
    G = Hq // Hkv
    GP = max(16, triton.next_power_of_2(G))
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    lens = None if lengths is None else as_lengths(lengths, B, dev)
    qc = q.reshape(B, Hq, D).contiguous()

    num_splits, chunk, per = split_plan(T, block_n, B * Hkv, programs_per_sm * num_sms(dev), num_splits)

    norm_name, codes_name = plan.fields
    norm = key_state.tensors[norm_name].contiguous()
    ka = key_state.tensors[codes_name].contiguous()
    if plan.qjl:
        qjl, rnorm = (key_state.tensors[f].contiguous() for f in plan.qjl_fields)
    else:
        qjl, rnorm = ka, norm
    vc, vs, vz = (value_state.tensors[k].contiguous() for k in ("codes", "scale", "zero"))
    if plan.octa and ka.data_ptr() % 4:  # the OCTOPUS codes are read as 32-bit words from their start
        ka = ka.clone()

    oacc = torch.empty(B * Hkv * num_splits * GP * D, dtype=torch.float16, device=dev)
    oml = torch.empty(B * Hkv * num_splits * GP, dtype=torch.float32, device=dev)
    sm_scale_log2 = scale * _LOG2E
    split = _split_kernel[(num_splits, B * Hkv)](
        qc, plan.qm, norm, ka, qjl, rnorm, vc, vs, vz, plan.cb1, plan.cb2, lens if lens is not None else norm,
        oacc, oml,
        -(-ka.numel() // 4), T, Hkv, plan.qm_head_stride, chunk, num_splits, plan.rot_scale,
        plan.qjl_feat_scale, plan.qjl_coef, sm_scale_log2,
        TILE=Tile(HEAD_DIM=D, BLOCK_N=block_n, HEADS=G, HEADS_PADDED=GP),
        SPLIT=Split(STATIC_ITERS=per if interpreting() else 0, HAS_LENS=lens is not None),
        KEYS=plan.keys, VALUES=plan.values, TUNING=Tuning(PREFETCH=0 if interpreting() else prefetch, ABLATE=ablate),
        num_warps=num_warps, num_stages=num_stages,
        **({"maxnreg": maxnreg} if maxnreg and not interpreting() else {}),
    )

    if record is not None:
        record["split"] = split
    if ablate & 4:  # profiling only: the split kernel alone
        return torch.empty_like(q)
    out, lse, combine = launch_combine(q, window_k, window_v, window_lengths, oacc, oml, Hkv, GP, num_splits,
                                       sm_scale_log2, return_lse, combine_block)
    if record is not None:
        record["combine"] = combine
    return (out, lse) if return_lse else out
