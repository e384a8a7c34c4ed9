"""What the fused Triton kernels need from a codec, declared by the codec as data.

A codec with a fused path returns a :class:`FusedLayout` from ``Codec.fused_layout()`` (None
otherwise). The fused encoders and the fused decode attention (:mod:`kernels.triton`) read this
declaration and nothing else of the codec (besides its head dim and value quantizer), never its
name: a new codec whose keys take one of these layouts gets the fused path from its own file.

Key state, for keys ``[..., T, d]`` rotated (sign-flipped Walsh-Hadamard, :class:`Rotation`) to
``n = rotation.padded`` coordinates of the unit direction:

- ``norm_field``  float32 [..., T, 1]: the key norm.
- :attr:`KeyCodes.OCTAHEDRAL` (OCTOPUS): the n coordinates in ``nt = ceil(n / 3)`` triplets;
  ``codes_field`` uint8 [..., T, BitField(2 nt, b_u).nbytes] holds the interleaved octahedral
  direction codes u_0, v_0, u_1, ... and ``triplet_norm_field`` uint8 [..., T, BitField(nt,
  b_r).nbytes] the triplet lengths; ``bits = (b_u, b_r)``, ``codebooks = (octahedral coordinate
  centroids [2^b_u], triplet-length centroids [2^b_r])``; y_hat[3i:3i+3] = rho[r_i] *
  octa_decode(c[u_i], c[v_i]).
- :attr:`KeyCodes.SCALAR` (TurboQuant): one code per rotated coordinate, ``codes_field`` uint8
  [..., T, BitField(n, b).nbytes]; ``bits = (b,)``, ``codebooks = (coordinate centroids [2^b],)``.

k_hat = norm * R^{-1} y_hat. A :class:`QJLResidual` adds the 1-bit sketch of the residual that
makes the inner-product estimate unbiased.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import torch

from .packing import BitField
from .rotation import Rotation


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
    triplet_norm_field: str = "r"  # OCTAHEDRAL only

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
    def code_fields(self) -> tuple[BitField, ...]:
        """The packed key-code fields: OCTAHEDRAL (u/v codes, triplet lengths); SCALAR (codes,)."""
        if self.keys == KeyCodes.OCTAHEDRAL:
            b_u, b_r = self.bits
            return BitField(2 * self.triplets, b_u), BitField(self.triplets, b_r)
        return (BitField(self.padded, self.bits[0]),)
