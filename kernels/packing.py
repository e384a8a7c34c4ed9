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


def _offsets(n: int, bits: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    o = torch.arange(n, device=device) * bits
    return o >> 3, o & 7  # byte index, shift within it


def pack_bits(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """codes: [..., n] integers in [0, 2**bits) -> uint8 [..., ceil(n*bits/8)]."""
    if not 0 <= bits <= 16:
        raise ValueError(f"bits must be in 0..16, got {bits}")
    lead, n = codes.shape[:-1], codes.shape[-1]
    nbytes = (n * bits + 7) // 8
    if bits == 0 or n == 0:
        return torch.zeros(*lead, nbytes, dtype=torch.uint8, device=codes.device)
    c = codes.to(torch.int32)
    bad = ((c < 0) | (c >= (1 << bits))).any()
    if c.is_cuda:  # our quantizers clamp their codes: on a GPU this guard must not cost a decode step a sync
        torch._assert_async(~bad, f"codes out of range for {bits} bits")
    elif bool(bad):
        raise ValueError(f"codes out of range for {bits} bits")
    byte, shift = _offsets(n, bits, codes.device)
    shifted = c << shift.to(torch.int32)  # a code spans at most 3 bytes (bits <= 16)
    out = torch.zeros(*lead, nbytes + 2, dtype=torch.int32, device=codes.device)
    idx = byte.expand(*lead, n)
    for k in range(3):  # codes never share bits, so adding is OR-ing
        out.scatter_add_(-1, idx + k, (shifted >> (8 * k)) & 0xFF)
    return out[..., :nbytes].to(torch.uint8)


def unpack_bits(packed: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    """uint8 [..., ceil(n*bits/8)] -> int64 [..., n]; exact inverse of :func:`pack_bits`."""
    lead = packed.shape[:-1]
    if bits == 0 or n == 0:
        return torch.zeros(*lead, n, dtype=torch.int64, device=packed.device)
    p = torch.nn.functional.pad(packed.to(torch.int32), (0, 2))
    byte, shift = _offsets(n, bits, packed.device)
    idx = byte.expand(*lead, n)
    word = p.gather(-1, idx) | (p.gather(-1, idx + 1) << 8) | (p.gather(-1, idx + 2) << 16)
    return ((word >> shift.to(torch.int32)) & ((1 << bits) - 1)).to(torch.int64)
