"""Per-token group-wise asymmetric integer quantization (values, and the RTN baselines).

Each token's ``d`` coordinates are cut into groups of ``group_size``; a group stores a fp16
scale and a fp16 zero point (its minimum) and ``bits``-bit codes, ``x ≈ zero + scale * code``.
"""
from __future__ import annotations

import torch

from kernels.encoded import Encoded
from kernels.packing import BitField

SIDE_DTYPE = torch.float16


def group_quantize(x: torch.Tensor, bits: int, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x: [..., n] with n % group == 0 -> (codes int64 [..., n], scale [..., n/group], zero [..., n/group]).

    Scale and zero are rounded to fp16 *before* the codes are chosen, so decode sees exactly
    what encode assumed.
    """
    lead, n = x.shape[:-1], x.shape[-1]
    g = x.float().reshape(*lead, n // group, group)
    lo = g.amin(-1)
    hi = g.amax(-1)
    qmax = (1 << bits) - 1
    zero = lo.to(SIDE_DTYPE)
    scale = ((hi - zero.float()) / qmax).to(SIDE_DTYPE)
    # fp16 rounding of the scale can shrink the range; the clamp keeps codes in range.
    safe = torch.where(scale.float() > 0, scale.float(), torch.ones_like(scale, dtype=torch.float32))
    codes = torch.round((g - zero.float().unsqueeze(-1)) / safe.unsqueeze(-1)).clamp(0, qmax)
    return codes.to(torch.int64).reshape(*lead, n), scale, zero


def group_dequantize(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group: int) -> torch.Tensor:
    lead, n = codes.shape[:-1], codes.shape[-1]
    g = codes.float().reshape(*lead, n // group, group)
    return (zero.float().unsqueeze(-1) + scale.float().unsqueeze(-1) * g).reshape(*lead, n)


class ValueQuantizer:
    """Values ``[..., T, d]``: per-token groups of ``group_size`` (default 32) along d.

    A head dim that is not a multiple of the group is zero-padded to one; the padded
    coordinates are stored and counted.
    """

    def __init__(self, bits: int, head_dim: int, group_size: int = 32):
        if not 1 <= bits <= 16:
            raise ValueError(f"value bits must be in 1..16 (or use codec 'none'), got {bits}")
        if group_size < 1:
            raise ValueError(f"value group size must be >= 1, got {group_size}")
        self.bits = bits
        self.head_dim = head_dim
        self.group = min(group_size, head_dim)
        self.padded = -(-head_dim // self.group) * self.group
        self.field = BitField(self.padded, bits)

    def encode(self, v: torch.Tensor) -> Encoded:
        x = v.float()
        if self.padded != self.head_dim:
            x = torch.nn.functional.pad(x, (0, self.padded - self.head_dim))
        codes, scale, zero = group_quantize(x, self.bits, self.group)
        return Encoded({"codes": self.field.pack(codes), "scale": scale, "zero": zero}, tuple(v.shape), v.dtype)

    def decode(self, state: Encoded) -> torch.Tensor:
        codes = self.field.unpack(state.tensors["codes"])
        x = group_dequantize(codes, state.tensors["scale"], state.tensors["zero"], self.group)
        return x[..., : self.head_dim]

    def expected_nbytes(self, shape) -> int:
        lead = 1
        for s in shape[:-1]:
            lead *= s
        return lead * (self.field.nbytes + 2 * 2 * (self.padded // self.group))
