"""What the fused Triton kernels need from a codec, declared by the codec as data.

A codec with a fused path returns a :class:`FusedLayout` from ``Codec.fused_layout()`` (None
otherwise). The fused encoders and the fused decode attention (:mod:`kernels.triton`) read this
declaration and nothing else of the codec (besides its head dim and value quantizer), never its
name: a new codec whose keys take one of these layouts gets the fused path from its own file.

Key state, for keys ``[..., T, d]`` rotated (sign-flipped Walsh-Hadamard, :class:`Rotation`) to
``n = rotation.padded`` coordinates of the unit direction:

- ``norm_field``  float32 [..., T, 1]: the key norm.
- :attr:`KeyCodes.OCTAHEDRAL` (OCTOPUS): the n coordinates in ``nt = ceil(n / 3)`` triplets;
  ``codes_field`` uint8 [..., T, TripletCodes.nbytes] holds, per triplet i, the fused code
  ``u_i | v_i << b_u | r_i << 2 b_u`` (two octahedral direction codes and the triplet-length code,
  adjacent) as one (2 b_u + b_r)-bit field at bits [i W, (i + 1) W) of the token's row
  (:class:`TripletCodes`); ``bits = (b_u, b_r)``, ``codebooks = (octahedral coordinate centroids
  [2^b_u], triplet-length centroids [2^b_r])``; y_hat[3i:3i+3] = rho[r_i] * octa_decode(c[u_i], c[v_i]).
- :attr:`KeyCodes.SCALAR` (TurboQuant): one code per rotated coordinate, ``codes_field`` uint8
  [..., T, BitField(n, b).nbytes]; ``bits = (b,)``, ``codebooks = (coordinate centroids [2^b],)``.

k_hat = norm * R^{-1} y_hat. A :class:`QJLResidual` adds the 1-bit sketch of the residual that
makes the inner-product estimate unbiased.

Why the octahedral codes are fused per triplet (issue #16): the decode kernels turn each triplet
into one table lookup whose index is exactly that code, so a thread extracts one field per
triplet (a shift and a mask, the table's entry size folded into the mask) instead of gathering
(u, v) and r from two fields and combining them; the triplets a thread of the table-lookup
kernel feeds into one tensor-core fragment (triplets c * KS .. c * KS + KS - 1, KS = ceil(nt / 4))
are one contiguous run of bits, read with a few word loads per token. Rows stay per token (a cache
appends tokens one at a time), so a row starts at any byte: the kernels align each thread's run
once per token with funnel shifts.

Both kinds read as one stream of group codes (:attr:`FusedLayout.groups`, :class:`CodeGroups`): an
octahedral triplet is a group of 3 coordinates; SCALAR codes, dense LSB first, are also the stream
of groups of 4 adjacent coordinates (4 b bits each), which is what one thread of the table-lookup
kernel feeds into one tensor-core fragment per token: the layout TurboQuant stores already puts a
thread's codes in one contiguous run, so it needs no change for that kernel.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import torch

from kernels.packing import BitField
from kernels.rotation import Rotation


class KeyCodes(str, Enum):
    """How the rotated unit key is coded."""

    OCTAHEDRAL = "octahedral"  # triplets: two octahedral direction codes and a length code each
    SCALAR = "scalar"  # one code per coordinate


class Sketch(str, Enum):
    """Which 1-bit sketch the QJL residual stores."""

    ROTATION = "rotation"  # sign(R2 r) of the rotated-frame residual r, R2 a second ±1 Hadamard rotation
    GAUSSIAN = "gaussian"  # sign(S r) of the original-frame residual r, S [m, d] Gaussian


@dataclass(frozen=True, eq=False)
class QJLResidual:
    """The residual stage: ``<q, k> ~ <q, k_hat> + coef * rnorm * <sketch(q), 2 bits - 1>``, where
    sketch(q) = R2 R q (:attr:`Sketch.ROTATION`, with ``rotation``) or S q (:attr:`Sketch.GAUSSIAN`,
    with ``matrix`` [heads, m, d] float32 on the CPU).

    Fields: ``bits_field`` uint8 [..., T, BitField(m, 1).nbytes] (bit 1 = sketch >= 0),
    ``norm_field`` float16 [..., T, 1] = ||r||.
    """

    sketch: Sketch
    m: int  # sketch rows
    coef: float
    rotation: Rotation | None = None
    matrix: torch.Tensor | None = None
    bits_field: str = "qjl"
    norm_field: str = "rnorm"

    def __post_init__(self):
        need = "rotation" if self.sketch == Sketch.ROTATION else "matrix"
        if getattr(self, need) is None:
            raise ValueError(f"a {self.sketch.value} QJL sketch needs its {need}")


@dataclass(frozen=True)
class TripletCodes:
    """One token's OCTAHEDRAL key codes: ``nt`` fused codes ``u | v << b_u | r << 2 b_u`` of
    ``width = 2 b_u + b_r`` bits, code i at bits [i width, (i + 1) width) of the row, LSB first
    (the dense stream of ``BitField(nt, width)``), in a row of :attr:`nbytes` bytes.

    The row keeps the bytes of the two-field layout it replaced (``BitField(2 nt, b_u)`` +
    ``BitField(nt, b_r)``), so the rate is unchanged; the bits past the stream are zero. (The stream
    alone can be up to a byte shorter: 38 instead of 39 bytes at d = 128, 2 bits.)"""

    triplets: int
    b_u: int
    b_r: int

    @property
    def width(self) -> int:
        return 2 * self.b_u + self.b_r

    @property
    def nbytes(self) -> int:
        return BitField(2 * self.triplets, self.b_u).nbytes + BitField(self.triplets, self.b_r).nbytes

    def pack(self, iu: torch.Tensor, iv: torch.Tensor, ir: torch.Tensor) -> torch.Tensor:
        """codes [..., nt] each (u, v < 2^b_u, r < 2^b_r) -> uint8 [..., nbytes]."""
        code = iu.long() | (iv.long() << self.b_u) | (ir.long() << (2 * self.b_u))
        W = self.width
        if W <= 16:
            row = BitField(self.triplets, W).pack(code)
        else:  # wider than BitField packs (b_u >= 7 or wide splits): bit by bit, the same stream
            bits = ((code.unsqueeze(-1) >> torch.arange(W, device=code.device)) & 1).flatten(-2)
            bits = torch.nn.functional.pad(bits, (0, -bits.shape[-1] % 8)).unflatten(-1, (-1, 8))
            row = (bits << torch.arange(8, device=code.device)).sum(-1).to(torch.uint8)
        return torch.nn.functional.pad(row, (0, self.nbytes - row.shape[-1]))

    def fused(self, row: torch.Tensor) -> torch.Tensor:
        """uint8 [..., nbytes] -> the stored codes u | v << b_u | r << 2 b_u, int64 [..., nt]."""
        nt, W = self.triplets, self.width
        if W <= 16:
            return BitField(nt, W).unpack(row)
        bits = ((row.long().unsqueeze(-1) >> torch.arange(8, device=row.device)) & 1).flatten(-2)
        return (bits[..., : nt * W].unflatten(-1, (nt, W)) << torch.arange(W, device=row.device)).sum(-1)

    def unpack(self, row: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """uint8 [..., nbytes] -> (u, v, r) int64 [..., nt] each."""
        code = self.fused(row)
        m = (1 << self.b_u) - 1
        return code & m, (code >> self.b_u) & m, code >> (2 * self.b_u)


@dataclass(frozen=True)
class CodeGroups:
    """The codes field of one token read as ``count`` group codes of ``width`` bits, group i at bits
    [i width, (i + 1) width) of the row (LSB first), coding the rotated coordinates
    [i coords, (i + 1) coords) (those < n; an octahedral triplet's 3, or 4 scalar codes, the first
    at the group's low bits). Codes past ``count`` groups' bits are not read."""

    count: int
    width: int
    coords: int


@dataclass(frozen=True, eq=False)
class FusedLayout:
    """A codec's key state as the fused kernels read and write it (see the module docstring)."""

    keys: KeyCodes
    rotation: Rotation
    bits: tuple[int, ...]  # OCTAHEDRAL: (b_u, b_r); SCALAR: (b,)
    codebooks: tuple[torch.Tensor, ...]  # float32 on the CPU, as listed in the module docstring
    rounding: str = "nearest"  # how the codes were chosen: 'nearest', or OCTOPUS's 'local' 3x3 search ('full')
    residual: QJLResidual | None = None
    norm_field: str = "norm"
    codes_field: str = "codes"

    def __post_init__(self):
        want = {KeyCodes.OCTAHEDRAL: 2, KeyCodes.SCALAR: 1}[KeyCodes(self.keys)]
        if len(self.bits) != want or len(self.codebooks) != want:
            raise ValueError(f"{self.keys.value} keys take {want} bit width(s) and codebook(s), "
                             f"got bits={self.bits} and {len(self.codebooks)} codebook(s)")

    @property
    def padded(self) -> int:
        """n: the rotated dimension."""
        return self.rotation.padded

    @property
    def triplets(self) -> int:
        """nt = ceil(n / 3) (OCTAHEDRAL)."""
        return -(-self.padded // 3)

    @property
    def codes(self) -> "TripletCodes | BitField":
        """The packed key codes of one token (``codes_field``): OCTAHEDRAL :class:`TripletCodes`,
        SCALAR ``BitField(n, b)``; both say their bytes per token (``nbytes``)."""
        if self.keys == KeyCodes.OCTAHEDRAL:
            return TripletCodes(self.triplets, *self.bits)
        return BitField(self.padded, self.bits[0])

    def sketch_matrices(self) -> torch.Tensor:
        """The QJL residual's sketch of the query as matrices, float64 [heads, m, dim] on the CPU:
        sketch(q) = M q. Gaussian: the declared S; rotation: R2 R, exact (the product of the two ±1
        Hadamard matrices, integers, over n). The kernels' query side of the residual reads these."""
        res = self.residual
        if res.sketch == Sketch.GAUSSIAN:
            return res.matrix.double()
        rot, rot2 = self.rotation, res.rotation
        heads = max(rot.num_heads, rot2.num_heads)
        mats = [rot2.pm1_matrix(min(h, rot2.num_heads - 1)) @ rot.pm1_matrix(min(h, rot.num_heads - 1))
                for h in range(heads)]
        return torch.stack(mats)[:, :, : rot.dim] / rot.padded

    @property
    def groups(self) -> CodeGroups:
        """The codes field as a stream of group codes: OCTAHEDRAL one group per triplet (its fused
        code, 3 coordinates); SCALAR groups of 4 adjacent coordinates (n is a power of two >= 4; the
        last group may reach past n where n < 4)."""
        if self.keys == KeyCodes.OCTAHEDRAL:
            return CodeGroups(self.triplets, TripletCodes(self.triplets, *self.bits).width, 3)
        return CodeGroups(-(-self.padded // 4), 4 * self.bits[0], 4)
