"""Bit packing: ``n`` codes of ``bits`` bits per vector into a dense little-endian bitstream.

Layout (the Triton kernels rely on it): code ``i`` of a vector occupies bits
``[i*bits, (i+1)*bits)`` of that vector's byte row, least significant bit first, so it is
``((row[o >> 3] | row[(o >> 3) + 1] << 8) >> (o & 7)) & (2**bits - 1)`` with ``o = i*bits``.
Each vector owns ``ceil(n*bits/8)`` bytes; tokens stay independent, so a cache appends them.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class BitField:
    n: int  # codes per vector
    bits: int  # bits per code, 0..16

    @property
    def nbytes(self) -> int:
        return (self.n * self.bits + 7) // 8

    def pack(self, codes: torch.Tensor) -> torch.Tensor:
        """codes: [..., n] integers in [0, 2**bits) -> uint8 [..., nbytes]."""
        return pack_bits(codes, self.bits)

    def unpack(self, packed: torch.Tensor) -> torch.Tensor:
        """uint8 [..., nbytes] -> int64 [..., n]."""
        return unpack_bits(packed, self.bits, self.n)


def pack_bits(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """codes: [..., n] integers in [0, 2**bits) -> uint8 [..., ceil(n*bits/8)]."""
    if not 0 <= bits <= 16:
        raise ValueError(f"bits must be in 0..16, got {bits}")
    lead, n = codes.shape[:-1], codes.shape[-1]
    nbytes = (n * bits + 7) // 8
    if bits == 0 or n == 0:
        return torch.zeros(*lead, nbytes, dtype=torch.uint8, device=codes.device)
    c = codes.to(torch.int64)
    if bool((c < 0).any()) or bool((c >= (1 << bits)).any()):
        raise ValueError(f"codes out of range for {bits} bits")
    shifts = torch.arange(bits, device=codes.device)
    bitplane = ((c.unsqueeze(-1) >> shifts) & 1).reshape(*lead, n * bits)  # LSB first
    pad = nbytes * 8 - n * bits
    if pad:
        bitplane = torch.nn.functional.pad(bitplane, (0, pad))
    weights = (1 << torch.arange(8, device=codes.device))
    return (bitplane.reshape(*lead, nbytes, 8) * weights).sum(-1).to(torch.uint8)


def unpack_bits(packed: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    """uint8 [..., ceil(n*bits/8)] -> int64 [..., n]; exact inverse of :func:`pack_bits`."""
    lead = packed.shape[:-1]
    if bits == 0 or n == 0:
        return torch.zeros(*lead, n, dtype=torch.int64, device=packed.device)
    shifts = torch.arange(8, device=packed.device)
    bitplane = ((packed.to(torch.int64).unsqueeze(-1) >> shifts) & 1).reshape(*lead, -1)[..., : n * bits]
    weights = (1 << torch.arange(bits, device=packed.device))
    return (bitplane.reshape(*lead, n, bits) * weights).sum(-1)
