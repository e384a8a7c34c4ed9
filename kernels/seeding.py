"""Seeds: every random draw in the project comes from a generator seeded from named parts (seed,
layer, purpose, prompt id, ...), never from global state, so a draw is the same on every run."""
from __future__ import annotations

import hashlib

import torch


def derive_seed(*parts) -> int:
    """A stable 63-bit seed from any parts (seed, layer, purpose, ...); independent of Python's hash salt."""
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def private_generator(*parts, device="cpu") -> torch.Generator:
    """A torch.Generator seeded from ``parts``: every random draw in the project goes through one of these."""
    g = torch.Generator(device=device)
    g.manual_seed(derive_seed(*parts))
    return g
