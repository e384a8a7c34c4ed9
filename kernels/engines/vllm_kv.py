"""vLLM's KV-cache dtypes (``--kv-cache-dtype``) as codecs: what a vLLM deployment stores, so a report
can say whether a research codec is better than what runs today.

Each preset reproduces the format vLLM writes, for keys and values alike (vLLM quantizes both the same
way; ``--value-bits`` does not apply). Read from vLLM's source (vllm-project/vllm):

- ``vllm-fp8`` (``fp8`` = ``fp8_e4m3``) and ``vllm-fp8-e5m2``: one scale per tensor, ``x / k_scale``
  cast to fp8 with saturation (``reshape_and_cache_flash``: ``__NV_SATFINITE``; Triton's fp8 store
  rounds to nearest even). Without calibrated checkpoint scales vLLM's ``k_scale`` and ``v_scale`` are
  1.0, the default here (``--codec-opt vllm-fp8.k_scale=...``). The two float32 scales are per layer,
  not per token: nothing per token but the fp8 byte.
- ``vllm-fp8-per-token-head`` and ``vllm-int8-per-token-head``: per (token, head) a float32 scale
  ``max(absmax / QMAX, 1e-6)``, then ``clamp(x * (1 / scale), QMIN, QMAX)`` stored as fp8 e4m3 (QMAX
  448, round to nearest even) or int8 (QMAX 127, QMIN -128; Triton's float-to-int store truncates
  toward zero) (``vllm/v1/attention/ops/triton_quant_kv/_per_token_head_kernel.py`` at 8940d7d).
- ``vllm-int4-per-token-head``: a randomized Hadamard transform first (unnormalized: ``H (s * x)``
  with vLLM's fixed signs, rounded back to the model's dtype), then per (token, head) asymmetric
  4-bit codes: ``scale = max((max - min) / 15, 1e-6)``, zero point ``round(-min / scale)`` in 0..15
  (rounding half away from zero, as the kernel does), codes ``clamp(round(x / scale + zp), 0, 15)``
  packed two per byte; the zero point rides in the low 4 mantissa bits of the float32 scale, so a
  token-head costs ``d / 2 + 4`` bytes. Reading uses the scale with those bits cleared
  (``vllm/v1/attention/ops/int4_per_token_head.py`` at 055e47c).

- ``vllm-nvfp4``: per block of 16 coordinates, ``sf = (1 / k_scale) * (amax * (1/6))`` stored as fp8 e4m3
  (round to nearest even, saturating), then each coordinate times ``1 / (sf * k_scale)`` rounded to fp4
  e2m1 (``cvt.rn.satfinite.e2m1x2.f32``: nearest, ties to even, saturating at 6), two per byte, element
  2i in the low nibble; read back as ``e2m1 * sf * k_scale``. ``k_scale`` / ``v_scale`` are the
  checkpoint's per-layer scales (1.0 without). A token-head costs ``d / 2 + d / 16`` bytes
  (``csrc/libtorch_stable/nvfp4_kv_cache_kernels.cu``, ``reshape_and_cache_nvfp4_kernel``, at 0cd789b, and
  ``quantization/fp4/nvfp4_utils.cuh`` at 20b4ad8; vLLM runs it on Blackwell only, where the scale bytes
  of the values are swizzled in the page: the swizzle moves bytes, not values, and is not reproduced).

State: ``codes`` uint8 ``[..., T, d]`` (fp8 bit patterns, int8 two's complement, or packed nibbles
``[..., T, d/2]``) and, for the per-token-head presets, ``scale`` float32 ``[..., T, 1]`` (nvfp4: the
block scales, uint8 fp8 ``[..., T, d/16]``).
"""
from __future__ import annotations

import functools

import torch

from kernels.engines.preset import EnginePreset, Nvfp4, PerTensorFp8, fp8_saturate, fp8_value
from kernels.registry import register_codec
from kernels.rotation import fwht
from kernels.token_layout import Element, Offset, TokenCodes, TokenLayout


def _round_half_away(x: torch.Tensor) -> torch.Tensor:
    """vLLM's int4 kernel rounds with ``(x + 0.5).to(int32)`` for x >= 0, ``(x - 0.5)`` below."""
    return torch.where(x >= 0, torch.floor(x + 0.5), torch.ceil(x - 0.5))


class _VllmFp8(PerTensorFp8):
    engine = "vLLM"
    bits_supported = (8,)

    def _quantize(self, x, side):
        return {"codes": fp8_saturate(x.float() / self._scale(side), self.kind)}


@register_codec("vllm-fp8")
class VllmFp8(_VllmFp8):
    """vLLM ``--kv-cache-dtype fp8`` (= ``fp8_e4m3``)."""


@register_codec("vllm-fp8-e5m2")
class VllmFp8E5m2(_VllmFp8):
    """vLLM ``--kv-cache-dtype fp8_e5m2``."""
    kind = "e5m2"


class _PerTokenHead(EnginePreset):
    """Symmetric per-(token, head) scales: fp8 e4m3 (round to nearest even) or int8 (truncated)."""
    engine = "vLLM"
    bits_supported = (8,)
    qmax, qmin = 127.0, -128.0

    def __init__(self, config, device="cpu"):
        super().__init__(config, device)
        self.bytes_per_vector = self.head_dim + 4  # the codes, then the float32 scale

    def _quantize(self, x, side):
        x = x.float()
        scale = (x.abs().amax(-1, keepdim=True) / self.qmax).clamp_min(1e-6)
        q = (x * (1.0 / scale)).clamp(self.qmin, self.qmax)
        return {"codes": self._store(q), "scale": scale}

    def _dequantize(self, t, side):
        return self._load(t["codes"]) * t["scale"]

    def _build_token_layout(self):
        side = TokenCodes(self.element, scale_field="scale")
        return TokenLayout(side, side)


@register_codec("vllm-int8-per-token-head")
class VllmInt8PerTokenHead(_PerTokenHead):
    """vLLM ``--kv-cache-dtype int8_per_token_head``."""
    element = Element.INT8

    @staticmethod
    def _store(q):
        return q.trunc().to(torch.int8).view(torch.uint8)

    @staticmethod
    def _load(codes):
        return codes.view(torch.int8).float()


@register_codec("vllm-fp8-per-token-head")
class VllmFp8PerTokenHead(_PerTokenHead):
    """vLLM ``--kv-cache-dtype fp8_per_token_head``."""
    qmax, qmin = 448.0, -448.0
    element = Element.E4M3

    @staticmethod
    def _store(q):
        return fp8_saturate(q, "e4m3")

    @staticmethod
    def _load(codes):
        return fp8_value(codes, "e4m3")


@functools.lru_cache(maxsize=None)
def rht_signs(d: int) -> torch.Tensor:
    """vLLM's fixed RHT signs (``_get_rht_signs(d, 0)``): Bernoulli(0.5) draws of a CPU generator seeded
    0x9E3779B9, as ±1. Fixed by vLLM, not a codec seed: every deployment uses these."""
    gen = torch.Generator(device="cpu").manual_seed(0x9E3779B9)
    return 2.0 * torch.bernoulli(torch.full((d,), 0.5), generator=gen) - 1.0


@register_codec("vllm-int4-per-token-head")
class VllmInt4PerTokenHead(EnginePreset):
    """vLLM ``--kv-cache-dtype int4_per_token_head``."""
    engine = "vLLM"
    bits_supported = (4,)

    @classmethod
    def head_dim_unsupported(cls, head_dim):
        if head_dim < 2 or head_dim & (head_dim - 1):
            return f"vLLM's int4 cache rotates by a Hadamard transform of a power-of-2 head dim, got {head_dim}"
        return None

    def __init__(self, config, device="cpu"):
        super().__init__(config, device)
        d = self.head_dim
        self.signs = rht_signs(d).to(self.device)
        self.bytes_per_vector = d // 2 + 4

    def _quantize(self, x, side):
        # the rotated vector is rounded back to the model's dtype before quantization, as vLLM does
        y = fwht(x.float() * self.signs.to(x.device)).to(x.dtype).float()
        lo, hi = y.amin(-1, keepdim=True), y.amax(-1, keepdim=True)
        scale = ((hi - lo) / 15.0).clamp_min(1e-6)
        zp = _round_half_away(-lo / scale).clamp(0, 15)
        q = _round_half_away(y * (1.0 / scale) + zp).clamp(0, 15).to(torch.uint8)
        packed = q[..., 0::2] | (q[..., 1::2] << 4)
        bits = (scale.view(torch.int32) & -16) | zp.to(torch.int32)  # the zero point in the low mantissa bits
        return {"codes": packed, "scale": bits.view(torch.float32)}

    def _dequantize(self, t, side):
        bits = t["scale"].view(torch.int32)
        scale, zp = (bits & -16).view(torch.float32), (bits & 15).float()
        packed = t["codes"]
        q = torch.stack([packed & 15, packed >> 4], dim=-1).flatten(-2).float()
        y = (q - zp) * scale
        return fwht(y) * self.signs.to(y.device) / self.head_dim  # H (s x) inverted: s H y / d

    def _build_token_layout(self):
        # x = s * H y / d = y @ (H diag(s) / d), the zero point in the scale's low bits
        rotation = fwht(torch.eye(self.head_dim)) * rht_signs(self.head_dim) / self.head_dim
        side = TokenCodes(Element.UINT, bits=4, scale_field="scale", offset=Offset.PACKED_ZP, rotation=rotation)
        return TokenLayout(side, side)


@register_codec("vllm-nvfp4")
class VllmNvfp4(Nvfp4):
    """vLLM ``--kv-cache-dtype nvfp4``: fp8 block scales, and the per-layer ``k_scale`` / ``v_scale``."""
    engine, bits_supported = "vLLM", (4,)
