"""Speed and memory of one rollout, read at its phase boundaries.

A rollout has two phases: the *prefill* (its first forward, into an empty cache) and the *decode*
(the steps that generate from the cache after it). :class:`RolloutClock` reads the wall clock at
each boundary after a device sync on CUDA (kernels run asynchronously: without the sync a reading
says when work was queued, not when it ended); nothing inside a phase syncs for it, so a timed
rollout pays four syncs (start, prefill end, decode start and end) and nothing per step.

Peak device memory is ``torch.cuda.max_memory_allocated`` over the rollout (the peak counters
reset at its start; model weights included), summed over the rollout's GPUs (a model spread by
``device_map``). On the CPU there is no allocator counter to read, and the peak is None: a
resident-set figure would count the Python process, not the rollout.

A rollout whose first step is shared (:mod:`adapters.cache.shared_prefill`: computed once per prompt
batch, natively, and replayed into each configuration's cache) records that forward apart from its own
prefill: ``shared_forward_s`` is the forward's seconds (the batch's cost, the same figure in every
rollout that starts from it, paid once), ``prefill_s`` this configuration's own part (its replay and
encode; where it computed the shared forward itself, that forward's seconds are taken out). A rollout
whose first step is its own has ``shared_forward_s`` None and its whole first step in ``prefill_s``.

A task makes one clock per timed rollout and passes it to the adapter (``speed=``); a rollout
given none runs :data:`OFF`, whose boundaries do nothing (no sync, no counter reset; a shared
text prefill still times its one forward, with two syncs per prompt batch, for the rollouts that replay it). The clock's
:meth:`RolloutClock.record` is the speed entry of every row the rollout produced; the harness
keeps it out of rows.jsonl (timings differ from run to run).
"""
from __future__ import annotations

import time
from typing import Callable, Iterable, NamedTuple

import torch


class SharedStep(NamedTuple):
    """How a rollout got its first step from a :class:`adapters.cache.shared_prefill.SharedPrefill`:
    ``seconds`` its compute took (synced wall time), ``fresh`` True where this call computed it (inside
    the caller's own timing), False where it was computed earlier and only replayed. It lives with the
    clock that reads it, so that the shared step imports the clock and not the other way round."""

    seconds: float
    fresh: bool


def _cuda(devices: Iterable[torch.device]) -> list[torch.device]:
    return [d for d in devices if d.type == "cuda"]


def wall(devices: Iterable[torch.device], clock: Callable[[], float] = time.perf_counter) -> float:
    """Seconds on the wall clock (``clock``) once the work queued on ``devices`` has ended (a sync per GPU)."""
    for d in _cuda(devices):
        torch.cuda.synchronize(d)
    return clock()


class RolloutClock:
    """Times one rollout. ``device``: where it runs; ``unit``: what its decode generates (a text
    token, a latent frame, ...), for the rate's name; ``clock``: what reads the seconds (tests pass a fake)."""

    def __init__(self, device, unit: str = "token", clock: Callable[[], float] = time.perf_counter):
        self.devices = [torch.device(device)]
        self.unit = unit
        self.clock = clock
        self.sequences = 1
        self.prefill_s: float | None = None
        self.prefill_shared = False
        self.shared_forward_s: float | None = None
        self.decode_s: float | None = None
        self.decode_units = 0
        self.capture_s = 0.0  # warming up and capturing graphed decode steps, inside the decode's time
        self.peak_bytes: int | None = None
        self._t0 = self._t_decode = 0.0

    def start(self, sequences: int = 1, devices: Iterable[torch.device] | None = None) -> None:
        """Before the prefill: ``sequences`` in the rollout's batch; ``devices`` (default: the
        clock's) every device the model occupies."""
        self.sequences = int(sequences)
        if devices is not None:
            self.devices = list(dict.fromkeys(torch.device(d) for d in devices))
        for d in _cuda(self.devices):
            torch.cuda.reset_peak_memory_stats(d)
        self._t0 = wall(self.devices, self.clock)

    def prefill_done(self, shared: SharedStep | None = None) -> None:
        """After the prefill. ``shared``: where its forward ran once for several rollouts and was replayed
        into this cache, that forward's seconds and whether this rollout computed it (then inside its own
        reading, and taken out): ``prefill_s`` is this rollout's own part, ``shared_forward_s`` the forward."""
        own = wall(self.devices, self.clock) - self._t0
        self.prefill_shared = shared is not None
        self.shared_forward_s = None if shared is None else shared.seconds
        self.prefill_s = own - shared.seconds if shared is not None and shared.fresh else own

    def decode_start(self) -> None:
        self._t_decode = wall(self.devices, self.clock)

    def captured(self, seconds: float) -> None:
        """``seconds`` of the decode went to warming up and capturing graphed steps (measured, synced):
        a one-time cost per configuration and batch shape, reported apart from the decode rate."""
        self.capture_s += seconds

    def decode_done(self, units: int) -> None:
        """After the last decode step; ``units``: what the decode generated (every sequence's,
        the first token, which the prefill's logits give, not counted). The decode's time leaves out
        what :meth:`captured` took."""
        self.decode_s = wall(self.devices, self.clock) - self._t_decode - self.capture_s
        self.decode_units = int(units)

    def stop(self) -> None:
        """At the rollout's end: read the peak memory (None on the CPU)."""
        cuda = _cuda(self.devices)
        self.peak_bytes = sum(torch.cuda.max_memory_allocated(d) for d in cuda) if cuda else None

    @property
    def decode_per_s(self) -> float | None:
        """Generated units per second of decode, over the batch; None where nothing was decoded
        (teacher forcing, a one-token answer)."""
        if not self.decode_units or not self.decode_s or self.decode_s <= 0:
            return None
        return self.decode_units / self.decode_s

    def record(self) -> dict:
        """{sequences, prefill_s, prefill_shared, shared_forward_s, decode_s, decode_units, decode_unit,
        decode_per_s, capture_s, peak_bytes}: the figures of this rollout (None where not measured; module
        docstring)."""
        return {"sequences": self.sequences, "prefill_s": self.prefill_s, "prefill_shared": self.prefill_shared,
                "shared_forward_s": self.shared_forward_s,
                "decode_s": self.decode_s if self.decode_units else None, "decode_units": self.decode_units,
                "decode_unit": self.unit, "decode_per_s": self.decode_per_s, "capture_s": self.capture_s,
                "peak_bytes": self.peak_bytes}


class _Off(RolloutClock):
    """The clock of a rollout nobody times: every boundary does nothing."""

    def __init__(self):
        super().__init__("cpu")

    def start(self, sequences: int = 1, devices=None) -> None:
        pass

    def prefill_done(self, shared=None) -> None:
        pass

    def decode_start(self) -> None:
        pass

    def captured(self, seconds: float) -> None:
        pass

    def decode_done(self, units: int) -> None:
        pass

    def stop(self) -> None:
        pass


OFF = _Off()
