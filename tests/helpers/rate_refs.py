"""Bytes per cached vector from the codecs' documented state layouts (their module docstrings), computed by
hand: what the rate figures of a cache (bits per coordinate, compressed bytes) must come to."""
from __future__ import annotations

import math


def _pow2(d: int) -> int:
    return 1 << (d - 1).bit_length()


def key_bytes(codec: str, bits: int, d: int) -> int:
    """Bytes of one key vector of head dim ``d`` at ``bits``."""
    d_pad = _pow2(d)
    if codec == "turboquant-mse":  # float32 norm + d_pad b-bit codes
        return 4 + math.ceil(d_pad * bits / 8)
    if codec == "octopus":  # float32 norm + per triplet two (b+1)-bit direction codes and one (b-1)-bit norm code
        nt = math.ceil(d_pad / 3)
        return 4 + math.ceil(2 * nt * (bits + 1) / 8) + math.ceil(nt * (bits - 1) / 8)
    if codec == "quarot":  # d_pad b-bit codes + fp16 scale and zero (one group: the whole padded vector)
        return math.ceil(d_pad * bits / 8) + 4
    raise KeyError(codec)


def value_bytes(bits: int, d: int, group: int = 32) -> int:
    """Bytes of one value vector: b-bit codes of d (padded to a whole group) + fp16 scale and zero per group."""
    groups = math.ceil(d / min(group, d))
    return math.ceil(groups * min(group, d) * bits / 8) + 4 * groups
