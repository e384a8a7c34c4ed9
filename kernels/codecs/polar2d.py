"""``polarquant-2d`` (Wu et al.): each 2-D pair of a key in polar coordinates, no rotation.

Pairs are ``(x_i, x_{i+d/2})`` — the ``rotate_half`` RoPE pairing of Hugging Face models —
or ``(x_2i, x_2i+1)`` with the option ``pairing='adjacent'``. Per pair:
- radius: ``radius_bits``-bit asymmetric uniform quantization per token, over groups of
  ``radius_group`` pairs (default all d/2 pairs: one group per token), fp16 scale and zero;
- angle: ``angle_bits``-bit uniform quantization of [-π, π), centroids at cell centres.
Both default to the nominal bits.

State: ``radius`` uint8 BitField(d/2, n), ``rscale``/``rzero`` fp16 [..., T, d/2/radius_group],
``angle`` uint8 BitField(d/2, m).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, get_args

import torch

from kernels.base import Codec
from kernels.encoded import Encoded
from kernels.packing import BitField
from kernels.registry import register_codec
from kernels.values import group_dequantize, group_quantize
from registry.options import Allowed, OptionError, option

Pairing = Literal["rotate_half", "adjacent"]
PAIRINGS = get_args(Pairing)


@register_codec("polarquant-2d")
class PolarQuant2D(Codec):
    bits_supported = tuple(range(1, 9))

    @dataclass(frozen=True)
    class Options:
        pairing: Pairing = "rotate_half"
        # it must divide the head dim's pairs, which only the model says (checked as the codec is built)
        radius_group: int | None = option(None, "pairs per radius scale/zero group (None: all d/2 pairs)",
                                          Allowed(lo=1))
        radius_bits: int | None = option(None, "bits per radius (None: the nominal bits)", Allowed(lo=1, hi=16))
        angle_bits: int | None = option(None, "bits per angle (None: the nominal bits)", Allowed(lo=1, hi=16))

    def __init__(self, config, device="cpu"):
        super().__init__(config, device)
        bits, head_dim, o = self.bits, self.head_dim, self.opts
        pairing, radius_group, radius_bits, angle_bits = o.pairing, o.radius_group, o.radius_bits, o.angle_bits
        if head_dim % 2:
            raise ValueError(f"polarquant-2d pairs coordinates: head_dim must be even, got {head_dim}")
        self.pairing = pairing
        self.pairs = head_dim // 2
        self.radius_group = radius_group if radius_group is not None else self.pairs
        if self.pairs % self.radius_group:
            raise OptionError("radius_group", f"polarquant-2d radius_group must divide the {self.pairs} pairs, "
                                              f"got {radius_group}")
        self.radius_bits = radius_bits if radius_bits is not None else bits
        self.angle_bits = angle_bits if angle_bits is not None else bits
        self.radius_field = BitField(self.pairs, self.radius_bits)
        self.angle_field = BitField(self.pairs, self.angle_bits)

    def _split(self, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.pairing == "adjacent":
            return k[..., 0::2], k[..., 1::2]
        return k[..., : self.pairs], k[..., self.pairs:]

    def _merge(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.pairing == "adjacent":
            return torch.stack((x, y), dim=-1).flatten(-2)
        return torch.cat((x, y), dim=-1)

    def _encode(self, keys):
        x, y = self._split(keys.float())
        radius = torch.hypot(x, y)
        rcodes, rscale, rzero = group_quantize(radius, self.radius_bits, self.radius_group)
        levels = 1 << self.angle_bits
        step = 2 * math.pi / levels
        acodes = torch.floor((torch.atan2(y, x) + math.pi) / step).to(torch.int64) % levels  # θ = π wraps to -π
        tensors = {"radius": self.radius_field.pack(rcodes), "rscale": rscale, "rzero": rzero,
                   "angle": self.angle_field.pack(acodes)}
        return Encoded(tensors, tuple(keys.shape), keys.dtype)

    def _decode(self, state):
        t = state.tensors
        radius = group_dequantize(self.radius_field.unpack(t["radius"]), t["rscale"], t["rzero"],
                                  self.radius_group)
        step = 2 * math.pi / (1 << self.angle_bits)
        theta = -math.pi + (self.angle_field.unpack(t["angle"]).float() + 0.5) * step
        return self._merge(radius * torch.cos(theta), radius * torch.sin(theta))

    def expected_nbytes(self, shape):
        side = 2 * 2 * (self.pairs // self.radius_group)
        return math.prod(shape[:-1]) * (self.radius_field.nbytes + self.angle_field.nbytes + side)
