"""adapters/cache/rollout_clock.py: what a timed rollout records, on the tiny text model (greedy decoding
and teacher forcing) and, with torch.cuda's calls counted, the syncs and peak memory it reads on
CUDA (no GPU here: the counters are stand-ins)."""
from __future__ import annotations

import math

import pytest
import torch
from helpers.tiny_lm import tiny_causal_lm

from adapters.cache.config import CacheConfig
from adapters.cache.rollout_clock import OFF, RolloutClock, SharedStep

PROMPTS = [list(range(40, 110)), list(range(60, 101))]  # two lengths: a left-padded batch


@pytest.fixture(scope="module")
def lm():
    return tiny_causal_lm("qwen2")


def test_greedy_records_prefill_and_decode_and_changes_nothing(lm):
    cfg = CacheConfig(codec="kivi", bits=2, residual=8)
    plain = lm.greedy(PROMPTS, 6, cfg, force="self")
    clock = RolloutClock(lm.device)
    timed = lm.greedy(PROMPTS, 6, cfg, force="self", speed=clock)
    for a, b in zip(plain, timed):  # timing is outside the computation: the same tokens and logits
        assert a["tokens"] == b["tokens"] and torch.equal(a["logits"], b["logits"])
        assert torch.equal(a["forced_logits"], b["forced_logits"])
    rec = clock.record()
    units = sum(len(r["tokens"]) - 1 for r in timed)
    assert units > 0 and rec["decode_units"] == units and rec["sequences"] == 2 and rec["decode_unit"] == "token"
    assert rec["prefill_s"] > 0 and rec["decode_s"] > 0
    assert rec["decode_per_s"] == units / rec["decode_s"] and math.isfinite(rec["decode_per_s"])  # the same division
    assert rec["prefill_shared"]  # the first greedy computed the shared prefill; this one replayed it
    assert rec["shared_forward_s"] > 0  # that forward's seconds, apart from this rollout's own replay
    assert rec["peak_bytes"] is None  # the CPU has no allocator counter


def test_teacher_forcing_decodes_nothing(lm):
    clock = RolloutClock(lm.device)
    lm.share_prefill = False
    try:
        lm.teacher_force(PROMPTS, [[30, 20, 20], [25, 16]], CacheConfig(codec="kivi", bits=2, residual=8),
                         lambda b, start, logits: None, speed=clock)
    finally:
        lm.share_prefill = True
    rec = clock.record()
    assert rec["prefill_s"] > 0 and not rec["prefill_shared"] and rec["shared_forward_s"] is None
    assert rec["sequences"] == 2 and rec["decode_units"] == 0 and rec["decode_s"] is None and rec["decode_per_s"] is None


class FakeClock:
    """A clock that moves only when told: ``advance(s)``. Binary fractions keep every sum exact."""

    def __init__(self, t: float = 100.0):
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, s: float) -> None:
        self.t += s


def test_a_shared_prefill_is_recorded_apart_from_the_rollouts_own():
    """The shared forward's seconds go to ``shared_forward_s`` (the batch's cost, the same in every rollout that
    starts from it); ``prefill_s`` keeps this rollout's own replay and encode, also where it computed the
    forward itself (then inside its reading: taken out)."""
    fake = FakeClock()
    clock = RolloutClock("cpu", clock=fake)
    clock.start()
    fake.advance(0.125)  # this rollout's replay and encode of a forward computed earlier
    clock.prefill_done(SharedStep(0.5, fresh=False))
    assert (clock.prefill_s, clock.shared_forward_s, clock.prefill_shared) == (0.125, 0.5, True)  # exact: binary
    first = RolloutClock("cpu", clock=fake)
    first.start()
    fake.advance(0.5 + 0.25)  # the shared forward, computed by this rollout, then its own replay
    first.prefill_done(SharedStep(0.5, fresh=True))
    assert (first.prefill_s, first.shared_forward_s) == (0.25, 0.5)
    assert first.record()["shared_forward_s"] == 0.5 and first.record()["prefill_s"] == 0.25
    own = RolloutClock("cpu", clock=fake)
    own.start()
    fake.advance(0.375)
    own.prefill_done()
    assert (own.prefill_s, own.shared_forward_s, own.prefill_shared) == (0.375, None, False)
    clock.decode_start()
    fake.advance(0.25)
    clock.decode_done(3)
    assert clock.decode_s == 0.25 and clock.decode_per_s == 12.0


def test_on_cuda_one_sync_per_boundary_and_the_peak_over_every_gpu(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda d: calls.append(("sync", d.index)))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda d: calls.append(("reset", d.index)))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda d: 1000 * (d.index + 1))
    clock = RolloutClock("cuda:0")
    clock.start(devices=["cuda:0", "cuda:1", "cuda:0"])
    clock.prefill_done()
    clock.decode_start()
    clock.decode_done(4)
    clock.stop()
    assert [c for c in calls if c[0] == "reset"] == [("reset", 0), ("reset", 1)]
    assert sorted(c for c in calls if c[0] == "sync") == [("sync", 0)] * 4 + [("sync", 1)] * 4
    assert clock.record()["peak_bytes"] == 3000


def test_off_touches_nothing(monkeypatch):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda d: pytest.fail("OFF synced"))
    OFF.start(4, ["cuda:0"])
    OFF.prefill_done(SharedStep(1.0, fresh=False))
    OFF.decode_start()
    OFF.decode_done(9)
    OFF.stop()
    assert OFF.prefill_s is None and OFF.decode_units == 0
