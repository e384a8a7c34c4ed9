"""``qjl``: 1-bit quantized Johnson–Lindenstrauss sketch of each key (Zandieh et al., 2024).

Keys ``[..., T, d]`` are projected by a Gaussian ``S`` ``[m, d]`` (``m = bits * d`` unless the
option ``m`` says otherwise) and only the signs are kept, plus ``||k||`` in fp16. The inner
product with a full-precision query is estimated without bias by

    <q, k> ≈ sqrt(pi/2) / m * ||k|| * <S q, sign(S k)>

because ``E[<s, q> sign(<s, k>)] = sqrt(2/pi) <q, k> / ||k||`` for ``s ~ N(0, I)``.
:class:`GaussianSketch` is shared with TurboQuant-prod's residual stage.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kernels.base import Codec
from kernels.encoded import Encoded
from kernels.packing import BitField
from kernels.registry import register_codec
from kernels.seeding import private_generator
from registry.options import Allowed, option

#: the most sketch rows: 2^16 sign bits a token already outweigh an fp16 key of head dim 4096, and the sketch
#: is drawn as [heads, m, head_dim] float32 for every layer
MAX_ROWS = 1 << 16


class GaussianSketch:
    """A Gaussian projection ``S`` with N(0, 1) entries, one per head.

    Drawn on the CPU from ``private_generator(seed, layer, purpose)`` as ``[num_heads, m, d]``
    (head h is the same matrix whatever num_heads is, and the same on every device).
    With ``num_heads == 1`` it broadcasts over any ``[..., T, d]``; otherwise inputs are
    ``[..., H, T, d]``.
    """

    def __init__(self, m: int, dim: int, seed: int, layer: int, num_heads: int = 1, purpose: str = "qjl"):
        if m < 1:
            raise ValueError(f"the sketch needs m >= 1 rows, got {m}")
        self.m = m
        self.dim = dim
        self.num_heads = num_heads
        g = private_generator(seed, layer, purpose)
        self._S = {torch.device("cpu"): torch.randn((num_heads, m, dim), generator=g)}
        #: sqrt(pi/2) / m: turns <S q, sign(S k)> into an unbiased estimate of <q, k/||k||>
        self.scale = math.sqrt(math.pi / 2) / m

    @property
    def matrices(self) -> torch.Tensor:
        """The drawn ``S`` of every head, [num_heads, m, d] float32 on the CPU (do not modify)."""
        return self._S[torch.device("cpu")]

    def matrix(self, x: torch.Tensor) -> torch.Tensor:
        """``S`` on x's device, shaped to broadcast with x: [m, d] or [H, m, d]."""
        S = self._S.get(x.device)
        if S is None:
            S = self._S[x.device] = self._S[torch.device("cpu")].to(x.device)
        if self.num_heads == 1:
            return S[0]
        if x.dim() < 3 or x.shape[-3] != self.num_heads:
            raise ValueError(f"expected inputs [..., {self.num_heads}, T, d], got {tuple(x.shape)}")
        return S

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """x: [..., T, d] -> S x: [..., T, m] (float32)."""
        x = x.float()
        return x @ self.matrix(x).transpose(-1, -2)

    def sign_bits(self, x: torch.Tensor) -> torch.Tensor:
        """x: [..., T, d] -> int64 [..., T, m], 1 where <s_i, x> >= 0 (sign(0) = +)."""
        return (self.project(x) >= 0).to(torch.int64)

    def lift(self, bits: torch.Tensor) -> torch.Tensor:
        """bits [..., T, m] in {0, 1} -> S^T sign: [..., T, d] (float32)."""
        pm = bits.float() * 2 - 1
        return pm @ self.matrix(pm)

    def inner(self, q: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
        """q [..., Tq, d], bits [..., T, m] -> <S q, sign(S k)>: [..., Tq, T] (float32)."""
        return self.project(q) @ (bits.float() * 2 - 1).transpose(-1, -2)


@register_codec("qjl")
class QJL(Codec):
    """State: ``qjl`` uint8 BitField(m, 1) of sign(S k) (bit 1 = positive), ``norm`` fp16 [..., T, 1]."""
    randomized = True

    bits_supported = tuple(range(1, 9))
    has_score_estimator = True

    @dataclass(frozen=True)
    class Options:
        m: int | None = option(None, "sketch rows (None: bits x head dim)", Allowed(lo=1, hi=MAX_ROWS))

    def __init__(self, config, device="cpu"):
        super().__init__(config, device)
        self.m = self.opts.m if self.opts.m is not None else self.bits * self.head_dim
        self.sketch = GaussianSketch(self.m, self.head_dim, self.seed, self.layer, self.num_heads, "qjl")
        self.field = BitField(self.m, 1)

    def _encode(self, keys):
        k = keys.float()
        tensors = {"qjl": self.field.pack(self.sketch.sign_bits(k)),
                   "norm": k.norm(dim=-1, keepdim=True).to(torch.float16)}
        return Encoded(tensors, tuple(keys.shape), keys.dtype)

    def _decode(self, state):
        bits = self.field.unpack(state.tensors["qjl"])
        return self.sketch.scale * state.tensors["norm"].float() * self.sketch.lift(bits)

    def score(self, q, state):
        bits = self.field.unpack(state.tensors["qjl"])
        norm = state.tensors["norm"].float().transpose(-1, -2)  # [..., 1, T]
        return self.sketch.scale * norm * self.sketch.inner(q, bits)

    def expected_nbytes(self, shape):
        lead = math.prod(shape[:-1])
        return lead * (self.field.nbytes + 2)
