"""OCTOPUS: octahedral triplet quantization of rotated keys, and OCTOPUS-QJL (plus a 1-bit QJL residual).

Keys ``[..., T, d]`` (``[..., H, T, d]`` with ``num_heads`` = H: per-head rotation signs).

OCTOPUS at ``b`` bits:
  norm = ||k|| (float32), y = R(k / norm) in d_pad = next_pow2(d) dims, cut into nt = ceil(d_pad / 3)
  contiguous triplets (the last one zero-padded). Each triplet stores a direction as two
  ``b_u``-bit octahedral codes and its length as one ``b_r``-bit code, rounded jointly
  (:mod:`kernels.joint_rounding`). Default split (b_u, b_r) = (b + 1, b - 1): 3b + 1 bits per
  triplet; option ``split=(b_u, b_r)`` overrides it, ``rounding='full'`` validates the local search.

State (the fused kernels read exactly this; :class:`kernels.fused_layout.TripletCodes`):
  "norm": float32 [..., T, 1]
  "u":    uint8 [..., T, ceil(2 nt b_u / 8) + ceil(nt b_r / 8)]: per triplet i the fused code
          u_i | v_i << b_u | r_i << 2 b_u, (2 b_u + b_r) bits at bits [i (2 b_u + b_r), ...) of the
          row, LSB first; the bits past the last code are zero
Reconstruction: y_hat[3i:3i+3] = rho_c[r_i] * octa_decode(oc[u_i], oc[v_i]);
  k_hat = norm * R^{-1}(y_hat[:d_pad]).

OCTOPUS-QJL at ``b`` bits: OCTOPUS at b - 1 bits plus sign(R2 r) of the rotated-frame residual
  r = norm * (y - y_hat) with a second, independent rotation R2 (purpose "qjl"):
  "qjl":   uint8 [..., T, BitField(d_pad, 1).nbytes], bit 1 = (R2 r >= 0)
  "rnorm": float16 [..., T, 1] = ||r||
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal, get_args

import torch

from kernels.base import Codec, bitfield_bytes
from kernels.encoded import Encoded
from kernels.fused_layout import FusedLayout, KeyCodes, QJLResidual, Sketch, TripletCodes
from kernels.joint_rounding import decode_triplets, encode_triplets, local_full_agreement  # noqa: F401 (probe)
from kernels.lloyd_max import codebook
from kernels.packing import BitField
from kernels.registry import register_codec
from kernels.rotation import Rotation
from registry.options import Allowed, option

Rounding = Literal["local", "full", "nearest"]
ROUNDINGS = get_args(Rounding)
#: where a split (b_u, b_r) may lie: a direction needs a bit a coordinate, a length may take none (one radius);
#: each is a Lloyd-Max codebook's bits, which stop at 10 (kernels.lloyd_max.codebook)
SPLIT = Allowed(lo=(1, 0), hi=10)


def default_split(bits: int) -> tuple[int, int]:
    """The paper's per-triplet bits (b_u, b_u, b_r) = (b + 1, b + 1, b - 1), as (b_u, b_r)."""
    return bits + 1, bits - 1


def _lead(shape) -> int:
    n = 1
    for s in shape[:-1]:
        n *= s
    return n


class _OctopusStage:
    """The OCTOPUS quantizer at given (b_u, b_r) (in :data:`SPLIT`); shared by both codecs."""

    def __init__(self, head_dim: int, b_u: int, b_r: int, rotation: Rotation, rounding: str):
        if rounding not in ROUNDINGS:
            raise ValueError(f"rounding must be one of {ROUNDINGS}, got {rounding!r}")
        self.d = head_dim
        self.rot = rotation
        self.d_pad = rotation.padded
        self.nt = -(-self.d_pad // 3)
        self.b_u, self.b_r, self.rounding = b_u, b_r, rounding
        self.codes = TripletCodes(self.nt, b_u, b_r)

    def nbytes_per_vector(self) -> int:
        return 4 + self.codes.nbytes

    def encode(self, keys: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
        """keys [..., T, d] -> (fields, y [..., T, d_pad], y_hat [..., T, d_pad]) (float32)."""
        x = keys.float()
        norm = x.norm(dim=-1, keepdim=True)
        unit = x / torch.where(norm > 0, norm, torch.ones_like(norm))  # zero vector -> zero
        y = self.rot.forward(unit)  # [..., T, d_pad]
        t = torch.nn.functional.pad(y, (0, 3 * self.nt - self.d_pad)).unflatten(-1, (self.nt, 3))
        iu, iv, ir = encode_triplets(t, self.b_u, self.b_r, self.d_pad, self.rounding)
        fields = {"norm": norm, "u": self.codes.pack(iu, iv, ir)}
        return fields, y, self._y_hat(iu, iv, ir)

    def _y_hat(self, iu, iv, ir) -> torch.Tensor:
        t_hat = decode_triplets(iu, iv, ir, self.b_u, self.b_r, self.d_pad)
        return t_hat.flatten(-2)[..., : self.d_pad]

    def decode_rotated(self, fields: dict[str, torch.Tensor]) -> torch.Tensor:
        """fields -> y_hat [..., T, d_pad] (unit-norm frame, float32)."""
        return self._y_hat(*self.codes.unpack(fields["u"]))

    def decode(self, fields: dict[str, torch.Tensor]) -> torch.Tensor:
        """fields -> k_hat [..., T, d] float32."""
        return fields["norm"].float() * self.rot.inverse(self.decode_rotated(fields))


def _resolve_split(bits: int, split) -> tuple[int, int]:
    if split is None:
        return default_split(bits)
    b_u, b_r = (int(v) for v in split)
    return b_u, b_r


@register_codec("octopus")
class Octopus(Codec):
    """OCTOPUS, PyTorch reference. Options: ``split=(b_u, b_r)`` (default (b+1, b-1)),
    ``rounding='local'|'full'|'nearest'`` (default 'local', the paper's 3x3 joint search)."""
    randomized = True

    bits_supported = (1, 2, 3, 4, 5, 6)

    @dataclass(frozen=True)
    class Options:
        split: tuple[int, int] | None = option(None, "(b_u, b_r) of the OCTOPUS stage (None: (b + 1, b - 1))", SPLIT)
        rounding: Rounding = "local"  # the joint rounding search (kernels.joint_rounding)

    def __init__(self, config, device="cpu"):
        super().__init__(config, device)
        b_u, b_r = _resolve_split(self._stage_bits(self.bits), self.opts.split)
        self.rot = Rotation(self.head_dim, self.seed, self.layer, self.num_heads, device=self.device)
        self.stage = _OctopusStage(self.head_dim, b_u, b_r, self.rot, self.opts.rounding)
        self.d_pad = self.rot.padded

    @staticmethod
    def _stage_bits(bits: int) -> int:
        return bits

    def _encode(self, keys: torch.Tensor) -> Encoded:
        fields, _, _ = self.stage.encode(keys)
        return Encoded(fields, tuple(keys.shape), keys.dtype)

    def _decode(self, state: Encoded) -> torch.Tensor:
        return self.stage.decode(state.tensors)

    def expected_nbytes(self, shape: tuple[int, ...]) -> int:
        return _lead(shape) * self.stage.nbytes_per_vector()

    def fused_layout(self) -> FusedLayout:
        st = self.stage
        return FusedLayout(KeyCodes.OCTAHEDRAL, self.rot, (st.b_u, st.b_r),
                           (codebook("octa", 0, st.b_u), codebook("triplet_norm", st.d_pad, st.b_r)),
                           rounding=st.rounding, codes_field="u")

    def describe(self) -> str:
        s = self.stage
        return f"{self.name}@{self.bits}b(u{s.b_u},v{s.b_u},r{s.b_r},{s.rounding})"


@register_codec("octopus-qjl")
class OctopusQJL(Octopus):
    """OCTOPUS at b - 1 bits (split rule applied to b - 1; ``split`` sets that stage) plus a 1-bit
    QJL sketch of the residual.

    ``score`` is the QJL-corrected estimator
    <q, k_hat_octopus> + sqrt(pi/2)/sqrt(m) * rnorm * <R2 R q, sign(R2 r)>, m = d_pad.
    ``decode`` returns the MSE stage plus the unbiased QJL back-projection
    sqrt(pi/2)/sqrt(m) * rnorm * R^{-1} R2^{-1} sign(R2 r), so <q, decode(k)> equals ``score``.
    """

    bits_supported = (2, 3, 4, 5, 6)
    has_score_estimator = True

    def __init__(self, config, device="cpu"):
        super().__init__(config, device)
        self.rot2 = Rotation(self.d_pad, self.seed, self.layer, self.num_heads, purpose="qjl",
                             device=self.device)
        self.qjl_field = BitField(self.d_pad, 1)
        self.qjl_scale = math.sqrt(math.pi / 2) / math.sqrt(self.d_pad)

    @staticmethod
    def _stage_bits(bits: int) -> int:
        return bits - 1

    def _encode(self, keys: torch.Tensor) -> Encoded:
        fields, y, y_hat = self.stage.encode(keys)
        r = fields["norm"] * (y - y_hat)  # [..., T, d_pad], residual in the rotated frame
        fields["qjl"] = self.qjl_field.pack((self.rot2.forward(r) >= 0).to(torch.int64))
        fields["rnorm"] = r.norm(dim=-1, keepdim=True).to(torch.float16)
        return Encoded(fields, tuple(keys.shape), keys.dtype)

    def _signs(self, state: Encoded) -> torch.Tensor:
        return self.qjl_field.unpack(state.tensors["qjl"]).float() * 2 - 1  # [..., T, d_pad] ±1

    def _decode(self, state: Encoded) -> torch.Tensor:
        back = self.rot.inverse(self.rot2.inverse(self._signs(state)))
        return self.stage.decode(state.tensors) + self.qjl_scale * state.tensors["rnorm"].float() * back

    def score(self, q: torch.Tensor, state: Encoded) -> torch.Tensor:
        """q: [..., Tq, d] -> [..., Tq, T] float32, the QJL-corrected inner-product estimate."""
        qf = q.float()
        k_mse = self.stage.decode(state.tensors)
        base = qf @ k_mse.transpose(-1, -2)
        sketch = self.rot2.forward(self.rot.forward(qf))  # [..., Tq, d_pad]
        corr = sketch @ self._signs(state).transpose(-1, -2)  # [..., Tq, T]
        return base + self.qjl_scale * corr * state.tensors["rnorm"].float().transpose(-1, -2)

    def fused_layout(self) -> FusedLayout:
        residual = QJLResidual(Sketch.ROTATION, self.d_pad, self.qjl_scale, rotation=self.rot2)
        return dataclasses.replace(super().fused_layout(), residual=residual)

    def expected_nbytes(self, shape: tuple[int, ...]) -> int:
        return super().expected_nbytes(shape) + bitfield_bytes(shape, self.d_pad, 1) + _lead(shape) * 2
