"""A rollout's first step, computed once and shared by every cache configuration of a prompt batch.

A rollout's first step reads an empty cache, so it is plain attention whatever the codec: the
text prompt's prefill, a video's block 0 (its denoising steps attend only to themselves, and its
commit pass attends before it appends), an audio pyramid's scale 0 (held native until scale 1
arrives). Its keys, values and outputs are the same for the baseline and every configuration.
:class:`SharedPrefill` keeps the last such step, keyed by what it was computed from (the prompt
batch's tokens or embedding, and the generator's state where the step draws noise); each rollout
with that key starts from it and appends its native keys and values to its own cache, whose codec
encodes them exactly as after a live first step (:meth:`adapters.cache.kv_cache.CompressedKVCache.replay`,
:meth:`adapters.hf.cache.CompressedCache.replay`). Rows are bit-identical; only the time differs.

One entry: a new key releases the last one before computing its own, so a run holds one prompt
batch's first step at a time. Each rollout that starts from an entry learns the seconds its compute took
and whether it computed it itself (:class:`adapters.cache.rollout_clock.SharedStep`), so that its clock records that shared forward
apart from its own replay and encode (:meth:`adapters.cache.rollout_clock.RolloutClock.prefill_done`):
the forward is the batch's cost, paid once, the replay each configuration's.
"""
from __future__ import annotations

import time
from typing import Callable, Iterable, TypeVar

import torch

from adapters.cache.rollout_clock import SharedStep, wall

T = TypeVar("T")


def same_key(a, b) -> bool:
    """Equality of keys that may hold tensors (equal dtype, shape, device and values) in tuples."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                and a.shape == b.shape and a.device == b.device and torch.equal(a, b))
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(same_key(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


class SharedPrefill:
    """The last first step computed, with its key and the seconds it took (read from ``clock``)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self._entry: tuple[tuple, object, float] | None = None
        self._clock = clock

    def get(self, key: tuple, compute: Callable[[], T], devices: Iterable[torch.device]) -> tuple[T, SharedStep]:
        """(value, step): the value stored under ``key``, else ``compute()``'s (the last entry released
        first); ``step`` its compute's seconds and whether this call computed it."""
        if self._entry is not None and same_key(self._entry[0], key):
            return self._entry[1], SharedStep(self._entry[2], False)
        self.release()
        devices = list(devices)
        t0 = wall(devices, self._clock)
        value = compute()
        self._entry = (key, value, wall(devices, self._clock) - t0)
        return value, SharedStep(self._entry[2], True)

    def release(self) -> None:
        """Drop the stored step (its tensors go once no cache shares them)."""
        self._entry = None
