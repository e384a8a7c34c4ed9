"""vLLM's TurboQuant KV-cache presets (``--kv-cache-dtype turboquant_*``) as codecs, as vLLM stores them.

Read from vLLM's source (vllm-project/vllm): ``model_executor/layers/quantization/turboquant/config.py``
(the presets; commit 1471680), ``.../turboquant/centroids.py`` (the Lloyd-Max solver; 06d0369),
``v1/attention/backends/turboquant_attn.py`` (the rotation; 0135d08), ``v1/attention/ops/
triton_turboquant_store.py`` and ``triton_turboquant_decode.py`` (what is stored and read; 0135d08, 055e47c):

===========================  ========  =======  ================  =======================
preset                       keys      values   norm correction   bytes per token and head
===========================  ========  =======  ================  =======================
vllm-turboquant-k8v4         fp8 e4m3  4-bit    -                 d + d/2 + 4
vllm-turboquant-4bit-nc      4-bit     4-bit    yes               d/2 + 2 + d/2 + 4
vllm-turboquant-k3v4-nc      3-bit     4-bit    yes               3d/8 + 2 + d/2 + 4
vllm-turboquant-3bit-nc      3-bit     3-bit    yes               3d/8 + 2 + 3d/8 + 4
===========================  ========  =======  ================  =======================

- Keys, 3 or 4 bits: the float32 norm ``||k||`` (stored fp16), ``k / (||k|| + 1e-8)`` rotated by the
  orthonormal Sylvester Hadamard matrix (no random signs: one rotation for every layer, as vLLM), each
  rotated coordinate replaced by the index of its Lloyd-Max cell for N(0, 1/d) (``idx`` = the number of
  cell midpoints at or below it), packed least significant bit first. Reading: the centroids, divided
  by their norm (``sqrt(|c|^2 + 1e-16)``) where norm correction is on, times the stored norm, rotated back.
- Keys, fp8 (k8v4): the raw key cast to fp8 e4m3 (Hopper's ``float8e4nv``; saturating), no scale.
- Values, 3 or 4 bits, per token and head: ``scale = max((max - min) / (2^b - 1), 1e-8)``, codes
  ``clamp(int((v - min) / scale + 0.5), 0, 2^b - 1)``, scale and min stored fp16 and read back as
  ``code * scale + min``.
- vLLM keeps the first and last two attention layers of a dense model uncompressed for every TurboQuant
  preset (``get_boundary_skip_layers``, n = min(2, layers // 2)): :meth:`engine_skipped_layers` says so
  and the cache keeps those layers native.

The centroids are vLLM's own solver's (trapezoid integrals of 200 steps on ±3.5σ, edges at ±10.5σ, up to
200 iterations to 1e-10), recomputed here in float64 and rounded to float32 as vLLM rounds them.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import torch

from kernels.engines.preset import EnginePreset, fp8_saturate, fp8_value
from kernels.packing import BitField
from kernels.registry import register_codec
from kernels.rotation import hadamard_matrix
from registry.options import Allowed, option
from kernels.token_layout import Element, Offset, TokenCodes, TokenLayout


@functools.lru_cache(maxsize=None)
def lloyd_max_centroids(d: int, bits: int) -> torch.Tensor:
    """vLLM's ``solve_lloyd_max(d, bits)`` centroids (float32, sorted) for N(0, 1/d)."""
    n, sigma2 = 2 ** bits, 1.0 / d
    sigma = math.sqrt(sigma2)
    lo, hi = -3.5 * sigma, 3.5 * sigma
    c = np.array([lo + (hi - lo) * (i + 0.5) / n for i in range(n)])

    def trapz(f, a, b, steps=200):  # vLLM's trapezoid rule: endpoints halved, 199 inner points
        x = a + (b - a) / steps * np.arange(steps + 1)
        y = f(x)
        return (0.5 * (y[0] + y[-1]) + y[1:-1].sum()) * (b - a) / steps

    def pdf(x):
        return np.exp(-x * x / (2 * sigma2)) / math.sqrt(2 * math.pi * sigma2)

    for _ in range(200):
        edges = [lo * 3] + list((c[:-1] + c[1:]) / 2) + [hi * 3]
        new = c.copy()
        for i in range(n):
            den = trapz(pdf, edges[i], edges[i + 1])
            if den > 1e-15:
                new[i] = trapz(lambda x: x * pdf(x), edges[i], edges[i + 1]) / den
        if np.abs(new - c).max() < 1e-10:
            break
        c = new
    return torch.tensor(c, dtype=torch.float32)


class _VllmTurboQuant(EnginePreset):
    """One TurboQuant preset: ``key_bits`` (8 = fp8), ``preset_value_bits``, ``norm_correction``."""
    engine = "vLLM"
    key_bits: int
    norm_correction: bool

    @dataclass(frozen=True)
    class Options:
        boundary_layers: int = option(2, "vLLM's n: the first and last n layers stay native (0: none, for "
                                         "experiments)", Allowed(lo=0))

    @classmethod
    def head_dim_unsupported(cls, head_dim):
        if head_dim < 8 or head_dim & (head_dim - 1):
            return f"vLLM's TurboQuant rotates by a Sylvester Hadamard matrix of a power-of-2 head dim, got {head_dim}"
        return None

    @classmethod
    def engine_skipped_layers(cls, num_layers, options):
        n = min(options.boundary_layers, num_layers // 2)
        return set(range(n)) | set(range(num_layers - n, num_layers))

    def __init__(self, config, device="cpu"):
        super().__init__(config, device)
        d = self.head_dim
        self.key_field = BitField(d, self.key_bits)
        self.value_field = BitField(d, self.value_bits)
        if self.key_bits != 8:
            # orthonormal and symmetric: its own inverse
            self.rotation = hadamard_matrix(d, device=self.device) / math.sqrt(d)
            self.centroids = lloyd_max_centroids(d, self.key_bits).to(self.device)
            self.midpoints = (self.centroids[:-1] + self.centroids[1:]) / 2
            self.bytes_per_vector = self.key_field.nbytes + 2
        else:
            self.bytes_per_vector = d
        self.value_bytes = self.value_field.nbytes + 4

    def expected_value_nbytes(self, shape):
        return math.prod(shape[:-1]) * self.value_bytes

    def _quantize(self, x, side):
        return self._keys(x) if side == "k" else self._values(x)

    def _dequantize(self, t, side):
        return self._read_keys(t) if side == "k" else self._read_values(t)

    def _keys(self, k):
        k = k.float()
        if self.key_bits == 8:
            return {"codes": fp8_saturate(k, "e4m3")}
        norm = k.norm(dim=-1, keepdim=True)
        y = (k / (norm + 1e-8)) @ self.rotation.to(k.device)
        idx = torch.bucketize(y, self.midpoints.to(k.device), right=True)  # midpoints at or below y
        return {"codes": self.key_field.pack(idx), "norm": norm.to(torch.float16)}

    def _read_keys(self, t):
        if self.key_bits == 8:
            return fp8_value(t["codes"], "e4m3")
        c = self.centroids.to(t["codes"].device)[self.key_field.unpack(t["codes"])]
        if self.norm_correction:
            c = c / torch.sqrt((c * c).sum(-1, keepdim=True) + 1e-16)
        return (t["norm"].float() * c) @ self.rotation.to(c.device)  # H is its own inverse

    def _values(self, v):
        v = v.float()
        top = 2 ** self.value_bits - 1
        lo, hi = v.amin(-1, keepdim=True), v.amax(-1, keepdim=True)
        scale = ((hi - lo) / top).clamp_min(1e-8)
        q = ((v - lo) / scale + 0.5).trunc().clamp(0, top).to(torch.int64)
        return {"codes": self.value_field.pack(q), "scale": scale.to(torch.float16), "zero": lo.to(torch.float16)}

    def _read_values(self, t):
        return self.value_field.unpack(t["codes"]).float() * t["scale"].float() + t["zero"].float()

    def _build_token_layout(self):
        values = TokenCodes(Element.UINT, bits=self.value_bits, scale_field="scale", offset=Offset.ZERO,
                            zero_field="zero")
        if self.key_bits == 8:
            return TokenLayout(TokenCodes(Element.E4M3), values)
        d = self.head_dim  # the tables again on the CPU, where a layout keeps them
        keys = TokenCodes(Element.CODEBOOK, bits=self.key_bits, scale_field="norm", normalize=self.norm_correction,
                          codebook=lloyd_max_centroids(d, self.key_bits), rotation=hadamard_matrix(d) / math.sqrt(d))
        return TokenLayout(keys, values)


@register_codec("vllm-turboquant-k8v4")
class VllmTurboQuantK8V4(_VllmTurboQuant):
    """vLLM ``--kv-cache-dtype turboquant_k8v4``: fp8 keys, 4-bit values."""
    bits_supported, key_bits, preset_value_bits, norm_correction = (8,), 8, 4, False


@register_codec("vllm-turboquant-4bit-nc")
class VllmTurboQuant4BitNC(_VllmTurboQuant):
    """vLLM ``--kv-cache-dtype turboquant_4bit_nc``."""
    bits_supported, key_bits, preset_value_bits, norm_correction = (4,), 4, 4, True


@register_codec("vllm-turboquant-k3v4-nc")
class VllmTurboQuantK3V4NC(_VllmTurboQuant):
    """vLLM ``--kv-cache-dtype turboquant_k3v4_nc``."""
    bits_supported, key_bits, preset_value_bits, norm_correction = (3,), 3, 4, True


@register_codec("vllm-turboquant-3bit-nc")
class VllmTurboQuant3BitNC(_VllmTurboQuant):
    """vLLM ``--kv-cache-dtype turboquant_3bit_nc``."""
    bits_supported, key_bits, preset_value_bits, norm_correction = (3,), 3, 3, True
