"""The engines' KV-cache formats written in numpy from their definitions (the kernels' arithmetic, op by op, as the
engines' sources state it), independent of kernels/engines/: tests/kernels/engines/ compares the codecs' bytes
with these, and distortion_refs.py takes their reconstruction errors. float16 arithmetic is numpy's (each op
correctly rounded); bfloat16 is float32 rounded to its top 16 bits, ties to even."""
from __future__ import annotations

import numpy as np

GGML_QK = 32
IQ4NL_LEVELS = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.float32)


def hadamard(n: int) -> np.ndarray:
    """The orthonormal Sylvester Hadamard matrix: H[i, j] = (-1)^popcount(i & j) / sqrt(n), float64."""
    i = np.arange(n)
    parity = np.vectorize(lambda v: bin(v).count("1") & 1)(i[:, None] & i[None, :])
    return (1 - 2 * parity) / np.sqrt(n)


def round_away(x: np.ndarray) -> np.ndarray:
    """C's roundf: halfway cases away from zero."""
    return np.sign(x) * np.floor(np.abs(x) + 0.5) if x.dtype == np.float64 else _round_away32(x)


def _round_away32(x):
    t = np.trunc(x)
    return np.where(np.abs(x - t) == 0.5, t + np.sign(x), np.rint(x))


def bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> the nearest bfloat16 (ties to even), as float32."""
    b = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    return b.astype(np.uint32).view(np.float32)


# --- llama.cpp (ggml) ----------------------------------------------------------------------------------------
def ggml_dequantized(x: np.ndarray, kind: str) -> np.ndarray:
    """x float64 [..., d] through a ggml block type (q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl) and back, float64, the
    scales rounded to fp16 as stored: the types' definitions (``ggml-quants.c``), not their float32 rounding."""
    xb = x.reshape(*x.shape[:-1], -1, GGML_QK)
    f16 = lambda v: v.astype(np.float16).astype(np.float64)  # noqa: E731
    vmax = np.take_along_axis(xb, np.abs(xb).argmax(-1)[..., None], -1)
    with np.errstate(divide="ignore", invalid="ignore"):
        if kind == "q8_0":
            d = np.abs(xb).max(-1, keepdims=True) / 127
            q = np.where(d > 0, round_away(xb / np.where(d > 0, d, 1)), 0)
            out = q * f16(d)
        elif kind in ("q4_0", "q5_0"):
            half = 8 if kind == "q4_0" else 16
            d = vmax / -half
            q = np.minimum(2 * half - 1, np.floor(np.where(d != 0, xb / np.where(d != 0, d, 1), 0) + half + 0.5))
            out = (q - half) * f16(d)
        elif kind in ("q4_1", "q5_1"):
            top = 15 if kind == "q4_1" else 31
            lo, hi = xb.min(-1, keepdims=True), xb.max(-1, keepdims=True)
            d = (hi - lo) / top
            q = np.minimum(top, np.floor(np.where(d > 0, (xb - lo) / np.where(d > 0, d, 1), 0) + 0.5))
            out = q * f16(d) + f16(lo)
        elif kind == "iq4_nl":
            d, idx = iq4_nl_blocks(xb.astype(np.float32))
            out = IQ4NL_LEVELS[idx].astype(np.float64) * d.astype(np.float64)[..., None]
        else:
            raise KeyError(kind)
    return out.reshape(x.shape)


def iq4_nl_blocks(xb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The CUDA writer's iq4_nl (``quantize_f32_iq4_nl_block``) on float32 blocks [..., 32]: (d float16 [...],
    level indices [..., 32]): levels nearest to x / d0 (a tie to the upper level), d0 = vmax / -127, then the
    x^2-weighted least-squares scale, summed pair (j, j + 16) by pair in float32."""
    vmax = np.take_along_axis(xb, np.abs(xb).argmax(-1)[..., None], -1)
    d0 = (vmax / np.float32(-127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        y = xb * np.where(d0 != 0, np.float32(1) / d0, np.float32(0))
    dist = np.abs(y[..., None] - IQ4NL_LEVELS)
    best = dist.min(-1, keepdims=True)
    idx = np.where(dist == best, np.arange(16), -1).max(-1)  # the upper of two equally near levels
    v, w = IQ4NL_LEVELS[idx], xb * xb
    sumqx = np.zeros(xb.shape[:-1], np.float32)
    sumq2 = np.zeros(xb.shape[:-1], np.float32)
    for j in range(16):
        a, b = j, j + 16
        sumqx = sumqx + (w[..., a] * v[..., a] * xb[..., a] + w[..., b] * v[..., b] * xb[..., b])
        sumq2 = sumq2 + (w[..., a] * v[..., a] * v[..., a] + w[..., b] * v[..., b] * v[..., b])
    with np.errstate(divide="ignore", invalid="ignore"):
        d = np.where(sumq2 > 0, sumqx / sumq2, d0[..., 0])
    return d.astype(np.float16), idx


# --- MLX -----------------------------------------------------------------------------------------------------
def mlx_affine(x: np.ndarray, group: int, bits: int, metal: bool = True):
    """mx.quantize's affine codes on float32 x [..., d]: (codes [..., d], scale, bias [..., d / group]); ``metal``:
    the Metal kernel (maximum floored at 0, halfway cases away from zero), else the CPU backend (the group's own
    maximum, ties to even)."""
    xg = x.astype(np.float32).reshape(*x.shape[:-1], -1, group)
    top = np.float32(2 ** bits - 1)
    w_min, w_max = xg.min(-1, keepdims=True), xg.max(-1, keepdims=True)
    if metal:
        w_max = np.maximum(w_max, np.float32(0))
    rnd = _round_away32 if metal else np.rint
    scale = np.maximum((w_max - w_min) / top, np.float32(1e-7))
    low = np.abs(w_min) > np.abs(w_max)
    scale = np.where(low, scale, -scale)
    edge = np.where(low, w_min, w_max)
    q0 = rnd(edge / scale)
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(q0 == 0, scale, edge / q0)
    bias = np.where(q0 == 0, np.float32(0), edge)
    q = np.clip(rnd((xg - bias) / scale), 0, top)
    return q.reshape(x.shape).astype(np.int64), scale[..., 0], bias[..., 0]


def mlx_dequantized(codes, scale, bias, group):
    q = codes.reshape(*codes.shape[:-1], -1, group).astype(np.float32)
    return (q * scale[..., None] + bias[..., None]).reshape(codes.shape)


# --- ExLlamaV2 / ExLlamaV3 -----------------------------------------------------------------------------------
def _butterflies(y: np.ndarray) -> np.ndarray:
    """The unnormalized Hadamard over the last dim (32) in y's dtype: stages on index bits 0..4, (a + b, a - b)."""
    n, h = y.shape[-1], 1
    while h < n:
        z = y.reshape(*y.shape[:-1], n // (2 * h), 2, h)
        a, b = z[..., 0, :], z[..., 1, :]
        y = np.stack([a + b, a - b], axis=-2).reshape(*y.shape[:-1], n)
        h *= 2
    return y


def exl2_q(x: np.ndarray, bits: int):
    """ExLlamaV2's ``fp16_to_q``: per 64 coordinates the even and odd 32 in float16, Hadamard, absmax per lane half,
    codes rint(fp16(fp16(y / a) * 2^(b-1) + 2^(b-1))). Returns (codes [..., d/64, 2, 32], scales fp16 [..., d/32])."""
    x16 = x.astype(np.float16).reshape(*x.shape[:-1], -1, 32, 2)
    y = _butterflies(np.swapaxes(x16, -1, -2))  # [..., d/64, 2 (even, odd), 32 lanes]
    half = 2 ** (bits - 1)
    lanes = y.reshape(*y.shape[:-1], 2, 16)
    a = np.abs(lanes).max(axis=(-3, -1), keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        w = (lanes.astype(np.float32) / a.astype(np.float32)).astype(np.float16).reshape(y.shape)
    w = (w.astype(np.float32) * half + half).astype(np.float16)
    q = np.clip(np.where(np.isnan(w), 0, np.rint(w.astype(np.float32))), 0, 2 * half - 1).astype(np.uint8)
    scale = (a.astype(np.float32) / half).astype(np.float16).reshape(*x.shape[:-1], -1)
    return q, scale


def exl2_dequantized(q: np.ndarray, scale: np.ndarray, bits: int) -> np.ndarray:
    half = 2 ** (bits - 1)
    s = scale.reshape(*scale.shape[:-1], -1, 1, 2, 1)
    y = ((q.astype(np.float32) - half).astype(np.float16).reshape(*q.shape[:-1], 2, 16) * s).reshape(q.shape)
    y = _butterflies(y) * np.float16(1 / 32)
    return np.swapaxes(y, -1, -2).reshape(*q.shape[:-3], -1)


R32 = np.float32(0.17677669529663688110)


def exl3_q(x: np.ndarray, bits: int):
    """ExLlamaV3's ``quant_block_x4``: float32 Hadamard of each 32 (fp16 input), times 1/sqrt(32), s = absmax +
    1e-10, codes floor(fma(v / s, m, m)) clamped. Returns (codes [..., d/32, 32], scales fp16 [..., d/32])."""
    v = _butterflies(x.astype(np.float16).astype(np.float32).reshape(*x.shape[:-1], -1, 32)) * R32
    s = np.abs(v).max(-1, keepdims=True) + np.float32(1e-10)
    m = 2 ** (bits - 1)
    t = v * (np.float32(1) / s)
    q = np.floor((t.astype(np.float64) * m + m).astype(np.float32))  # fma: one rounding
    return np.clip(q, 0, 2 * m - 1).astype(np.int64), s[..., 0].astype(np.float16)


def exl3_dequantized(q: np.ndarray, scale: np.ndarray, bits: int) -> np.ndarray:
    m = 2 ** (bits - 1)
    sm = (scale.astype(np.float32) * R32)[..., None] * np.float32(1 / m)
    v = (q.astype(np.float32) - np.float32(m - 0.5)) * sm
    return _butterflies(v).astype(np.float16).reshape(*q.shape[:-2], -1)


# --- LMDeploy TurboMind --------------------------------------------------------------------------------------
def turbomind(x: np.ndarray, bits: int, half: str = "float16"):
    """TurboMind's per-token-head asymmetric codes, each op rounded to ``half`` (float16 | bfloat16):
    (codes [..., d], scale, zero [..., 1] as float32 holding ``half`` values)."""
    r = (lambda v: v.astype(np.float16).astype(np.float32)) if half == "float16" else bf16
    xt = r(x.astype(np.float32))
    lo, hi = xt.min(-1, keepdims=True), xt.max(-1, keepdims=True)
    q_max = 2 ** bits - 1
    scale = r((hi - lo) * np.float32(1 / q_max))
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = r(np.float32(1) / scale)
        v = r(r(xt - lo) * inv)
    q = np.clip(np.where(np.isnan(v), 0, np.rint(v)), 0, q_max).astype(np.uint8)
    return q, scale, lo


def turbomind_dequantized(q, scale, zero, half: str = "float16"):
    r = (lambda v: v.astype(np.float16).astype(np.float32)) if half == "float16" else bf16
    return r(r(q.astype(np.float32) * scale) + zero)
