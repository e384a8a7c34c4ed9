"""The compressed state every codec returns: packed codes plus side information, and their bytes."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Encoded:
    """A compressed block of vectors ``[..., T, d]``.

    ``tensors`` maps a field name to a tensor whose shape is ``[..., T, k]`` (per-token
    fields) or ``[..., T // G, k]`` (per-token-group fields, KIVI): concatenating two
    states along the token axis is concatenating every field along dim -2.
    Float side information (norms, scales) is stored at the dtype the method stores it
    in, and counted as such.
    """

    tensors: dict[str, torch.Tensor]
    shape: tuple[int, ...]  # original [..., T, d]
    dtype: torch.dtype  # dtype decode returns

    @property
    def num_tokens(self) -> int:
        return self.shape[-2]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    def num_coords(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    def bits_per_coord(self) -> float:
        """True bits per original coordinate, from the bytes actually stored."""
        return 8.0 * self.nbytes() / max(self.num_coords(), 1)

    def to(self, device) -> "Encoded":
        return Encoded({k: v.to(device) for k, v in self.tensors.items()}, self.shape, self.dtype)

    @staticmethod
    def cat(states: list["Encoded"]) -> "Encoded":
        """Concatenate states along the token axis (each must cover whole token groups)."""
        first = states[0]
        tensors = {k: torch.cat([s.tensors[k] for s in states], dim=-2) for k in first.tensors}
        T = sum(s.shape[-2] for s in states)
        return Encoded(tensors, (*first.shape[:-2], T, first.shape[-1]), first.dtype)
