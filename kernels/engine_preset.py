"""An inference engine's KV-cache format as a codec: :class:`EnginePreset`, the base of the engines'
presets (kernels/vllm_kv.py, kernels/vllm_turboquant.py, kernels/sglang_kv.py), and the fp8 casts they
share. A preset stores keys and values in the engine's format (values at the preset's bits: ``--value-bits``
does not apply) and reproduces the engine's arithmetic, so a report compares what runs today with the
research codecs on the same prompts.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .base import Codec
from .encoded import Encoded

FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def fp8_saturate(x: torch.Tensor, kind: str) -> torch.Tensor:
    """float32 -> fp8 bit patterns (uint8), clamped to the largest finite value (SATFINITE), rounded
    to nearest even (torch's cast)."""
    dtype = FP8[kind]
    top = torch.finfo(dtype).max
    return x.float().clamp(-top, top).to(dtype).view(torch.uint8)


def fp8_value(codes: torch.Tensor, kind: str) -> torch.Tensor:
    return codes.view(FP8[kind]).float()


class _PresetValues:
    """The value side of a preset, in the preset's format (what ``Codec.value_quantizer`` holds)."""

    def __init__(self, codec: "EnginePreset"):
        self.codec, self.bits, self.head_dim = codec, codec.value_bits, codec.head_dim

    def encode(self, v: torch.Tensor) -> Encoded:
        return Encoded(self.codec._quantize(v, "v"), tuple(v.shape), v.dtype)

    def decode(self, state: Encoded) -> torch.Tensor:
        return self.codec._dequantize(state.tensors, "v")

    def expected_nbytes(self, shape) -> int:
        return self.codec.expected_value_nbytes(shape)


class EnginePreset(Codec):
    """Keys and values in one engine's format; subclasses give ``_quantize`` and ``_dequantize`` over
    ``[..., T, d]`` (``side`` 'k' or 'v'), ``bytes_per_vector`` (keys) and, where values differ in size,
    ``expected_value_nbytes``."""
    engine_preset = True

    #: the preset's value bits (None: the key bits)
    preset_value_bits: int | None = None

    def __init__(self, config, device="cpu"):
        super().__init__(config, device)
        self.value_bits = self.preset_value_bits or config.bits
        if config.value_bits not in (None, self.value_bits):
            raise ValueError(f"codec '{self.name}' stores values as its engine does, at {self.value_bits} bits: leave "
                             f"--value-bits out (got {config.value_bits})")
        self.value_quantizer = _PresetValues(self)

    def _encode(self, keys):
        return Encoded(self._quantize(keys, "k"), tuple(keys.shape), keys.dtype)

    def _decode(self, state):
        return self._dequantize(state.tensors, "k")

    def expected_nbytes(self, shape):
        return math.prod(shape[:-1]) * self.bytes_per_vector

    def expected_value_nbytes(self, shape):
        return self.expected_nbytes(shape)

    def _quantize(self, x: torch.Tensor, side: str) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def _dequantize(self, t: dict[str, torch.Tensor], side: str) -> torch.Tensor:
        raise NotImplementedError


class PerTensorFp8(EnginePreset):
    """Keys and values in fp8 (``kind`` 'e4m3' or 'e5m2') after one scale per layer each (``k_scale``,
    ``v_scale``: 1.0 where the checkpoint has none); subclasses give the engine's ``_quantize``. The two
    float32 scales are per layer, not per token: one byte per coordinate."""
    kind = "e4m3"

    @dataclass(frozen=True)
    class Options:
        k_scale: float = 1.0  # the per-layer key scale (1.0 without calibrated checkpoint scales)
        v_scale: float = 1.0

    def __init__(self, config, device="cpu"):
        super().__init__(config, device)
        if not all(0 < s < math.inf for s in (self.opts.k_scale, self.opts.v_scale)):
            raise ValueError(f"codec '{self.name}': k_scale and v_scale must be finite and > 0")
        self.bytes_per_vector = self.head_dim

    def _scale(self, side: str) -> float:
        return self.opts.k_scale if side == "k" else self.opts.v_scale

    def _dequantize(self, t, side):
        return fp8_value(t["codes"], self.kind) * self._scale(side)
