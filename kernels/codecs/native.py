"""``none``: native precision. Stores the keys and values as they come (their own dtype)."""
from __future__ import annotations

from dataclasses import replace

from kernels.base import Codec
from kernels.encoded import Encoded
from kernels.registry import register_codec


@register_codec("none")
class Native(Codec):
    bits_supported = (16, 32)  # nominal: the input dtype decides what is stored

    def __init__(self, config, device="cpu"):
        super().__init__(replace(config, value_bits=16), device)  # values are stored as they come too

    def _encode(self, keys):
        return Encoded({"x": keys.detach().clone()}, tuple(keys.shape), keys.dtype)

    def _decode(self, state):
        return state.tensors["x"]

    def score(self, q, state):
        return q.float() @ state.tensors["x"].float().transpose(-1, -2)

    def encode_values(self, values, defer=None):
        return self._encode(values)

    def decode_values(self, state):
        return state.tensors["x"]

    def expected_nbytes(self, shape):
        n = 1
        for s in shape:
            n *= s
        return n * 2  # for fp16/bf16 inputs
