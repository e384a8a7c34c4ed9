"""Committed codec states of a batch, written in place: :class:`EncodedStore`.

A layer commits tokens a few at a time (a prefill's worth, then a decode step's worth). Keeping
each commit as its own :class:`~kernels.encoded.Encoded` and concatenating them on read copies
the whole state whenever tokens commit (gigabytes per step for a long batch on a GPU); the store
writes each commit into preallocated buffers instead, one per field, whose capacity doubles when
full, and a read is a view.

The sequences of a batch may hold different numbers of committed tokens (a left-padded batch
whose pads were dropped): sequence b's tokens fill rows [0, n_b) of its own slice of each buffer,
left-aligned; the rows after them hold zeros (finite wherever a codec decodes them) that
attention masks by per-sequence lengths. Bytes are counted from real rows only.
"""
from __future__ import annotations

from functools import lru_cache

import torch

from kernels import Encoded


def tail(state: Encoded, start: int) -> Encoded:
    """The tokens [start:] of a state (``start`` a multiple of the codec's token block): every field
    is [..., T, k] or, for token groups, [..., T // G, k], so rows are cut in proportion."""
    T = state.num_tokens
    if start == 0:
        return state
    tensors = {}
    for name, t in state.tensors.items():
        rows = t.shape[-2]
        if (start * rows) % T:
            raise ValueError(f"field '{name}' ({rows} rows for {T} tokens) cannot be cut at token {start}")
        tensors[name] = t[..., start * rows // T:, :]
    return Encoded(tensors, (*state.shape[:-2], T - start, state.shape[-1]), state.dtype)


@lru_cache(maxsize=64)
def _column(values: tuple[int, ...], device: str) -> torch.Tensor:
    return torch.tensor(values, device=device)[:, None]


@lru_cache(maxsize=64)
def _rows_after(starts: tuple[int, ...], n: int, device: str) -> torch.Tensor:
    """[G, n]: rows starts[g] .. starts[g] + n - 1 (index tensors are built once per shape: every
    layer of a model writes the same rows in a step)."""
    return _column(starts, device) + torch.arange(n, device=device)


class EncodedStore:
    """The committed states of B sequences: fields ``[B, H, rows, k]`` (rows per token fixed by
    the codec: 1, or 1/G for per-group fields), appended along the token axis.

    ``tokens[b]``: sequence b's committed tokens. ``version`` counts appends (a memo of decoded
    rows compares it).
    """

    def __init__(self, batch: int):
        self.tokens = [0] * batch
        self.version = 0
        self._buf: dict[str, torch.Tensor] = {}
        self._ratio: dict[str, tuple[int, int]] = {}  # field -> (rows, tokens) of the first state
        self._cap = 0  # capacity in tokens
        self._tail: tuple[int, ...] = ()  # the state's shape after the token axis (d)
        self._dtype: torch.dtype | None = None
        self._shared = False  # the buffers are also another store's (fork): copy before writing

    @property
    def batch(self) -> int:
        return len(self.tokens)

    def _rows(self, name: str, tokens: int) -> int:
        rows, per = self._ratio[name]
        if (tokens * rows) % per:
            raise ValueError(f"field '{name}' ({rows} rows per {per} tokens) cannot hold {tokens} tokens")
        return tokens * rows // per

    def append(self, state: Encoded, seqs: list[int] | None = None) -> None:
        """Append ``state`` (fields [len(seqs), H, rows, k], every sequence the same number of
        tokens n) after the committed tokens of sequences ``seqs`` (default: all, in order)."""
        seqs = list(range(self.batch)) if seqs is None else list(seqs)
        if state.shape[0] != len(seqs):
            raise ValueError(f"a state of {state.shape[0]} sequences appended to {len(seqs)}")
        n = state.num_tokens
        if n == 0:
            return
        if not self._buf:
            self._ratio = {k: (t.shape[-2], n) for k, t in state.tensors.items()}
            self._tail, self._dtype = tuple(state.shape[-1:]), state.dtype
        offsets = [self.tokens[b] for b in seqs]
        self._reserve(max(offsets) + n, state)
        same = len(set(offsets)) == 1
        if same and seqs == list(range(self.batch)):  # the equal-length batch: one slice per field
            for k, t in state.tensors.items():
                a = self._rows(k, offsets[0])
                self._buf[k][:, :, a:a + t.shape[-2]] = t
        else:  # each sequence at its own offset: one indexed write per field
            dev = str(next(iter(self._buf.values())).device)
            index = _column(tuple(seqs), dev)
            for k, t in state.tensors.items():
                rows = _rows_after(tuple(self._rows(k, o) for o in offsets), t.shape[-2], dev)
                self._buf[k][index, :, rows] = t.transpose(1, 2)  # [G, per, H, k]
        for b in seqs:
            self.tokens[b] += n
        self.version += 1

    def _reserve(self, tokens: int, like: Encoded, exact: bool = False) -> None:
        """Room for ``tokens`` tokens per sequence (doubling, or exactly ``tokens`` where ``exact``),
        and buffers of our own."""
        if tokens <= self._cap and not self._shared:
            return
        cap = max(tokens, self._cap if exact else 2 * self._cap) if tokens > self._cap else self._cap
        new = {}
        for k, t in like.tensors.items():
            old = self._buf.get(k)
            buf = torch.zeros((self.batch, *t.shape[1:-2], self._rows(k, cap), t.shape[-1]), dtype=t.dtype,
                              device=t.device)
            if old is not None:
                used = self._rows(k, max(self.tokens))
                buf[:, :, :used] = old[:, :, :used]
            new[k] = buf
        self._buf, self._cap, self._shared = new, cap, False

    def allocate(self, tokens: int, like: Encoded) -> None:
        """Buffers of our own, zeroed, for exactly ``tokens`` tokens per sequence, shaped like ``like``'s fields
        (an empty store: the buffers a pooled graphed decode keeps across rollouts, :mod:`adapters.cache.static_kv`)."""
        if self._buf:
            raise RuntimeError("allocate() makes the buffers of an empty store")
        self._ratio = {k: (t.shape[-2], like.num_tokens) for k, t in like.tensors.items()}
        self._tail, self._dtype = tuple(like.shape[-1:]), like.dtype
        self._reserve(tokens, like, exact=True)

    def load(self, state: Encoded) -> None:
        """Hold exactly ``state``'s tokens (fields [B, H, rows, k], every sequence the same count), written
        over the first rows of the buffers (within the capacity; the rows after keep what they held)."""
        n = state.num_tokens
        if n > self._cap:
            raise ValueError(f"{n} tokens loaded into a store with room for {self._cap}")
        for k, t in state.tensors.items():
            self._buf[k][:, :, :t.shape[-2]].copy_(t)
        self.tokens = [n] * self.batch
        self.version += 1

    def reserve(self, tokens: int) -> None:
        """Buffers of our own with room for exactly ``tokens`` tokens per sequence (at least what
        they hold): a graphed decode then writes every step in place (:meth:`write_at`)."""
        like = self.view()
        if like is not None:
            self._reserve(tokens, like, exact=True)

    def write_at(self, state: Encoded, rows: torch.Tensor, blocks: torch.Tensor | None = None) -> None:
        """Write ``state`` (t tokens of every sequence: fields [B, H, t, k], or [B, H, t / G, k] for fields
        of one row per block of G tokens) at token rows ``rows`` (int64 [t] on the device), its per-block
        fields at rows ``blocks`` (int64 [t / G]), with no host bookkeeping and no sync (a captured decode
        step); :meth:`advance` then counts the tokens written."""
        for k, t in state.tensors.items():
            r, per = self._ratio[k]
            self._buf[k].index_copy_(2, rows if r == per else blocks, t)

    def advance(self, n: int) -> None:
        """Count ``n`` tokens per sequence written by :meth:`write_at`."""
        self.tokens = [c + n for c in self.tokens]
        self.version += 1

    def buffers(self) -> dict[str, torch.Tensor]:
        """The buffers by field, [B, H, rows(capacity), k] each: for a kernel that writes rows in place (a
        graphed decode step's fused commit); :meth:`advance` then counts the tokens written."""
        return dict(self._buf)

    def rows_in_blocks(self, block: int) -> bool:
        """Whether every field holds one row per token or one per ``block`` tokens (what :meth:`write_at` writes)."""
        return all(rows == per or rows * block == per for rows, per in self._ratio.values())

    def view(self, tokens: int | None = None) -> Encoded | None:
        """Every sequence's committed tokens: fields [B, H, rows(T), k] with T = max tokens, or
        ``tokens`` (within the capacity: a graphed decode's fixed shape, read by per-sequence
        lengths), as views of the buffers (sequence b's tokens are the first tokens[b]); None while empty."""
        T = max(self.tokens, default=0) if tokens is None else tokens
        if T > self._cap:
            raise ValueError(f"a view of {T} tokens of a store with room for {self._cap}")
        if T == 0:
            return None
        some = next(iter(self._buf.values()))
        tensors = {k: t[:, :, :self._rows(k, T)] for k, t in self._buf.items()}
        return Encoded(tensors, (self.batch, *some.shape[1:-2], T, *self._tail), self._dtype)

    def nbytes(self, seq: int | None = None) -> int:
        """Bytes of the real rows of sequence ``seq`` (default: every sequence); never capacity or filler."""
        seqs = range(self.batch) if seq is None else [seq]
        total = 0
        for k, t in self._buf.items():
            per_row = t[0, ..., 0, :].numel() * t.element_size()  # H * k elements
            total += per_row * sum(self._rows(k, self.tokens[b]) for b in seqs)
        return total

    def fork(self) -> "EncodedStore":
        """An independent copy: the buffers are shared until either side writes (then it copies them)."""
        other = EncodedStore.__new__(EncodedStore)
        other.__dict__.update(self.__dict__)
        other.tokens = list(self.tokens)
        self._shared = other._shared = bool(self._buf)
        return other

    def repeat_batch(self, n: int) -> None:
        """Each sequence repeated ``n`` times in place (b -> b*n .. b*n + n-1)."""
        self._buf = {k: t.repeat_interleave(n, 0) for k, t in self._buf.items()}
        self.tokens = [c for c in self.tokens for _ in range(n)]
        self._shared = False
        self.version += 1
