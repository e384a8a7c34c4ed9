"""Feeding sequences of different lengths to a causal LM as one batch: left padding.

Step by step (a prefill, chunks, decode tokens) each sequence gives its own next piece, possibly
none; a step's pieces are left-padded to the longest. While no step has needed a pad the model
gets the bare token tensor, exactly as a batch of one length does. From the first pad on it also
gets the 2-D attention mask over every column fed so far (0 = pad) and position ids that count
each sequence's own real tokens, so sequence b's tokens sit at the positions they have alone.
"""
from __future__ import annotations

import copy

import torch


class LeftPadded:
    """The feeding state of ``batch`` sequences: columns fed, real tokens per sequence, the mask."""

    def __init__(self, batch: int, pad_id: int, device):
        self.seen = [0] * batch  # real tokens fed, per sequence
        self.columns = 0  # columns fed, pads included
        self.pad_id = int(pad_id)
        self.device = device
        self._mask: torch.Tensor | None = None  # [B, columns] long, from the first pad on

    @property
    def padded(self) -> bool:
        return self._mask is not None

    def step(self, pieces: list[list[int]]) -> tuple[torch.Tensor, dict, list[int] | None]:
        """pieces[b]: sequence b's next tokens (none: a step of padding). Returns (input ids [B, t],
        the model's padding keywords: attention_mask and position_ids, or none while nothing has
        been padded; the pads per sequence for the cache, or None while nothing has been padded)."""
        if len(pieces) != len(self.seen):
            raise ValueError(f"{len(pieces)} pieces for a batch of {len(self.seen)}")
        t = max(len(p) for p in pieces)
        if t == 0:
            raise ValueError("a step needs at least one token")
        pads = [t - len(p) for p in pieces]
        x = torch.tensor([[self.pad_id] * n + list(p) for n, p in zip(pads, pieces)], device=self.device)
        if any(pads) and self._mask is None:
            self._mask = torch.ones(len(pieces), self.columns, dtype=torch.long, device=self.device)
        kwargs = {}
        if self._mask is not None:
            new = torch.tensor([[0] * n + [1] * (t - n) for n in pads], dtype=torch.long, device=self.device)
            self._mask = torch.cat([self._mask, new], 1)
            pos = [[0] * n + list(range(s, s + t - n)) for n, s in zip(pads, self.seen)]
            kwargs = {"attention_mask": self._mask, "position_ids": torch.tensor(pos, device=self.device)}
        self.seen = [s + len(p) for s, p in zip(self.seen, pieces)]
        self.columns += t
        return x, kwargs, (pads if self._mask is not None else None)

    def advance(self, steps: int) -> None:
        """Count ``steps`` single-token steps of every sequence fed elsewhere (a graphed decode,
        :mod:`adapters.hf.graphed_decode`), in a batch that has never been padded."""
        if self._mask is not None:
            raise RuntimeError("a padded batch's steps are fed through step()")
        self.seen = [s + steps for s in self.seen]
        self.columns += steps

    def fork(self) -> "LeftPadded":
        """An independent copy (``step`` replaces the lists and the mask, never writes them)."""
        return copy.copy(self)


def pads_from_mask(mask: torch.Tensor, t: int) -> list[int] | None:
    """The padding of a step's ``t`` new tokens read from a 2-D attention mask [B, columns] (its last
    ``t`` columns: zeros, then ones, per row): pads per sequence, or None where there are none."""
    new = mask[:, -t:].bool()
    pads = (t - new.sum(-1)).tolist()
    if not any(pads):
        return None
    if not bool((new == (torch.arange(t, device=new.device) >= new.new_tensor(pads, dtype=torch.long)[:, None])).all()):
        raise ValueError("the compressed cache takes left-padded batches: each row's new tokens must be its "
                         "pads, then its tokens (tokenize with padding_side='left')")
    return pads
