"""``kivi`` (Liu et al., 2024): keys quantized per channel over groups of G tokens.

Each channel of each group of ``group_size`` G consecutive tokens (default 32) gets an
asymmetric ``bits``-bit grid from its min and max, stored as fp16 scale and zero of shape
``[..., T/G, d]``; the codes stay per token, ``[..., T, ceil(d*b/8)]``, so concatenating
states along the token axis works group by group. The cache therefore encodes whole groups
(``token_block = G``); KIVI's full-precision window of recent tokens is the cache's business,
not the codec's. Values use the base per-token quantizer (KIVI's value group is 32 too).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from kernels.base import Codec
from kernels.encoded import Encoded
from kernels.packing import BitField
from kernels.registry import register_codec
from kernels.values import group_dequantize, group_quantize
from registry.options import Allowed, option


@register_codec("kivi")
class KIVI(Codec):
    bits_supported = tuple(range(1, 9))
    token_block = 32

    @dataclass(frozen=True)
    class Options:
        # a group longer than the model's positions never fills: nothing would ever be encoded
        group_size: int = option(32, "tokens per per-channel scale/zero group (the token block)",
                                 Allowed(lo=1, positions=True))

    def __init__(self, config, device="cpu"):
        super().__init__(config, device)
        self.token_block = self.opts.group_size
        self.field = BitField(self.head_dim, self.bits)

    def _groups(self, T: int) -> int:
        if T % self.token_block:
            raise ValueError(f"kivi quantizes keys per channel over groups of token_block={self.token_block} "
                             f"tokens; got T={T}, not a multiple (encode whole groups)")
        return T // self.token_block

    def _encode(self, keys):
        *lead, T, d = keys.shape
        n, G = self._groups(T), self.token_block
        x = keys.float().reshape(*lead, n, G, d).transpose(-1, -2)  # [..., T/G, d, G]
        codes, scale, zero = group_quantize(x, self.bits, G)  # scale/zero: [..., T/G, d, 1]
        codes = codes.transpose(-1, -2).reshape(*lead, T, d)
        return Encoded({"codes": self.field.pack(codes), "scale": scale.squeeze(-1), "zero": zero.squeeze(-1)},
                       tuple(keys.shape), keys.dtype)

    def _decode(self, state):
        t = state.tensors
        *lead, T, d = state.shape
        n, G = self._groups(T), self.token_block
        codes = self.field.unpack(t["codes"]).reshape(*lead, n, G, d).transpose(-1, -2)
        x = group_dequantize(codes, t["scale"].unsqueeze(-1), t["zero"].unsqueeze(-1), G)
        return x.transpose(-1, -2).reshape(*lead, T, d)

    def expected_nbytes(self, shape):
        *lead, T, d = shape
        return math.prod(lead) * (T * self.field.nbytes + 2 * 2 * self._groups(T) * d)
