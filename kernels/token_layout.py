"""What the fused per-token decode kernel (:mod:`kernels.triton.token_attention`) needs from a codec
whose keys and values are scalar codes with per-token side information: the engines' KV-cache
presets (:mod:`kernels.engines.preset`), declared by the codec as data (``Codec.token_layout()``).

One token of one head, ``d`` coordinates, is read back as

    y_j = code value of coordinate j          (:class:`Element`: fp8 or fp4 bits, int8, or an
                                                unsigned b-bit code, or a codebook entry it indexes)
    y_j *= block scale of j's group            (``group``: one scale byte per ``group`` coordinates,
                                                read as :class:`BlockScale` says)
    y_j -= zp                                  (``offset == Offset.PACKED_ZP``: the zero point in the
                                                low 4 mantissa bits of the float32 scale)
    y  /= sqrt(|y|^2 + 1e-16)                  (``normalize``: vLLM TurboQuant's norm correction)
    y  *= scale                                (a field [..., T, 1] or a constant)
    y_j += zero                                (``offset == Offset.ZERO``: an additive field [..., T, 1])
    x   = y @ M                                (``rotation``: M float32 [d, d], or none)

for keys and values alike (:class:`TokenCodes`, one per side). Scores are then ``q . x`` = ``y . (M q)``
(the query is rotated once), and the attention output ``sum_t p_t x_t = (sum_t p_t y_t) @ M`` (the
output rotated once per program), so no token is rotated back.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import torch


class Element(str, Enum):
    """How one stored code reads as a number."""

    E4M3 = "e4m3"  # fp8 bit patterns, one byte (the finite values only: engines saturate)
    E5M2 = "e5m2"
    INT8 = "int8"  # two's complement, one byte
    E2M1 = "e2m1"  # fp4 bit patterns (sign bit 3; magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6), two per byte, low first
    UINT = "uint"  # an unsigned b-bit code, dense LSB first (BitField(d, b))
    CODEBOOK = "codebook"  # a b-bit index (as UINT) into ``codebook``


class BlockScale(str, Enum):
    """How a block scale byte reads as a number."""

    E4M3 = "e4m3"  # an fp8 value (NVFP4)
    UE8M0 = "ue8m0"  # a power of two, 2^(byte - 127) (MX)


class Offset(str, Enum):
    NONE = "none"
    PACKED_ZP = "packed_zp"  # y = (code - zp) * (scale with its low 4 bits cleared); zp = those bits
    ZERO = "zero"  # y = code * scale + zero, zero a per-token field


@dataclass(frozen=True, eq=False)
class TokenCodes:
    """One side (keys or values) of a token layout; see the module docstring.

    ``codes_field``: uint8 [..., T, ceil(d bits / 8)]; ``scale_field``: float32 or float16 [..., T, 1]
    (None: the constant ``scale``), or with a ``group`` uint8 [..., T, d / group] block scales, each
    read as ``block_scale`` says and times the constant ``scale``; ``zero_field``: float16 [..., T, 1]
    where ``offset`` is ZERO."""

    element: Element
    bits: int = 8
    codes_field: str = "codes"
    scale_field: str | None = None
    scale: float = 1.0
    offset: Offset = Offset.NONE
    zero_field: str | None = None
    normalize: bool = False
    codebook: torch.Tensor | None = None  # float32 [2^bits] on the CPU (Element.CODEBOOK)
    rotation: torch.Tensor | None = None  # float32 [d, d] on the CPU: x = y @ rotation
    group: int | None = None  # coordinates per block scale (None: the scale is per token or constant)
    block_scale: BlockScale = BlockScale.E4M3

    def __post_init__(self):
        if self.element in (Element.E4M3, Element.E5M2, Element.INT8) and self.bits != 8:
            raise ValueError(f"{self.element.value} codes are 8 bits, got {self.bits}")
        if self.element == Element.E2M1 and self.bits != 4:
            raise ValueError(f"e2m1 codes are 4 bits, got {self.bits}")
        if self.group is not None and (self.scale_field is None or self.offset != Offset.NONE):
            raise ValueError("block scales live in a scale field, with no offset")
        if (self.element == Element.CODEBOOK) != (self.codebook is not None):
            raise ValueError("a codebook goes with Element.CODEBOOK, and only with it")
        if self.codebook is not None and self.codebook.numel() != 2 ** self.bits:
            raise ValueError(f"a {self.bits}-bit codebook has {2 ** self.bits} entries, got {self.codebook.numel()}")
        if (self.offset == Offset.ZERO) != (self.zero_field is not None):
            raise ValueError("a zero field goes with Offset.ZERO, and only with it")
        if self.offset == Offset.PACKED_ZP and self.scale_field is None:
            raise ValueError("a packed zero point rides in a scale field")

    def row_bytes(self, d: int) -> int:
        return -(-d * self.bits // 8)


@dataclass(frozen=True, eq=False)
class TokenLayout:
    """A codec's key and value states as the per-token fused kernel reads them."""

    keys: TokenCodes
    values: TokenCodes
