"""transformers' quantized KV cache (``cache_implementation="quantized"``, ``QuantizedCache``) as codecs:
``hf-quanto`` (optimum-quanto, 2 or 4 bits) and ``hf-hqq`` (HQQ, 1, 2, 4 or 8 bits).

Read from transformers' ``cache_utils`` (``QuantizedLayer``, ``QuantoQuantizedLayer``,
``HQQQuantizedLayer``; transformers 5.24), optimum-quanto 0.2.7 (``MaxOptimizer``, ``quantize_affine``,
``QBitsDequantizer``) and hqq 0.2.8 (``Quantizer.quantize`` / ``dequantize``):

- What transformers stores: per layer, the keys and values quantized group-wise (``q_group_size`` 64
  coordinates a group, along ``axis_key`` / ``axis_value``, both 0 by default; the tensor's size must be a
  multiple of the group), plus a residual of fewer
  than ``residual_length`` (128) tokens in the model's dtype. When the residual fills, the whole history
  (dequantized old tokens, residual and new tokens) is quantized again as one tensor and the residual
  emptied: old tokens are re-quantized at every flush. A prefill is quantized at once and attended
  unquantized.
- optimum-quanto, per group, in the input's dtype: ``scale = (max - min) / (2^b - 1)``, ``shift = -min``,
  codes ``clamp(round((x + shift) / scale), 0, 2^b - 1)`` (round half to even), read back as
  ``scale * code - shift``. With axis 0 a group is 64 contiguous coordinates of a token-head (head dims
  that are multiples of 64).
- HQQ: min-max codes refined by its half-quadratic proximal optimizer (in float32), ``scale`` and ``zero``
  per group in the model's dtype, read back as ``(code - zero) * scale``; axis 1 groups 64 contiguous
  coordinates of a token-head, axis 0 (transformers' default) strides each group across the whole
  tensor. HQQ packs 1, 2, 4 and 8-bit codes densely in bytes; its 3-bit packing (10 codes in 32 bits)
  is left out.

In a transformers text model (:mod:`adapters.hf.cache`) these codecs store through transformers' own
``QuantoQuantizedLayer`` / ``HQQQuantizedLayer`` with the options below (the real libraries, residual and
re-quantization included; bytes counted from the tensors they hold). Elsewhere (the synthetic probe, the
video and audio caches) the codec quantizes each token-head's groups once, as the axis that keeps a
group inside a token does (quanto axis 0, HQQ axis 1; groups of gcd(q_group_size, d) where 64 does
not divide the head dim, which transformers' groups would span two tokens for): ``encode`` below, whose
state is ``codes`` uint8 [..., T, d b / 8] (dense, LSB first), ``scale`` and ``zero`` [..., T, d / group] in
the input's dtype (quanto's ``shift`` is ``zero``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kernels.engines.preset import EnginePreset
from kernels.packing import BitField
from kernels.registry import register_codec
from registry.options import Allowed, option


class _TransformersQuantized(EnginePreset):
    """One backend of transformers' ``QuantizedCache``: ``library`` ('quanto' | 'hqq')."""
    engine = "transformers"
    library: str

    @dataclass(frozen=True)
    class Options:
        q_group_size: int = option(64, "coordinates a scale and zero cover", Allowed(lo=1))
        # past the model's positions no token would ever be flushed to the codes
        residual_length: int = option(128, "tokens kept in the model's dtype before a flush",
                                      Allowed(lo=0, positions=True))
        # transformers' default for both backends; each backend's own Options says the axes it takes
        axis_key: int = 0
        axis_value: int = 0

    def __init__(self, config, device="cpu"):
        super().__init__(config, device)
        o = self.opts
        # the per-token form's groups: q_group_size where it divides the head dim, else cut at the token-head's end
        self.group = math.gcd(o.q_group_size, self.head_dim)
        self.field = BitField(self.head_dim, self.bits)
        self.bytes_per_vector = None  # the scale and zero take the input's dtype: see expected_nbytes

    def transformers_cache_config(self) -> dict:
        """The ``cache_config`` transformers' ``QuantizedCache`` takes for this codec."""
        o = self.opts
        return {"backend": self.library, "nbits": self.bits, "q_group_size": o.q_group_size,
                "residual_length": o.residual_length, "axis_key": o.axis_key, "axis_value": o.axis_value}

    def expected_nbytes(self, shape, dtype=torch.float32):
        n = math.prod(shape[:-1])
        return n * (self.field.nbytes + 2 * (self.head_dim // self.group) * torch.empty(0, dtype=dtype).element_size())

    def expected_value_nbytes(self, shape, dtype=torch.float32):
        return self.expected_nbytes(shape, dtype)

    def _groups(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(-1, self.group)  # [tokens x heads x d / group, group]: contiguous runs of a token-head

    def _quantize(self, x, side):
        codes, scale, zero = self._library_quantize(self._groups(x))
        lead = x.shape[:-1]
        return {"codes": self.field.pack(codes.reshape(*lead, self.head_dim).long()),
                "scale": scale.reshape(*lead, -1), "zero": zero.reshape(*lead, -1)}

    def _dequantize(self, t, side):
        codes = self.field.unpack(t["codes"]).unflatten(-1, (-1, self.group))
        return self._library_dequantize(codes, t["scale"].unsqueeze(-1), t["zero"].unsqueeze(-1)).flatten(-2)

    def _library_quantize(self, g):
        raise NotImplementedError

    def _library_dequantize(self, codes, scale, zero):
        raise NotImplementedError


@register_codec("hf-quanto")
class HfQuanto(_TransformersQuantized):
    """transformers' ``QuantizedCache`` with the optimum-quanto backend (``MaxOptimizer``, affine codes)."""
    bits_supported = (2, 4)
    library = "quanto"

    @dataclass(frozen=True)
    class Options(_TransformersQuantized.Options):
        axis_key: int = option(0, "the keys' quantization axis", Allowed(choices=(0, -1)))
        axis_value: int = option(0, "the values' quantization axis", Allowed(choices=(0, -1)))

    def _library_quantize(self, g):
        # optimum-quanto's MaxOptimizer and quantize_affine, in the input's dtype
        lo, hi = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
        scale = (hi - lo) / (2 ** self.bits - 1)
        shift = -lo
        codes = torch.clamp(torch.round((g + shift) / scale), 0, 2 ** self.bits - 1).to(torch.uint8)
        return codes, scale, shift

    def _library_dequantize(self, codes, scale, zero):
        return scale * codes.to(scale.dtype) - zero  # QBitsDequantizer: scale * data - shift


@register_codec("hf-hqq")
class HfHqq(_TransformersQuantized):
    """transformers' ``QuantizedCache`` with the HQQ backend (min-max codes refined by HQQ's optimizer)."""
    bits_supported = (1, 2, 4, 8)
    library = "hqq"

    @dataclass(frozen=True)
    class Options(_TransformersQuantized.Options):
        axis_key: int = option(0, "the keys' quantization axis", Allowed(choices=(0, 1)))
        axis_value: int = option(0, "the values' quantization axis", Allowed(choices=(0, 1)))

    def _library_quantize(self, g):
        from hqq.core.quantize import Quantizer  # the library itself: its optimizer is the method

        codes, meta = Quantizer.quantize(g, nbits=self.bits, group_size=self.group, axis=1, bitpack=False,
                                         compute_dtype=g.dtype, device=str(g.device))
        # transformers' layer keeps scale and zero in the model's dtype (Quantizer.cuda casts them)
        return codes.to(torch.uint8), meta["scale"].to(g.dtype), meta["zero"].to(g.dtype)

    def _library_dequantize(self, codes, scale, zero):
        return (codes.to(scale.dtype) - zero) * scale
