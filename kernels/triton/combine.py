"""What the split-K decode kernels share (:mod:`kernels.triton.decode_attention`,
:mod:`kernels.triton.token_attention`): the compile-time groups every kernel 1 takes (:class:`Tile`,
:class:`Split`), kernel 1's partial results (:func:`_store_partials`) and kernel 2, which merges the splits'
partial outputs by log-sum-exp and attends the native window in the same softmax, one query head x DC
output coordinates per program (:func:`launch_combine`). Scores are in the log2 domain (exp2).

Compile-time constants travel in named groups (NamedTuples passed as ``tl.constexpr``; the interpreter
takes them too): a kernel reads ``TILE.BLOCK_N``. A field that sizes a tensor is bound to a local
``tl.constexpr`` first (``BLOCK_N: tl.constexpr = TILE.BLOCK_N``): Triton reads a group's fields as plain
ints, which a shape does not take."""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from kernels.triton import interpreting
from kernels._lengths import as_lengths


class Tile(NamedTuple):
    """What one program of a split kernel covers (compile-time): ``BLOCK_N`` tokens per block of its
    chunk, ``HEAD_DIM`` coordinates, the ``HEADS`` query heads of one KV head (G = Hq / Hkv) padded to
    ``HEADS_PADDED`` (a power of two >= 16: the small N side of the tensor-core products)."""

    HEAD_DIM: int
    BLOCK_N: int
    HEADS: int
    HEADS_PADDED: int


class Split(NamedTuple):
    """How a program walks its chunk (compile-time): ``STATIC_ITERS`` blocks where > 0 (the interpreter
    cannot loop to a run-time bound), else up to the sequence's end; ``HAS_LENS``: per-sequence lengths."""

    STATIC_ITERS: int
    HAS_LENS: bool


@triton.jit
def _store_partials(OACC, OML, state, part, g, TILE: tl.constexpr, CHUNK: tl.constexpr):
    """Kernel 1's result for split ``part`` from its softmax ``state`` (m, l [HEADS_PADDED], acc: the
    transposed accumulator, chunks [CHUNK, HEADS_PADDED]): the normalised output (fp16) and the log2-sum-exp
    of each query head (-1e30 where nothing was attended)."""
    m_i, l_i, acc = state
    gm = g < TILE.HEADS
    inv_l = tl.where(l_i > 0, 1.0 / tl.maximum(l_i, 1e-30), 0.0)
    for c in tl.static_range(TILE.HEAD_DIM // CHUNK):
        dc = c * CHUNK + tl.arange(0, CHUNK)
        tl.store(OACC + (part * TILE.HEADS_PADDED + g)[None, :] * TILE.HEAD_DIM + dc[:, None],
                 (acc[c] * inv_l[None, :]).to(tl.float16), mask=gm[None, :])
    tl.store(OML + part * TILE.HEADS_PADDED + g, tl.where(l_i > 0, m_i + tl.log2(tl.maximum(l_i, 1e-30)), -1.0e30),
             mask=gm)


@triton.jit
def _window_block(w0, wl, q, m, l, acc, kbase, vbase, swk_t, swv_t, sm_scale_log2, d0,
                  D: tl.constexpr, DC: tl.constexpr, W_BLOCK: tl.constexpr):
    """Native window tokens [w0, w0 + W_BLOCK) of one query head merged into (m, l, acc), for
    output coordinates [d0, d0 + DC)."""
    dd = tl.arange(0, D)
    wi = w0 + tl.arange(0, W_BLOCK)
    wm = wi < wl
    kw = tl.load(kbase + wi[:, None] * swk_t + dd[None, :], mask=wm[:, None], other=0.0)
    sw = tl.sum(kw.to(tl.float32) * q[None, :], 1) * sm_scale_log2
    sw = tl.where(wm, sw, float("-inf"))
    m_new = tl.maximum(m, tl.max(sw, 0))
    alpha = tl.exp2(m - m_new)
    pw = tl.exp2(sw - m_new)
    vw = tl.load(vbase + wi[:, None] * swv_t + (d0 + tl.arange(0, DC))[None, :], mask=wm[:, None], other=0.0)
    acc = acc * alpha + tl.sum(pw[:, None] * vw.to(tl.float32), 0)
    l = l * alpha + tl.sum(pw, 0)
    return m_new, l, acc


@triton.jit
def _merge_splits(c0, m, l, acc, OPART, OLSE, bh, g, dc, num_splits, GP: tl.constexpr, D: tl.constexpr,
                  SPLIT_BLOCK: tl.constexpr):
    """Splits [c0, c0 + SPLIT_BLOCK) of one query head merged online into (m, l, acc): o_s
    (normalised, fp16) weighted by 2^lse_s. All SPLIT_BLOCK (up to 256) splits are loaded at once."""
    sc = c0 + tl.arange(0, SPLIT_BLOCK)
    ok = sc < num_splits
    lse = tl.load(OLSE + (bh * num_splits + sc) * GP + g, mask=ok, other=-1.0e30)
    o = tl.load(OPART + ((bh * num_splits + sc) * GP + g)[:, None] * D + dc[None, :], mask=ok[:, None], other=0.0)
    m_new = tl.maximum(m, tl.max(lse, 0))
    alpha = tl.exp2(m - m_new)
    wc = tl.where(lse > -1.0e29, tl.exp2(lse - m_new), 0.0)  # empty splits weigh nothing
    acc = acc * alpha + tl.sum(o.to(tl.float32) * wc[:, None], 0)
    l = l * alpha + tl.sum(wc, 0)
    return m_new, l, acc


@triton.jit(do_not_specialize=["num_splits", "W", "swk_b", "swk_h", "swv_b", "swv_h"])
def _combine_kernel(
    Q, WK, WV, WLENS, OPART, OLSE, OUT, LSE,
    H, W, swk_b, swk_h, swk_t, swv_b, swv_h, swv_t, sm_scale_log2, num_splits,
    G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, DC: tl.constexpr,
    SPLIT_BLOCK: tl.constexpr, S_STATIC_ITERS: tl.constexpr, W_BLOCK: tl.constexpr, HAS_WINDOW: tl.constexpr,
    W_STATIC_ITERS: tl.constexpr, HAS_WLENS: tl.constexpr, WRITE_LSE: tl.constexpr,
):
    pid = tl.program_id(0)  # b * Hq + hq
    d0 = tl.program_id(1) * DC
    bh = pid // G
    g = pid % G
    b = bh // H
    h = bh % H
    dc = d0 + tl.arange(0, DC)

    m = tl.full([], -1.0e30, tl.float32)
    l = tl.zeros([], tl.float32)
    acc = tl.zeros([DC], tl.float32)
    if HAS_WINDOW:
        q = tl.load(Q + pid * D + tl.arange(0, D)).to(tl.float32)
        if HAS_WLENS:
            wl = tl.minimum(tl.load(WLENS + b), W)
        else:
            wl = W
        kbase = WK + b * swk_b + h * swk_h
        vbase = WV + b * swv_b + h * swv_h
        if W_STATIC_ITERS > 0:  # the interpreter cannot loop to a run-time bound
            for it in range(0, W_STATIC_ITERS):
                m, l, acc = _window_block(it * W_BLOCK, wl, q, m, l, acc, kbase, vbase, swk_t, swv_t,
                                          sm_scale_log2, d0, D, DC, W_BLOCK)
        else:
            for w0 in range(0, wl, W_BLOCK):
                m, l, acc = _window_block(w0, wl, q, m, l, acc, kbase, vbase, swk_t, swv_t,
                                          sm_scale_log2, d0, D, DC, W_BLOCK)

    # splits: o_s (normalised, fp16) weighted by 2^lse_s, merged online; one pass (SPLIT_BLOCK covers
    # up to 256 splits) so that the loads of all splits are in flight at once
    if S_STATIC_ITERS > 0:  # the interpreter cannot loop to a run-time bound
        for it in range(0, S_STATIC_ITERS):
            m, l, acc = _merge_splits(it * SPLIT_BLOCK, m, l, acc, OPART, OLSE, bh, g, dc, num_splits, GP, D,
                                      SPLIT_BLOCK)
    else:
        for c0 in range(0, num_splits, SPLIT_BLOCK):
            m, l, acc = _merge_splits(c0, m, l, acc, OPART, OLSE, bh, g, dc, num_splits, GP, D, SPLIT_BLOCK)

    out = acc / tl.maximum(l, 1e-30)  # nothing to attend -> zeros
    tl.store(OUT + pid * D + dc, out.to(OUT.dtype.element_ty))
    if WRITE_LSE:  # natural-log log-sum-exp of the scaled scores (-inf when nothing is attended)
        if d0 == 0:
            tl.store(LSE + pid, tl.where(l > 0, (m + tl.log2(tl.maximum(l, 1e-30))) * 0.6931471805599453,
                                         float("-inf")))


def launch_combine(q, window_k, window_v, window_lengths, oacc, oml, Hkv: int, GP: int, num_splits: int,
                   sm_scale_log2: float, return_lse: bool = False, combine_block: int = 256):
    """Kernel 2 of a split-K decode step: the splits' partials ``oacc`` (fp16, normalised, [B * Hkv *
    num_splits * GP, d]) and ``oml`` (their log2-sum-exp) merged with the native window ``[B, Hkv, W, d]``
    (or None) for ``q [B, Hq, 1, d]``. -> (out [B, Hq, 1, d] in q's dtype, lse [B, Hq] float32 natural
    log-sum-exp where ``return_lse``, else None, the compiled kernel)."""
    B, Hq, _, D = q.shape
    dev = q.device
    G = Hq // Hkv
    qc = q.reshape(B, Hq, D).contiguous()
    out = torch.empty(B, Hq, 1, D, dtype=q.dtype, device=dev)
    lse = torch.empty(B, Hq, dtype=torch.float32, device=dev) if return_lse else out
    has_w = window_k is not None and window_k.shape[-2] > 0
    if has_w:
        W = window_k.shape[-2]
        wk = window_k if window_k.stride(-1) == 1 else window_k.contiguous()
        wv = window_v if window_v.stride(-1) == 1 else window_v.contiguous()
        wl = None if window_lengths is None else as_lengths(window_lengths, B, dev)
        wstr = (wk.stride(0), wk.stride(1), wk.stride(2), wv.stride(0), wv.stride(1), wv.stride(2))
        w_block = min(64, triton.next_power_of_2(W))
    else:
        W, wk, wv, wl, wstr, w_block = 0, qc, qc, None, (0,) * 6, 16
    DC = min(32, D)
    split_block = min(combine_block, 64 if num_splits <= 64 else 256)  # two compiled variants
    kernel = _combine_kernel[(B * Hq, D // DC)](
        qc, wk, wv, wl if wl is not None else qc, oacc, oml, out, lse, Hkv, W, *wstr, sm_scale_log2, num_splits,
        G=G, GP=GP, D=D, DC=DC, SPLIT_BLOCK=split_block,
        S_STATIC_ITERS=triton.cdiv(num_splits, split_block) if interpreting() else 0,
        W_BLOCK=w_block, HAS_WINDOW=has_w, HAS_WLENS=wl is not None, WRITE_LSE=return_lse,
        W_STATIC_ITERS=triton.cdiv(W, w_block) if (has_w and interpreting()) else 0,
        num_warps=4,
    )
    return out, (lse if return_lse else None), kernel
