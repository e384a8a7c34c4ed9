"""Kernel 2 of the fused decode attention (:mod:`kernels.triton.decode_attention`): merges the
splits' partial outputs by log-sum-exp and attends the native window in the same softmax; one
query head x DC output coordinates per program. Scores are in the log2 domain (exp2)."""
from __future__ import annotations

import triton
import triton.language as tl


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
