"""SGLang's fp8 KV-cache dtypes (``--kv-cache-dtype fp8_e4m3`` / ``fp8_e5m2``) as codecs.

Read from SGLang's source (sgl-project/sglang, ``python/sglang/srt/mem_cache/memory_pool.py``,
``MHATokenToKVPool.set_kv_buffer``): where the cache dtype differs from the model's, keys and values are
divided in place by the layer's ``k_scale`` / ``v_scale`` when the checkpoint has them (in the model's
dtype: ``cache_k.div_(k_scale)``), then cast with torch's ``.to(float8)``: round to nearest even, e5m2
overflowing to infinity and e4m3 saturating at 448 or turning NaN as the installed torch does, where
vLLM's store saturates both. Without checkpoint scales nothing is divided (the default here, ``k_scale`` and ``v_scale``
1.0). One byte per coordinate; the per-layer scales are not per token.
"""
from __future__ import annotations

import torch

from .engine_preset import FP8, PerTensorFp8
from .registry import register_codec


def fp8_cast(x: torch.Tensor, kind: str) -> torch.Tensor:
    """``x.to(float8)``, torch's own cast as SGLang calls it (uint8 bit patterns): round to nearest even;
    beyond the largest finite value e5m2 becomes infinite, and e4m3 saturates at 448 with the torch this
    project locks (2.13) but is NaN with older releases (2.11, on the GPU image)."""
    return x.to(FP8[kind]).view(torch.uint8)


class _SglangFp8(PerTensorFp8):
    bits_supported = (8,)

    def _quantize(self, x, side):
        scale = self._scale(side)
        if scale != 1.0:  # divided in the model's dtype, as the pool divides in place
            x = x / torch.tensor(scale, dtype=x.dtype)
        return {"codes": fp8_cast(x, self.kind)}


@register_codec("sglang-fp8-e4m3")
class SglangFp8E4m3(_SglangFp8):
    """SGLang ``--kv-cache-dtype fp8_e4m3``."""


@register_codec("sglang-fp8-e5m2")
class SglangFp8E5m2(_SglangFp8):
    """SGLang ``--kv-cache-dtype fp8_e5m2``."""
    kind = "e5m2"
