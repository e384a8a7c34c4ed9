"""Native windows of sequences of different lengths: ``[B, H, W, d]`` tensors in which sequence b's
tokens are the first ``lens[b]`` along the token axis (left-aligned, right-padded).

The pads of a left-padded batch never enter a window: an append drops each sequence's leading
pads and writes its real tokens right after its own. Filler positions hold copies of real
tokens (finite; attention masks them by the window lengths). Each operation is one gather whose
index is built once per shape and device (every codec layer of a model asks for the same one in
a forward pass), so a step costs the same few launches whatever the batch size.
"""
from __future__ import annotations

from functools import lru_cache

import torch


@lru_cache(maxsize=64)
def _index(starts: tuple[int, ...], counts: tuple[int, ...], offsets: tuple[int, ...], device: str) -> torch.Tensor:
    """[B, max(starts + counts)] long: position j of sequence b reads j where j < starts[b], then
    ``offsets[b] + j`` while j < starts[b] + counts[b], else 0 (filler)."""
    width = max(s + c for s, c in zip(starts, counts))
    j = torch.arange(width, device=device)
    s, c, o = (torch.tensor(x, device=device)[:, None] for x in (starts, counts, offsets))
    return torch.where(j < s, j, torch.where(j < s + c, o + j, torch.zeros_like(j)))


def _gather(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """x [B, H, T, d], idx [B, W] -> [B, H, W, d] with out[b, :, j] = x[b, :, idx[b, j]]."""
    B, H, _, d = x.shape
    return torch.gather(x, 2, idx[:, None, :, None].expand(B, H, idx.shape[1], d))


def append(window: torch.Tensor | None, lens: list[int], new: torch.Tensor, pads: list[int] | None
           ) -> tuple[torch.Tensor, list[int]]:
    """``window`` (None: empty) with each sequence's real new tokens appended after its own.

    new: [B, H, t, d], sequence b's first ``pads[b]`` tokens padding (None: none). Returns the new
    window [B, H, max(lens'), d] and its lengths lens'.
    """
    t = new.shape[-2]
    pads = pads or [0] * new.shape[0]
    out_lens = [n + t - p for n, p in zip(lens, pads)]
    W = 0 if window is None else window.shape[-2]
    both = new if window is None else torch.cat([window, new], dim=-2)
    if not any(pads) and all(n == W for n in lens):  # nothing ragged: the plain concatenation
        return both, out_lens
    # sequence b's new token i (at W + pads[b] + i in `both`) lands at lens[b] + i
    offsets = tuple(W + p - n for n, p in zip(lens, pads))
    idx = _index(tuple(lens), tuple(t - p for p in pads), offsets, str(new.device))
    return _gather(both, idx), out_lens


def drop_front(window: torch.Tensor, lens: list[int], drop: list[int]) -> tuple[torch.Tensor, list[int]]:
    """``window`` without each sequence's first ``drop[b]`` tokens (a copy: the dropped tokens'
    storage is released). Returns the new window and its lengths."""
    out_lens = [n - k for n, k in zip(lens, drop)]
    if len(set(drop)) == 1 and all(n == window.shape[-2] for n in lens):
        return window[..., drop[0]:, :].clone(), out_lens
    idx = _index((0,) * len(lens), tuple(out_lens), tuple(drop), str(window.device))
    return _gather(window, idx), out_lens


@lru_cache(maxsize=64)
def keep_after_pads(pads: tuple[int, ...], t: int, device: str) -> torch.Tensor:
    """[B, t] bool: True for the real (non-pad) tokens of a left-padded step."""
    return torch.arange(t, device=device) >= torch.tensor(pads, device=device)[:, None]


@lru_cache(maxsize=64)
def as_tensor(values: tuple[int, ...], device: str) -> torch.Tensor:
    """Per-sequence lengths as the attention kernels take them: int32 [B] on ``device``, built once
    per value (every codec layer of a step asks for the same ones)."""
    return torch.tensor(values, dtype=torch.int32, device=device)
