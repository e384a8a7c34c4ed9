"""ExLlamaV2's and ExLlamaV3's quantized KV caches as codecs: ``exl2-fp8`` (``ExLlamaV2Cache_8bit``),
``exl2-q4`` / ``exl2-q6`` / ``exl2-q8`` (``ExLlamaV2Cache_Q4`` / ``_Q6`` / ``_Q8``) and ``exl3`` (ExLlamaV3's
``CacheLayer_quant``, ``k_bits`` = the codec's bits, ``v_bits`` an option, 2 to 8 each).

ExLlamaV2, read from turboderp-org/exllamav2 at da07fac (the same files as the 0.3.2 wheel on PyPI;
``exllamav2/exllamav2_ext/cuda/cache_q.cuh``:
``fp16_to_q`` / ``q_to_fp16``; ``cuda/cache.cu``: the kernels per cache type; ``exllamav2/cache.py``), built
without fast math (``-O3``), its half-precision intrinsics reproduced op for op in torch's float16:

- The model runs in fp16; each 64 coordinates of a token-head are two 32-value groups, the even and the odd
  ones (a warp's lanes hold pairs), each transformed by the unnormalized Sylvester Hadamard (5 butterfly stages,
  each rounded to fp16). Per 32 stored values (lanes 0-15 and 16-31: coefficients 0-15 of both groups, then
  16-31) the absmax ``a``; ``w = a / a`` rounded to fp16 (``__h2div``), then ``fma(w, 2^(b-1), 2^(b-1))`` rounded
  to fp16, to the nearest integer (ties to even), clamped to 0..2^b - 1; scale ``a / 2^(b-1)`` stored fp16.
  Read back: ``(q - 2^(b-1)) * scale`` in fp16, the same butterflies in fp16, times 1/32.
- Q4 stores keys and values at 4 bits (a byte per lane: even coefficient low nibble, odd high), Q8 at 8 (the
  even and odd coefficients of a lane in consecutive bytes), Q6 keys at 8 and values at 4 (``cache.cu``: wbits 6
  launches ``<8, 4>``). A token-head costs d b / 8 + d / 16 bytes a side (fp16 scale per 32).
- ``ExLlamaV2Cache_8bit``: the top byte of each fp16 value (FP8 E5M2 by truncation), d bytes.
- ``__h2div`` multiplies by an approximate reciprocal (``rcp.approx``) and rounds the float32 product to fp16;
  here the float32 quotient is correctly rounded, which can differ in the last bit of a float32 product that lands
  on an fp16 rounding boundary.
- Around the bytes: ExLlamaV2 attends each chunk in fp16 (the cache is dequantized into fp16 temporaries, the new
  tokens written there, flash-attention run over them, and the new tokens quantized afterwards):
  ``new_tokens='native'``.

ExLlamaV3, read from turboderp-org/exllamav3 at 4f8ad01 (v1.4.1; ``exllamav3_ext/cache/q_cache_kernels.cuh``:
``quant_block_x4`` / ``dequant_block_x4``; ``exllamav3/cache/quant.py``; the 1.6.5 wheel on PyPI changes only
their index arithmetic), float32 arithmetic from the fp16 cache input:

- Per 32 consecutive coordinates: the Sylvester Hadamard (butterflies on index bits 0 to 4) times 1/sqrt(32)
  (the float32 constant); ``s = max |v| + 1e-10``; codes ``floor(fma(v * (1 / s), m, m))`` with m = 2^(b-1),
  clamped to 0..2^b - 1 (since v1.0.0 a midpoint grid: code q reads as ``(q - m + 0.5) / m``; before it,
  ``lrintf(v / s * m) + m`` on the grid ``(q - m) / m``); ``s`` stored fp16; read back as
  ``(q - m + 0.5) * (s / sqrt(32) / m)`` rotated back, rounded to fp16. The cubic compander (``compand_a > 0``,
  off by default) is left out.
- Packing: the b bits of each code split into planes of 8, 4, 2 and 1 bits (those set in b, high bits first);
  within a plane value j takes bits j w .. j w + w - 1 of the group's little-endian words: b words per group.
  A token-head costs d b / 8 + d / 16 bytes a side.
- ExLlamaV3 is compiled with ``--use_fast_math``: ``1.0f / s`` is an approximate reciprocal there.
- Around the bytes: new keys and values are quantized into the cache before attention ("pre-appended"), the
  prefill kernel reading the cache dequantized (``EXL3_QC_STAGING``): ``new_tokens='stored'``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

from kernels.engines.preset import EnginePreset, _PresetValues, on_device
from kernels.packing import BitField
from kernels.registry import register_codec
from kernels.rotation import fwht, hadamard_matrix
from kernels.token_layout import BlockScale, Element, TokenCodes, TokenLayout
from registry.options import Allowed, option

R32 = torch.tensor(0.17677669529663688110, dtype=torch.float32)  # 1/sqrt(32), as ExLlamaV3 writes it


class _ExLlama(EnginePreset):
    """Both ExLlamas: a side's code bits (``_side_bits``)."""

    def _side_bits(self, side: str) -> int:
        return self.bits if side == "k" else self.value_bits


class _ScaledBlocks(_ExLlama):
    """The ExLlama caches of b-bit codes with an fp16 scale per 32 coordinates (V2's Q caches, V3): a side's
    bytes per vector."""

    def _side_bytes(self, side):
        return self.head_dim * self._side_bits(side) // 8 + 2 * self.head_dim // 32

    def expected_value_nbytes(self, shape):
        return math.prod(shape[:-1]) * self._side_bytes("v")


# --- ExLlamaV2 -----------------------------------------------------------------------------------------------
def _exl2_lanes(x16: torch.Tensor) -> torch.Tensor:
    """fp16 [..., d] -> [..., d / 64, 2, 32]: per 64 coordinates the even ones, then the odd ones (lane t holds
    coordinates 2t and 2t + 1)."""
    g = x16.unflatten(-1, (-1, 32, 2))
    return g.transpose(-1, -2)


def exl2_quantize(x: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """ExLlamaV2's ``fp16_to_q<bits>`` (4 or 8): (codes uint8 [..., d / 64, 2, 32], scales fp16 [..., d / 32])."""
    y = fwht(_exl2_lanes(x.to(torch.float16)))  # fp16 butterflies: each stage rounded
    half = 2 ** (bits - 1)
    a = y.unflatten(-1, (2, 16)).abs().amax(dim=(-3, -1), keepdim=True)  # lanes 0-15 | 16-31, both groups
    w = (y.unflatten(-1, (2, 16)).float() / a.float()).to(torch.float16).flatten(-2)
    w = (w.float() * half + half).to(torch.float16)  # __hfma2: w * 2^(b-1) is exact, one rounding
    q = torch.where(w.isnan(), 0.0, w.float().round()).clamp(0, 2 * half - 1).to(torch.uint8)  # 0/0 reads as 0
    scale = (a.float() * (1.0 / half)).to(torch.float16).flatten(-3)  # [..., d / 64, 2]: lane halves in order
    return q, scale.flatten(-2)


def exl2_dequantize(q: torch.Tensor, scale: torch.Tensor, bits: int) -> torch.Tensor:
    """``q_to_fp16``: codes [..., d / 64, 2, 32], scales [..., d / 32] -> fp16 [..., d]."""
    half = 2 ** (bits - 1)
    s = scale.unflatten(-1, (-1, 1, 2, 1))  # per lane half, for both groups
    y = ((q.float() - half).to(torch.float16).unflatten(-1, (2, 16)) * s).flatten(-2)
    y = fwht(y) * torch.tensor(1.0 / 32, dtype=torch.float16)
    return y.transpose(-1, -2).flatten(-3)


def exl2_rotation(d: int) -> torch.Tensor:
    """float32 [d, d]: stored code 2t + e of each 64 (coefficient t of the even (e = 0) or odd group) to
    coordinates, x = y @ M: the inverse transform H / 32 of each group, interleaved back."""
    m = torch.zeros(d, d)
    h = hadamard_matrix(32) / 32
    for g in range(0, d, 64):
        for e in (0, 1):
            m[g + e:g + 64:2, g + e:g + 64:2] = h
    return m


class _ExLlamaV2Q(_ScaledBlocks):
    """ExLlamaV2's Q4 / Q6 / Q8 caches: ``code_bits`` (keys, values)."""
    engine = "ExLlamaV2"
    code_bits: tuple[int, int]

    @dataclass(frozen=True)
    class Options:
        new_tokens: Literal["stored", "native"] = "native"  # ExLlamaV2 attends the chunk in fp16

    head_block = 64
    head_block_why = "ExLlamaV2's Q cache transforms {n} coordinates at a time"

    def __init__(self, config, device="cpu"):
        super().__init__(config, device)
        self.bytes_per_vector = self._side_bytes("k")

    def _side_bits(self, side):
        return self.code_bits[side == "v"]

    def _quantize(self, x, side):
        bits = self._side_bits(side)
        q, scale = exl2_quantize(x, bits)
        if bits == 4:  # a byte a lane: even coefficient low, odd high
            codes = (q[..., 0, :] | (q[..., 1, :] << 4)).flatten(-2)
        else:  # two bytes a lane: even coefficient, then odd
            codes = q.transpose(-1, -2).flatten(-3)
        return {"codes": codes, "scale": scale}

    def _build_token_layout(self):
        def side(bits):  # (q - 2^(b-1)) times the fp16 scale of each 32 stored values, then the transform
            return TokenCodes(Element.UINT, bits=bits, scale_field="scale", group=32, block_scale=BlockScale.FIELD,
                              zero_point=float(2 ** (bits - 1)), rotation=exl2_rotation(self.head_dim))
        return TokenLayout(side(self.code_bits[0]), side(self.code_bits[1]))

    def _dequantize(self, t, side):
        bits = self._side_bits(side)
        if bits == 4:
            p = t["codes"].unflatten(-1, (-1, 32))
            q = torch.stack([p & 15, p >> 4], dim=-2)
        else:
            q = t["codes"].unflatten(-1, (-1, 32, 2)).transpose(-1, -2)
        return exl2_dequantize(q, t["scale"], bits)


@register_codec("exl2-q4")
class ExLlamaV2Q4(_ExLlamaV2Q):
    """ExLlamaV2 ``ExLlamaV2Cache_Q4`` (TabbyAPI ``cache_mode: Q4``)."""
    bits_supported, code_bits = (4,), (4, 4)


@register_codec("exl2-q6")
class ExLlamaV2Q6(_ExLlamaV2Q):
    """ExLlamaV2 ``ExLlamaV2Cache_Q6``: 8-bit keys, 4-bit values (6.5 bits a coordinate on average); its bits are
    the keys', as ``vllm-turboquant-k8v4``'s."""
    bits_supported, code_bits, preset_value_bits = (8,), (8, 4), 4


@register_codec("exl2-q8")
class ExLlamaV2Q8(_ExLlamaV2Q):
    """ExLlamaV2 ``ExLlamaV2Cache_Q8``."""
    bits_supported, code_bits = (8,), (8, 8)


@register_codec("exl2-fp8")
class ExLlamaV2Fp8(_ExLlama):
    """ExLlamaV2 ``ExLlamaV2Cache_8bit``: the upper byte of each fp16 value (``compress`` in ``cache.cu``)."""
    engine = "ExLlamaV2"
    bits_supported = (8,)

    @dataclass(frozen=True)
    class Options:
        new_tokens: Literal["stored", "native"] = "native"

    def __init__(self, config, device="cpu"):
        super().__init__(config, device)
        self.bytes_per_vector = self.head_dim

    def _quantize(self, x, side):
        return {"codes": ((x.to(torch.float16).view(torch.int16) >> 8) & 0xFF).to(torch.uint8)}

    def _dequantize(self, t, side):
        return (t["codes"].to(torch.int32) << 8).to(torch.int16).view(torch.float16)

    def _build_token_layout(self):
        return TokenLayout(TokenCodes(Element.E5M2), TokenCodes(Element.E5M2))  # e5m2: the top byte of fp16


# --- ExLlamaV3 -----------------------------------------------------------------------------------------------
def _planes(bits: int) -> list[int]:
    """The plane widths a code of ``bits`` splits into, high bits first (5 = 4 + 1)."""
    return [w for w in (8, 4, 2, 1) if bits & w]


def exl3_quantize(x: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``quant_block_x4`` (compand_a = 0): (codes int64 [..., d / 32, 32], scales fp16 [..., d / 32])."""
    v = fwht(x.to(torch.float16).float().unflatten(-1, (-1, 32))) * on_device(R32, x.device)
    s = v.abs().amax(-1, keepdim=True) + torch.tensor(1e-10, dtype=torch.float32)
    m = 2 ** (bits - 1)
    t = v * (1.0 / s)
    q = torch.floor((t.double() * m + m).float())  # fmaf: one rounding of an exact float64 value
    return q.clamp(0, 2 * m - 1).long(), s.squeeze(-1).to(torch.float16)


def exl3_dequantize(q: torch.Tensor, scale: torch.Tensor, bits: int) -> torch.Tensor:
    """``dequant_block_x4``: codes [..., d / 32, 32], scales fp16 [..., d / 32] -> fp16 [..., d]."""
    m = 2 ** (bits - 1)
    sm = (scale.float() * on_device(R32, scale.device)).unsqueeze(-1) * (1.0 / m)
    return fwht((q.float() - (m - 0.5)) * sm).to(torch.float16).flatten(-2)


def exl3_pack(q: torch.Tensor, bits: int) -> torch.Tensor:
    """codes [..., n, 32] -> uint8 [..., n * 4 bits]: per group the bit planes, widest (highest bits) first."""
    out, rem = [], bits
    for w in _planes(bits):
        rem -= w
        out.append(BitField(32, w).pack((q >> rem) & (2 ** w - 1)))
    return torch.cat(out, dim=-1).flatten(-2)


def exl3_unpack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    g = codes.unflatten(-1, (-1, 4 * bits))
    q, at = torch.zeros(*g.shape[:-1], 32, dtype=torch.int64, device=codes.device), 0
    for w in _planes(bits):
        q = (q << w) | BitField(32, w).unpack(g[..., at:at + 4 * w])
        at += 4 * w
    return q


@register_codec("exl3")
class ExLlamaV3(_ScaledBlocks):
    """ExLlamaV3's quantized cache (``k_bits`` = bits, ``v_bits``; TabbyAPI ``cache_mode: "k,v"``)."""
    engine = "ExLlamaV3"
    bits_supported = (2, 3, 4, 5, 6, 7, 8)

    @dataclass(frozen=True)
    class Options:
        v_bits: int = option(0, "the values' bits (0: the keys')", Allowed(choices=(0, *range(2, 9))))
        new_tokens: Literal["stored", "native"] = "stored"  # quantized into the cache before attention

    head_block = 32
    head_block_why = "ExLlamaV3's cache quantizes {n} coordinates at a time"

    def __init__(self, config, device="cpu"):
        super().__init__(config, device)
        self.value_bits = self.opts.v_bits or self.bits
        self.value_quantizer = _PresetValues(self)
        self.bytes_per_vector = self._side_bytes("k")

    def _quantize(self, x, side):
        bits = self._side_bits(side)
        q, scale = exl3_quantize(x, bits)
        return {"codes": exl3_pack(q, bits), "scale": scale}

    def _dequantize(self, t, side):
        bits = self._side_bits(side)
        return exl3_dequantize(exl3_unpack(t["codes"], bits), t["scale"], bits)

    def _build_token_layout(self):
        """Where each side's codes are one bit plane (2, 4 or 8 bits: a dense little-endian stream), the fused
        kernel reads (q - m + 1/2) * s * (1 / sqrt(32)) / m, then the unnormalized transform of each 32."""
        d = self.head_dim

        def side(bits):
            m = 2 ** (bits - 1)
            return TokenCodes(Element.UINT, bits=bits, scale_field="scale", group=32, block_scale=BlockScale.FIELD,
                              zero_point=m - 0.5, scale=float(R32) / m,
                              rotation=torch.block_diag(*[hadamard_matrix(32)] * (d // 32)))
        if len(_planes(self.bits)) > 1 or len(_planes(self.value_bits)) > 1:
            return None
        return TokenLayout(side(self.bits), side(self.value_bits))
