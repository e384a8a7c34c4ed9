"""SGLang's fp8 KV-cache dtypes (``--kv-cache-dtype fp8_e4m3`` / ``fp8_e5m2``) as codecs.

Read from SGLang's source (sgl-project/sglang, ``python/sglang/srt/mem_cache/memory_pool.py``,
``MHATokenToKVPool.set_kv_buffer``): where the cache dtype differs from the model's, keys and values are
divided in place by the layer's ``k_scale`` / ``v_scale`` when the checkpoint has them (in the model's
dtype: ``cache_k.div_(k_scale)``), then cast with torch's ``.to(float8)``: round to nearest even, e5m2
overflowing to infinity and e4m3 saturating at 448 or turning NaN as the installed torch does, where
vLLM's store saturates both. Without checkpoint scales nothing is divided (the default here, ``k_scale`` and ``v_scale``
1.0). One byte per coordinate; the per-layer scales are not per token.

``sglang-fp4-e2m1`` (``--kv-cache-dtype fp4_e2m1``, since renamed ``fp4_mx_block16``: the same arithmetic,
``python/sglang/srt/layers/quantization/kvfp4_tensor.py``, ``KVFP4QuantizeUtil``, at 0e6b6cf): per block of
16 coordinates an exponent ``e = ceil(log2(max(amax / 6, 1e-10)))`` stored as the byte ``e + 127``, then
each coordinate divided by ``2^e`` and rounded to fp4 e2m1 with ties away from zero (the count of the
magnitudes' midpoints at or below it), saturating at 6, two per byte, element 2i in the low nibble.
Computed in float32 (SGLang compiles it with torch.compile, which keeps float32 throughout). No per-layer
scale. A token-head costs ``d / 2 + d / 16`` bytes.
"""
from __future__ import annotations

import torch

from kernels.engines.preset import FP8, BlockFp4, PerTensorFp8, e2m1_codes, pack_nibbles
from kernels.registry import register_codec
from kernels.token_layout import BlockScale


def fp8_cast(x: torch.Tensor, kind: str) -> torch.Tensor:
    """``x.to(float8)``, torch's own cast as SGLang calls it (uint8 bit patterns): round to nearest even;
    beyond the largest finite value e5m2 becomes infinite, and e4m3 saturates at 448 with the torch this
    project locks (2.13) but is NaN with older releases (2.11, on the GPU image)."""
    return x.to(FP8[kind]).view(torch.uint8)


class _SglangFp8(PerTensorFp8):
    engine = "SGLang"
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


@register_codec("sglang-fp4-e2m1")
class SglangFp4E2m1(BlockFp4):
    """SGLang ``--kv-cache-dtype fp4_e2m1`` (now ``fp4_mx_block16``): power-of-two block scales."""
    engine, block_scale = "SGLang", BlockScale.UE8M0
    bits_supported = (4,)

    def _block_scale(self, sf):
        return torch.exp2(sf.float() - 127)

    def _quantize(self, x, side):
        xb = x.float().unflatten(-1, (-1, self.group))
        e = torch.ceil(torch.log2((xb.abs().amax(-1, keepdim=True) / 6.0).clamp_min(1e-10)))
        codes = e2m1_codes(xb / torch.exp2(e), "away").flatten(-2)
        return {"codes": pack_nibbles(codes), "scale": (e.squeeze(-1) + 127).to(torch.uint8)}
