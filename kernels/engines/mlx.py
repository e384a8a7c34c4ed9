"""mlx-lm's quantized KV cache (``--kv-bits B --kv-group-size G``, ``QuantizedKVCache``) as codecs: ``mlx-g32``,
``mlx-g64`` (mlx-lm's default group) and ``mlx-g128``, each at 2, 3, 4, 5, 6 or 8 bits.

Read from ml-explore/mlx-lm at d78bf58 (``mlx_lm/models/cache.py``: ``QuantizedKVCache.update_and_fetch``,
``KVCache.to_quantized``; ``mlx_lm/generate.py``: ``maybe_quantize_kv_cache``, ``generate_step``) and
ml-explore/mlx at 846d176 (``mlx/backend/metal/kernels/quantized.h``: ``affine_quantize``, the Metal kernel
``mx.quantize`` runs on Apple GPUs; ``mlx/ops.cpp``: ``affine_quantize``; ``mlx/backend/cpu/quantized.cpp``).

Per group of G coordinates of a token-head, in float32 from the model's dtype (the Metal kernel, compiled with
``-fno-fast-math``):

- ``w_min`` = the group's minimum, ``w_max`` = its maximum **or 0**, whichever is larger (the kernel's running
  maximum starts at 0);
- ``scale = max((w_max - w_min) / (2^B - 1), 1e-7)``, negated unless ``|w_min| > |w_max|``; ``edge`` the
  extreme of larger magnitude; ``q0 = round(edge / scale)``; unless ``q0`` is 0, ``scale = edge / q0`` and
  ``bias = edge`` (else ``bias = 0``): the edge value and zero are exactly representable;
- codes ``min(round((x - bias) / scale), 2^B - 1)``, Metal's ``round`` rounding halfway cases away from zero;
- scale and bias stored in the model's dtype (``mx.zeros(..., dtype=keys.dtype)``), read back as
  ``code * scale + bias`` (``quantized_matmul`` accumulates in float32).

Codes pack densely, least significant bits first (uint32 words for 2, 4, 8 bits; 3-, 5- and 6-bit codes in
packs of 8 over 3, 5, 6 bytes): state ``codes`` uint8 [..., T, d B / 8], ``scale`` and ``bias`` [..., T, d / G]
in the input's dtype. mlx's CPU backend (the one that installs on Linux) computes the same codes but for two
things: its maximum is the group's own and it rounds halfway cases to even; tests compare against it where
neither applies.

Around the bytes, as mlx-lm does it: the cache is a plain (full-precision) ``KVCache`` until, after a model call,
it holds at least ``quantized_kv_start`` tokens; then it becomes a ``QuantizedKVCache`` for good, every token
quantized, and later calls quantize their new tokens before attending them (``update_and_fetch`` returns the
quantized cache). With ``generate_step``'s default of 0 the first call (a prefill chunk) is attended in full
precision and everything after as stored; the ``mlx_lm.generate`` command line's default is 5000.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kernels.engines.preset import EnginePreset, round_half_away
from kernels.packing import BitField
from kernels.registry import register_codec
from kernels.token_layout import BlockScale, Element, Offset, TokenCodes, TokenLayout
from registry.options import Allowed, option

EPS = 1e-7  # the kernel's floor under the scale


def affine_quantize(x: torch.Tensor, group: int, bits: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Metal's ``affine_quantize`` on float32 x [..., d]: (codes int64 [..., d], scale, bias float32 [..., d / group])."""
    xg = x.float().unflatten(-1, (-1, group))
    top = float(2 ** bits - 1)
    w_min, w_max = xg.amin(-1, keepdim=True), xg.amax(-1, keepdim=True).clamp_min(0.0)
    scale = ((w_max - w_min) / top).clamp_min(EPS)
    low = w_min.abs() > w_max.abs()
    scale = torch.where(low, scale, -scale)
    edge = torch.where(low, w_min, w_max)
    q0 = round_half_away(edge / scale)
    scale = torch.where(q0 == 0, scale, edge / torch.where(q0 == 0, 1.0, q0))
    bias = torch.where(q0 == 0, torch.zeros_like(edge), edge)
    # (x - bias) / scale >= 0 by construction; a -0.0 reads as code 0
    q = round_half_away((xg - bias) / scale).clamp(0.0, top)
    return q.flatten(-2).long(), scale.squeeze(-1), bias.squeeze(-1)


class _MlxAffine(EnginePreset):
    """One group size of mlx's affine cache (``group``)."""
    engine = "MLX"
    bits_supported = (2, 3, 4, 5, 6, 8)
    group: int
    head_block_why = "mlx quantizes groups of {n} coordinates"

    @dataclass(frozen=True)
    class Options:
        # past the model's positions no token would ever be quantized
        quantized_kv_start: int = option(0, "tokens held before the cache is quantized (the CLI's "
                                         "--quantized-kv-start)", Allowed(lo=0, positions=True))

    def __init__(self, config, device="cpu"):
        super().__init__(config, device)
        self.field = BitField(self.head_dim, self.bits)
        self.bytes_per_vector = None  # the scales take the input's dtype: see expected_nbytes

    def expected_nbytes(self, shape, dtype=torch.float32):
        side = 2 * (self.head_dim // self.group) * torch.empty(0, dtype=dtype).element_size()
        return math.prod(shape[:-1]) * (self.field.nbytes + side)

    def expected_value_nbytes(self, shape, dtype=torch.float32):
        return self.expected_nbytes(shape, dtype)

    def _quantize(self, x, side):
        q, scale, bias = affine_quantize(x, self.group, self.bits)
        return {"codes": self.field.pack(q), "scale": scale.to(x.dtype), "bias": bias.to(x.dtype)}

    def _dequantize(self, t, side):
        q = self.field.unpack(t["codes"]).float().unflatten(-1, (-1, self.group))
        return (q * t["scale"].float().unsqueeze(-1) + t["bias"].float().unsqueeze(-1)).flatten(-2)

    def _build_token_layout(self):
        side = TokenCodes(Element.UINT, bits=self.bits, scale_field="scale", group=self.group,
                          block_scale=BlockScale.FIELD, offset=Offset.ZERO, zero_field="bias")
        return TokenLayout(side, side)

    def native_tokens(self, held):
        return held if held < self.opts.quantized_kv_start else None

    def stores_before_attending(self, held):
        return 0 < held and held >= self.opts.quantized_kv_start  # converted after an earlier call


@register_codec("mlx-g32")
class MlxG32(_MlxAffine):
    """mlx-lm ``--kv-bits B --kv-group-size 32``."""
    group = 32


@register_codec("mlx-g64")
class MlxG64(_MlxAffine):
    """mlx-lm ``--kv-bits B`` (``--kv-group-size 64``, the default)."""
    group = 64


@register_codec("mlx-g128")
class MlxG128(_MlxAffine):
    """mlx-lm ``--kv-bits B --kv-group-size 128``."""
    group = 128
