"""Sign-flipped, normalised Walsh–Hadamard rotation with a fast O(d log d) butterfly.

``y = H D x / sqrt(n)`` where ``D`` holds ±1 signs drawn per (seed, layer, head) and ``n``
is the head dim rounded up to a power of two (the input is zero-padded; codecs count the
padded coordinates they store). ``H`` is symmetric with ``H H = n I``, so the inverse is
``x = D H y / sqrt(n)``.
"""
from __future__ import annotations

import math

import torch

from kernels.seeding import private_generator


def next_pow2(d: int) -> int:
    return 1 << (d - 1).bit_length()


def fwht(x: torch.Tensor) -> torch.Tensor:
    """Unnormalised Walsh–Hadamard transform over the last dim (a power of two), Sylvester order."""
    n = x.shape[-1]
    if n & (n - 1):
        raise ValueError(f"fwht needs a power-of-two length, got {n}")
    lead = x.shape[:-1]
    h = 1
    y = x
    while h < n:
        y = y.reshape(*lead, n // (2 * h), 2, h)
        a, b = y[..., 0, :], y[..., 1, :]
        y = torch.stack((a + b, a - b), dim=-2)
        h *= 2
    return y.reshape(*lead, n)


def hadamard_matrix(n: int, dtype=torch.float32, device="cpu") -> torch.Tensor:
    """The n x n Sylvester Hadamard matrix (entries ±1); used by kernels and tests."""
    return fwht(torch.eye(n, dtype=dtype, device=device))


class Rotation:
    """Random sign flips then normalised WHT, one sign vector per head.

    ``signs``: [num_heads, 1, n] so that it broadcasts over inputs [..., H, T, n]
    (or over any [..., T, n] when num_heads == 1).
    """

    def __init__(self, dim: int, seed: int = 0, layer: int = 0, num_heads: int = 1,
                 purpose: str = "rotation", device="cpu"):
        self.dim = dim
        self.padded = next_pow2(dim)
        self.num_heads = num_heads
        g = private_generator(seed, layer, purpose)
        bits = torch.randint(0, 2, (num_heads, self.padded), generator=g)
        self.signs = (bits * 2 - 1).to(torch.float32).unsqueeze(1).to(device)
        self.scale = 1.0 / math.sqrt(self.padded)

    def _signs_for(self, x: torch.Tensor) -> torch.Tensor:
        s = self.signs.to(x.device)
        if self.num_heads == 1:
            return s[0, 0]
        if x.dim() < 3 or x.shape[-3] != self.num_heads:
            raise ValueError(f"expected inputs [..., {self.num_heads}, T, d], got {tuple(x.shape)}")
        return s

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        if self.padded == self.dim:
            return x
        return torch.nn.functional.pad(x, (0, self.padded - self.dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [..., T, dim] -> rotated [..., T, padded] (float32)."""
        x = self.pad(x.float())
        return fwht(x * self._signs_for(x)) * self.scale

    def inverse(self, y: torch.Tensor) -> torch.Tensor:
        """y: [..., T, padded] -> [..., T, dim] (float32)."""
        y = y.float()
        x = fwht(y) * self.scale * self._signs_for(y)
        return x[..., : self.dim]

    def pm1_matrix(self, head: int = 0) -> torch.Tensor:
        """sqrt(padded) * :meth:`matrix`, built exactly: H diag(signs), entries ±1, float64 on the CPU."""
        return hadamard_matrix(self.padded, dtype=torch.float64) * self.signs[head, 0].cpu().double().unsqueeze(0)

    def matrix(self, head: int = 0) -> torch.Tensor:
        """The padded x padded rotation matrix R with y = x R^T (for kernels and tests)."""
        H = hadamard_matrix(self.padded)
        return H * self.signs[head, 0].cpu().unsqueeze(0) * self.scale
