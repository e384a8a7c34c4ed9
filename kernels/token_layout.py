"""What the fused per-token decode kernel (:mod:`kernels.triton.token_attention`) needs from a codec
whose keys and values are scalar codes with per-token side information: the engines' KV-cache
presets (:mod:`kernels.engines.preset`), declared by the codec as data (``Codec.token_layout()``).

One token of one head, ``d`` coordinates, is read back as

    y_j = code value of coordinate j          (:class:`Element`: fp8 or fp4 bits, int8, or an
                                                unsigned b-bit code, or a codebook entry it indexes;
                                                ``halves``: 4-bit codes in ggml's order, byte j of a
                                                block of 32 holding coordinates j and j + 16;
                                                ``high_field``: plus 16 times a fifth bit, ggml's q5)
    y_j -= zero_point                          (a constant: llama.cpp's q4_0 codes are 0..15 for -8..7)
    y_j *= block scale of j's group            (``group``: one scale per ``group`` coordinates, a byte
                                                read as :class:`BlockScale` says, or a number)
    y_j += block zero of j's group             (``group`` with ``offset == Offset.ZERO``: MLX's biases)
    y_j -= zp                                  (``offset == Offset.PACKED_ZP``: the zero point in the
                                                low 4 mantissa bits of the float32 scale)
    y  /= sqrt(|y|^2 + 1e-16)                  (``normalize``: vLLM TurboQuant's norm correction)
    y  *= scale                                (a field [..., T, 1] or a constant)
    y_j += zero                                (``offset == Offset.ZERO``: an additive field [..., T, 1])
    x   = y @ M                                (``rotation``: M float32 [d, d], or none; a permutation
                                                where an engine orders its codes otherwise, as
                                                LMDeploy's int4 pairs)

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
    FIELD = "field"  # a number in the field's own float dtype (ggml's fp16 ``d``, MLX's scales)


class Offset(str, Enum):
    NONE = "none"
    PACKED_ZP = "packed_zp"  # y = (code - zp) * (scale with its low 4 bits cleared); zp = those bits
    ZERO = "zero"  # y = code * scale + zero, zero a per-token field


@dataclass(frozen=True, eq=False)
class TokenCodes:
    """One side (keys or values) of a token layout; see the module docstring.

    ``codes_field``: uint8 [..., T, ceil(d bits / 8)]; ``scale_field``: float32 or float16 [..., T, 1]
    (None: the constant ``scale``), or with a ``group`` [..., T, d / group] block scales (uint8, or numbers
    for BlockScale.FIELD), each read as ``block_scale`` says and times the constant ``scale``;
    ``zero_field``: float [..., T, 1] where ``offset`` is ZERO ([..., T, d / group] with a ``group``);
    ``zero_point``: a constant taken from every code before its scale; ``halves``: 4-bit codes in blocks of 32
    as ggml packs them (byte j of a block: coordinate j in the low nibble, j + 16 in the high), read in
    coordinate order; ``high_field``: uint8 [..., T, d / 8], a fifth bit per coordinate (coordinate j at bit
    j % 8 of byte j / 8: ggml's q5 ``qh``, a little-endian uint32 per block), worth 16 in the code."""

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
    zero_point: float = 0.0
    halves: bool = False
    high_field: str | None = None

    def __post_init__(self):
        if self.halves and (self.bits != 4 or self.group != 32):
            raise ValueError(f"ggml's halves order packs 4-bit codes in blocks of 32, got {self.bits} bits, "
                             f"groups of {self.group}")
        if self.high_field is not None and not self.halves:
            raise ValueError("a fifth bit plane goes with ggml's halves order (its q5 types)")
        if self.element in (Element.E4M3, Element.E5M2, Element.INT8) and self.bits != 8:
            raise ValueError(f"{self.element.value} codes are 8 bits, got {self.bits}")
        if self.element == Element.E2M1 and self.bits != 4:
            raise ValueError(f"e2m1 codes are 4 bits, got {self.bits}")
        if self.group is not None and (self.scale_field is None or self.offset == Offset.PACKED_ZP):
            raise ValueError("block scales live in a scale field, with no packed zero point")
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


def permutation(order: list[int], d: int) -> torch.Tensor:
    """float32 [d, d] with x = y @ M putting stored code i at coordinate ``order[i % n] + i - i % n`` (``order``
    one block of n codes, repeated over the head dim): an engine's own code order as a rotation."""
    n = len(order)
    m = torch.zeros(d, d)
    for i in range(d):
        m[i, i - i % n + order[i % n]] = 1.0
    return m


@dataclass(frozen=True, eq=False)
class TokenLayout:
    """A codec's key and value states as the per-token fused kernel reads them."""

    keys: TokenCodes
    values: TokenCodes
