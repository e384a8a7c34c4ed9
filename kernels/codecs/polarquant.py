"""``polarquant`` (Han et al., 2025): random rotation, then a recursive polar transform.

The rotated key ``y`` (``d_pad`` coordinates, the norm kept in it) is cut into blocks of
``2^L`` coordinates (option ``levels`` L, default 4). Level 1 turns each pair
``(y_2i, y_2i+1)`` into an angle in [0, 2π) and a radius; level l >= 2 turns each pair of
level-(l-1) radii ``(r_a, r_b)`` into ``atan2(r_b, r_a)`` in [0, π/2] and ``sqrt(r_a²+r_b²)``.
After L levels one radius per block is left; it is stored in fp16. Level-l angles are
quantized with the Lloyd–Max codebook ``polar{l}``.

Bits per angle for nominal b (option ``angle_bits``, a list of L ints, overrides): level 1
gets b, levels >= 2 get max(b - 2, 1) — at b = 4 the paper's (4, 2, 2, 2).

State: ``a1`` .. ``aL`` uint8 BitField(d_pad / 2^l, bits_l) and ``radius`` fp16
``[..., T, d_pad / 2^L]``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kernels.base import Codec
from kernels.encoded import Encoded
from kernels.lloyd_max import codebook, quantize
from kernels.packing import BitField
from kernels.registry import register_codec
from kernels.rotation import Rotation
from registry.options import Allowed, OptionError, option


def default_angle_bits(bits: int, levels: int) -> tuple[int, ...]:
    return (bits,) + (max(bits - 2, 1),) * (levels - 1)


def polar_forward(y: torch.Tensor, levels: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    """y: [..., n] -> (angles per level, level l: [..., n / 2^l]; radii [..., n / 2^L])."""
    angles = []
    x = y[..., 0::2], y[..., 1::2]
    theta = torch.atan2(x[1], x[0])
    angles.append(torch.where(theta < 0, theta + 2 * math.pi, theta))  # [0, 2π)
    r = torch.hypot(x[0], x[1])
    for _ in range(2, levels + 1):
        a, b = r[..., 0::2], r[..., 1::2]
        angles.append(torch.atan2(b, a))  # both >= 0: [0, π/2]
        r = torch.hypot(a, b)
    return angles, r


def polar_inverse(angles: list[torch.Tensor], r: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`polar_forward`."""
    for psi in reversed(angles[1:]):
        r = torch.stack((r * torch.cos(psi), r * torch.sin(psi)), dim=-1).flatten(-2)
    theta = angles[0]
    return torch.stack((r * torch.cos(theta), r * torch.sin(theta)), dim=-1).flatten(-2)


@register_codec("polarquant")
class PolarQuant(Codec):
    randomized = True
    bits_supported = tuple(range(1, 9))

    @dataclass(frozen=True)
    class Options:
        # 2^L may not pass the padded head dim (the model's: checked as the codec is built); 2^16 passes any
        levels: int = option(4, "polar levels L: blocks of 2^L coordinates", Allowed(lo=1, hi=16))
        angle_bits: tuple[int, ...] | None = option(None, "bits per level, L values (None: b, then max(b - 2, 1))",
                                                    Allowed(lo=1, hi=10))  # Lloyd-Max codebooks stop at 10

    def __init__(self, config, device="cpu"):
        super().__init__(config, device)
        bits, head_dim, levels, angle_bits = self.bits, self.head_dim, self.opts.levels, self.opts.angle_bits
        self.rotation = Rotation(head_dim, self.seed, self.layer, self.num_heads, device=self.device)
        self.padded = self.rotation.padded
        if (1 << levels) > self.padded:
            raise OptionError("levels", f"polarquant levels must be in 1..{self.padded.bit_length() - 1} for "
                                        f"head_dim {head_dim} (padded to {self.padded}), got {levels}")
        self.levels = levels
        ab = tuple(angle_bits) if angle_bits is not None else default_angle_bits(bits, levels)
        if len(ab) != levels:
            raise OptionError("angle_bits", f"polarquant angle_bits must be {levels} values (one per level), "
                                            f"got {len(ab)}")
        self.angle_bits = tuple(int(b) for b in ab)
        self.fields = [BitField(self.padded >> l, b) for l, b in enumerate(self.angle_bits, start=1)]
        self._centroids = {}

    def centroids(self, level: int, device) -> torch.Tensor:
        key = (level, device)
        if key not in self._centroids:
            self._centroids[key] = codebook(f"polar{level}", self.padded, self.angle_bits[level - 1], device)
        return self._centroids[key]

    def _encode(self, keys):
        y = self.rotation.forward(keys.float())  # [..., T, d_pad], norm kept
        angles, r = polar_forward(y, self.levels)
        tensors = {}
        for l, (a, f) in enumerate(zip(angles, self.fields), start=1):
            tensors[f"a{l}"] = f.pack(quantize(a, self.centroids(l, a.device)))
        tensors["radius"] = r.to(torch.float16)
        return Encoded(tensors, tuple(keys.shape), keys.dtype)

    def _decode(self, state):
        t = state.tensors
        angles = []
        for l, f in enumerate(self.fields, start=1):
            codes = f.unpack(t[f"a{l}"])
            angles.append(self.centroids(l, codes.device)[codes])
        return self.rotation.inverse(polar_inverse(angles, t["radius"].float()))

    def expected_nbytes(self, shape):
        per_token = sum(f.nbytes for f in self.fields) + 2 * (self.padded >> self.levels)
        return math.prod(shape[:-1]) * per_token
