"""TurboQuant (Zandieh et al., 2025): random rotation + per-coordinate Lloyd–Max.

``turboquant-mse`` (b bits): ``u = k / ||k||`` is rotated (sign-flipped WHT, padded to
``d_pad``, a power of two), each rotated coordinate is snapped to the nearest centroid of
the Lloyd–Max quantizer for one coordinate of a uniform direction on S^{d_pad-1}, and
``k_hat = ||k|| * R^T c[codes]``.

``turboquant-prod`` (b bits): the (b-1)-bit MSE stage plus a 1-bit QJL sketch (m = d_pad
rows) of the residual ``r = k - k_mse`` in the original frame, which makes the inner-product
estimate unbiased:

    <q, k> ≈ <q, k_mse> + sqrt(pi/2) / m * ||r|| * <S q, sign(S r)>

State layout (the Triton kernels are written against it):
    norm  float32 [..., T, 1]
    codes uint8   [..., T, ceil(d_pad * b / 8)]   BitField(d_pad, b), LSB first
  prod only:
    qjl   uint8   [..., T, ceil(d_pad / 8)]       BitField(d_pad, 1), bit 1 = <s_i, r> >= 0
    rnorm float16 [..., T, 1]
"""
from __future__ import annotations

import math

import torch

from kernels.base import Codec
from kernels.encoded import Encoded
from kernels.fused_layout import FusedLayout, KeyCodes, QJLResidual, Sketch
from kernels.lloyd_max import codebook, quantize
from kernels.packing import BitField
from kernels.codecs.qjl import GaussianSketch
from kernels.registry import register_codec
from kernels.rotation import Rotation


class _MSEStage:
    """Rotation + coordinate codebook at ``bits``; shared by both TurboQuant codecs."""

    def __init__(self, bits: int, head_dim: int, seed: int, layer: int, num_heads: int, device):
        self.rotation = Rotation(head_dim, seed, layer, num_heads, device=device)
        self.padded = self.rotation.padded
        self.field = BitField(self.padded, bits)
        self._centroids = {}
        self.bits = bits

    def centroids(self, device) -> torch.Tensor:
        c = self._centroids.get(device)
        if c is None:
            c = self._centroids[device] = codebook("coord", self.padded, self.bits, device=device)
        return c

    def encode(self, k: torch.Tensor) -> dict[str, torch.Tensor]:
        """k: [..., T, d] float32 -> {"norm": float32 [..., T, 1], "codes": uint8 packed}."""
        norm = k.norm(dim=-1, keepdim=True)
        u = k / torch.where(norm > 0, norm, torch.ones_like(norm))  # zero keys stay zero
        y = self.rotation.forward(u)  # [..., T, d_pad]
        codes = quantize(y, self.centroids(y.device))
        return {"norm": norm, "codes": self.field.pack(codes)}

    def decode(self, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
        """-> k_mse [..., T, d] float32."""
        codes = self.field.unpack(tensors["codes"])
        y = self.centroids(codes.device)[codes]
        return tensors["norm"].float() * self.rotation.inverse(y)

    def nbytes_per_token(self) -> int:
        return self.field.nbytes + 4

    def fused_layout(self, residual: QJLResidual | None = None) -> FusedLayout:
        return FusedLayout(KeyCodes.SCALAR, self.rotation, (self.bits,), (self.centroids(torch.device("cpu")),),
                           residual=residual)


@register_codec("turboquant-mse")
class TurboQuantMSE(Codec):
    randomized = True
    bits_supported = tuple(range(1, 9))

    def __init__(self, config, device="cpu"):
        super().__init__(config, device)
        self.stage = _MSEStage(self.bits, self.head_dim, self.seed, self.layer, self.num_heads, self.device)

    def _encode(self, keys):
        return Encoded(self.stage.encode(keys.float()), tuple(keys.shape), keys.dtype)

    def _decode(self, state):
        return self.stage.decode(state.tensors)

    def expected_nbytes(self, shape):
        return math.prod(shape[:-1]) * self.stage.nbytes_per_token()

    def fused_layout(self) -> FusedLayout:
        return self.stage.fused_layout()


@register_codec("turboquant-prod")
class TurboQuantProd(Codec):
    randomized = True
    bits_supported = tuple(range(2, 9))
    has_score_estimator = True

    def __init__(self, config, device="cpu"):
        super().__init__(config, device)
        self.stage = _MSEStage(self.bits - 1, self.head_dim, self.seed, self.layer, self.num_heads, self.device)
        self.m = self.stage.padded
        self.sketch = GaussianSketch(self.m, self.head_dim, self.seed, self.layer, self.num_heads, "qjl")
        self.qjl_field = BitField(self.m, 1)

    def _encode(self, keys):
        k = keys.float()
        tensors = self.stage.encode(k)
        r = k - self.stage.decode(tensors)  # the residual exactly as decode will see it
        tensors["qjl"] = self.qjl_field.pack(self.sketch.sign_bits(r))
        tensors["rnorm"] = r.norm(dim=-1, keepdim=True).to(torch.float16)
        return Encoded(tensors, tuple(keys.shape), keys.dtype)

    def _decode(self, state):
        t = state.tensors
        bits = self.qjl_field.unpack(t["qjl"])
        return self.stage.decode(t) + self.sketch.scale * t["rnorm"].float() * self.sketch.lift(bits)

    def score(self, q, state):
        """q [..., Tq, d] -> unbiased <q, k> estimates [..., Tq, T] (float32)."""
        t = state.tensors
        k_mse = self.stage.decode(t)
        bits = self.qjl_field.unpack(t["qjl"])
        rnorm = t["rnorm"].float().transpose(-1, -2)  # [..., 1, T]
        q = q.float()
        return q @ k_mse.transpose(-1, -2) + self.sketch.scale * rnorm * self.sketch.inner(q, bits)

    def expected_nbytes(self, shape):
        return math.prod(shape[:-1]) * (self.stage.nbytes_per_token() + self.qjl_field.nbytes + 2)

    def fused_layout(self) -> FusedLayout:
        return self.stage.fused_layout(QJLResidual(Sketch.GAUSSIAN, self.m, self.sketch.scale,
                                                   matrix=self.sketch.matrices))
