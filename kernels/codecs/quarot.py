"""``quarot`` (Ashkboos et al., 2024, KV setting): Hadamard rotation with random signs, then
asymmetric round-to-nearest per group of ``group_size`` rotated coordinates (default the
padded head dim: one group per token and head, as QuaRot quantizes its KV cache).

State: ``codes`` uint8 BitField(d_pad, b), ``scale``/``zero`` fp16 [..., T, d_pad / group_size].
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from kernels.base import Codec
from kernels.encoded import Encoded
from kernels.packing import BitField
from kernels.registry import register_codec
from kernels.rotation import Rotation
from kernels.values import group_dequantize, group_quantize
from registry.options import Allowed, OptionError, option


@register_codec("quarot")
class QuaRot(Codec):
    randomized = True
    bits_supported = tuple(range(1, 9))

    @dataclass(frozen=True)
    class Options:
        # it must divide the padded head dim, which only the model says (checked as the codec is built)
        group_size: int | None = option(None, "rotated coordinates per scale/zero group (None: the padded head "
                                        "dim)", Allowed(lo=1))

    def __init__(self, config, device="cpu"):
        super().__init__(config, device)
        group_size = self.opts.group_size
        self.rotation = Rotation(self.head_dim, self.seed, self.layer, self.num_heads, device=self.device)
        self.padded = self.rotation.padded
        self.group = group_size if group_size is not None else self.padded
        if self.padded % self.group:
            raise OptionError("group_size", f"quarot group_size must divide the padded head dim {self.padded}, "
                                            f"got {group_size}")
        self.field = BitField(self.padded, self.bits)

    def _encode(self, keys):
        codes, scale, zero = group_quantize(self.rotation.forward(keys), self.bits, self.group)
        return Encoded({"codes": self.field.pack(codes), "scale": scale, "zero": zero},
                       tuple(keys.shape), keys.dtype)

    def _decode(self, state):
        t = state.tensors
        y = group_dequantize(self.field.unpack(t["codes"]), t["scale"], t["zero"], self.group)
        return self.rotation.inverse(y)

    def expected_nbytes(self, shape):
        return math.prod(shape[:-1]) * (self.field.nbytes + 2 * 2 * (self.padded // self.group))
