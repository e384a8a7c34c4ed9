"""TensorRT-LLM's quantized KV caches (``kv_cache_quant_algo`` INT8, FP8, NVFP4) as codecs: ``trtllm-int8``,
``trtllm-fp8`` and ``trtllm-nvfp4``.

Read from NVIDIA/TensorRT-LLM at 0097566: ``cpp/tensorrt_llm/kernels/unfusedAttentionKernels/
unfusedAttentionKernels_2_template.h`` (``applyBiasRopeUpdateKVCache``: ``store_8bits_vec`` and
``quantizeAndWriteFP4KVCache``), ``kernels/decoderMaskedMultiheadAttentionUtils.h`` (``kv_cache_scale_type_t``,
the int8 store ``float_to_int8_rn`` = ``cvt.rni.sat.s8.f32``) and ``kernels/quantization.cuh``
(``cvt_warp_fp16_to_fp4``).

- int8 and fp8 share one per-layer scale for keys and values (``qkv_scale_orig_quant[0]``, the reciprocal of the
  checkpoint's ``kv_cache_scaling_factor``, ``kv_scale`` here; 1.0 without one). int8: ``x * (1 / kv_scale)`` in
  float32, rounded to the nearest integer (ties to even) and saturated to -128..127. fp8: the scale is cast to the
  model's type (``kv_cache_scale_type_t<half | bf16, fp8>``) and the product taken there, then cast to e4m3
  (nearest even, saturating). Read back as ``code * kv_scale``. One byte a coordinate; the scale is per layer.
  TensorRT-LLM's int8 cache is meant for ModelOpt-calibrated scales (amax / 127 per layer): with 1.0 it rounds
  every coordinate to an integer.
- NVFP4 (:class:`kernels.engines.preset.Nvfp4`, the arithmetic vLLM's ``nvfp4`` took from it): fp8 block
  scales per 16 coordinates under a second-level scale per layer and side (``qkv_scale_orig_quant[1]`` keys,
  ``[2]`` values: ``1 / k_scale``, ``1 / v_scale``); the value block scales are written interleaved by 4
  tokens for the trtllm-gen kernels, which moves bytes and no values (not reproduced).

Around the bytes: the context phase attends the chunk from the projections (``new_tokens='native'``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.engines.preset import SCALE, EnginePreset, Nvfp4, fp8_saturate, fp8_value
from kernels.registry import register_codec
from registry.options import option
from kernels.token_layout import Element, TokenCodes, TokenLayout


class _PerLayer8(EnginePreset):
    """A byte a coordinate under one per-layer scale for keys and values."""
    engine = "TensorRT-LLM"
    bits_supported = (8,)

    @dataclass(frozen=True)
    class Options:
        kv_scale: float = option(1.0, "the checkpoint's kv_cache_scaling_factor (1.0 without calibration)", SCALE)

    def __init__(self, config, device="cpu"):
        super().__init__(config, device)
        self.bytes_per_vector = self.head_dim

    def _build_token_layout(self):
        side = TokenCodes(self.element, scale=self.opts.kv_scale)
        return TokenLayout(side, side)


@register_codec("trtllm-int8")
class TrtllmInt8(_PerLayer8):
    """TensorRT-LLM ``kv_cache_quant_algo=INT8``."""
    element = Element.INT8

    def _quantize(self, x, side):
        y = x.float() * torch.tensor(1.0 / self.opts.kv_scale, dtype=torch.float32)
        return {"codes": y.round().clamp(-128, 127).to(torch.int8).view(torch.uint8)}

    def _dequantize(self, t, side):
        return t["codes"].view(torch.int8).float() * self.opts.kv_scale


@register_codec("trtllm-fp8")
class TrtllmFp8(_PerLayer8):
    """TensorRT-LLM ``kv_cache_quant_algo=FP8``."""
    element = Element.E4M3

    def _quantize(self, x, side):
        t = x.dtype if x.dtype in (torch.float16, torch.bfloat16) else torch.float32
        y = x.to(t) * torch.tensor(1.0 / self.opts.kv_scale, dtype=torch.float32).to(t)  # in the model's type
        return {"codes": fp8_saturate(y.float(), "e4m3")}

    def _dequantize(self, t, side):
        return fp8_value(t["codes"], "e4m3") * self.opts.kv_scale


@register_codec("trtllm-nvfp4")
class TrtllmNvfp4(Nvfp4):
    """TensorRT-LLM ``kv_cache_quant_algo=NVFP4``: ``k_scale`` / ``v_scale`` the second-level scales' reciprocals."""
    engine, bits_supported = "TensorRT-LLM", (4,)
