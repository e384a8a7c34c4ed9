"""LMDeploy's TurboMind KV-cache quantization (``quant_policy=8``: int8, ``quant_policy=4``: int4) as codecs:
``lmdeploy-int8`` and ``lmdeploy-int4``.

Read from InternLM/lmdeploy at 1263d5c: ``src/turbomind/kernels/attention/quantization.h`` (``warp_stats``,
``ConvertKvCache``, ``round`` with ``TM_ROUND_USE_CVT_RNI``), ``kv_cache_utils_v2.cu`` (``ProcessKV_v2``, the
prefill's cache write, and ``flattenKV_v2``), ``attention_universal.h`` (the decode step's cache write) and
``src/turbomind/models/llama/unified_attention_layer.cc`` (the prefill: write, flatten, attend).

Per (token, head), asymmetric, in the model's half-precision type T (fp16 or bf16; TurboMind runs no other):

- ``lo``, ``hi`` the token-head's minimum and maximum (in T, exact); ``scale = (hi - lo) * (1 / q_max)`` in
  float32, stored as T; ``zero = lo`` stored as T (``kForceIntZeroPoint`` is off);
- codes ``cvt.rni.sat.u8((x - zero) * inv)`` with ``inv = T(1 / scale)``, the subtraction and the product each
  rounded to T, rounding to the nearest integer (ties to even) and saturating to 0..255; int4 then takes
  ``min(code, 15)``;
- read back as ``code * scale + zero``, the product and the sum each rounded to T.

int8 stores a byte a coordinate; int4 packs each 8 consecutive coordinates' codes into 4 bytes as
``(v0 | v2 << 4, v4 | v6 << 4, v1 | v3 << 4, v5 | v7 << 4)`` (``ConvertKvCache<T, uint4_t>::pack``, the order
the fast u4-to-half conversion reads). A token-head costs d (int8) or d / 2 (int4) bytes plus two T values.
State: ``codes`` uint8 [..., T, d or d / 2], ``scale`` and ``zero`` [..., T, 1] in T.

The kernels are compiled with ``-use_fast_math`` and divide with ``fdividef``: ``1 / scale`` is an approximate
reciprocal there, correctly rounded here; the T rounding after it absorbs the difference but at T ties.

Around the bytes, as TurboMind does it:

- ``dtype``: the arithmetic's type: 'auto' is the model's (bfloat16 for a bfloat16 model, else float16: TurboMind
  runs float32 checkpoints in float16); 'float32' computes everything in float32 (no half-precision rounding),
  for comparison only.
- ``new_tokens``: a prefill writes its tokens to the cache, flattens the whole cache back to T and attends that;
  a decode step writes its token before attending it: the tokens in flight are attended as stored.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from kernels.engines.preset import EnginePreset
from kernels.registry import register_codec
from kernels.token_layout import Element, Offset, TokenCodes, TokenLayout, permutation

_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


#: the stored order of each 8 coordinates' 4-bit codes (byte k: the pair U4_PAIRS[k], the first low)
U4_PAIRS = ((0, 2), (4, 6), (1, 3), (5, 7))


def pack_u4(q: torch.Tensor) -> torch.Tensor:
    """uint8 codes [..., d] (< 16) -> [..., d / 2] in TurboMind's order: per 8 codes (v0|v2, v4|v6, v1|v3, v5|v7),
    the first of each pair in the low nibble."""
    v = q.unflatten(-1, (-1, 8))
    return torch.stack([v[..., a] | (v[..., b] << 4) for a, b in U4_PAIRS], dim=-1).flatten(-2)


def unpack_u4(packed: torch.Tensor) -> torch.Tensor:
    p = packed.unflatten(-1, (-1, 4))
    lo, hi = p & 15, p >> 4
    # byte k holds codes (a, b) = pairs[k]: 0 -> (0, 2), 1 -> (4, 6), 2 -> (1, 3), 3 -> (5, 7)
    order = [lo[..., 0], lo[..., 2], hi[..., 0], hi[..., 2], lo[..., 1], lo[..., 3], hi[..., 1], hi[..., 3]]
    return torch.stack(order, dim=-1).flatten(-2)


class _TurboMind(EnginePreset):
    """TurboMind's per-token-head asymmetric cache at ``code_bits`` (8 or 4)."""
    engine = "LMDeploy"
    code_bits: int

    @dataclass(frozen=True)
    class Options:
        dtype: Literal["auto", "float16", "bfloat16", "float32"] = "auto"  # the arithmetic's type (auto: the model's)
        new_tokens: Literal["stored", "native"] = "stored"  # written to the cache, then attended

    head_block = 8
    head_block_why = "TurboMind writes its cache {n} coordinates at a time"

    def __init__(self, config, device="cpu"):
        super().__init__(config, device)
        side = 4 if self.opts.dtype == "float32" else 2
        self.bytes_per_vector = self.head_dim * self.code_bits // 8 + 2 * side

    def _dtype(self, x: torch.Tensor) -> torch.dtype:
        if self.opts.dtype != "auto":
            return _DTYPES[self.opts.dtype]
        return torch.bfloat16 if x.dtype == torch.bfloat16 else torch.float16

    def _quantize(self, x, side):
        t = self._dtype(x)
        xt = x.to(t)
        lo, hi = xt.amin(-1, keepdim=True), xt.amax(-1, keepdim=True)
        q_max = 2 ** self.code_bits - 1
        scale = ((hi.float() - lo.float()) * torch.tensor(1.0 / q_max, dtype=torch.float32)).to(t)
        inv = (1.0 / scale.float()).to(t)
        v = ((xt - lo) * inv).float()  # two roundings to t
        q = torch.where(v.isnan(), 0.0, v.round()).clamp(0, q_max).to(torch.uint8)  # cvt.rni.sat: NaN -> 0
        codes = q if self.code_bits == 8 else pack_u4(q)
        return {"codes": codes, "scale": scale, "zero": lo}

    def _dequantize(self, t, side):
        q = t["codes"] if self.code_bits == 8 else unpack_u4(t["codes"])
        return q.to(t["scale"].dtype) * t["scale"] + t["zero"]

    def _build_token_layout(self):
        order = None if self.code_bits == 8 else permutation([i for pair in U4_PAIRS for i in pair], self.head_dim)
        side = TokenCodes(Element.UINT, bits=self.code_bits, scale_field="scale", offset=Offset.ZERO,
                          zero_field="zero", rotation=order)
        return TokenLayout(side, side)


@register_codec("lmdeploy-int8")
class LmdeployInt8(_TurboMind):
    """LMDeploy TurboMind ``quant_policy=8``."""
    bits_supported, code_bits = (8,), 8


@register_codec("lmdeploy-int4")
class LmdeployInt4(_TurboMind):
    """LMDeploy TurboMind ``quant_policy=4``."""
    bits_supported, code_bits = (4,), 4
