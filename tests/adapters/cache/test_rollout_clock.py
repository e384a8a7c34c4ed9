"""adapters/cache/rollout_clock.py: what a timed rollout records, on the tiny text model (greedy decoding
and teacher forcing) and, with torch.cuda's calls counted, the syncs and peak memory it reads on
CUDA (no GPU here: the counters are stand-ins)."""
from __future__ import annotations

import math

import pytest
import torch
from helpers.tiny_lm import tiny_causal_lm

from adapters.cache.config import CacheConfig
from adapters.cache.rollout_clock import OFF, RolloutClock

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
    assert rec["prefill_s"] > 0 and not rec["prefill_shared"] and rec["sequences"] == 2
    assert rec["decode_units"] == 0 and rec["decode_s"] is None and rec["decode_per_s"] is None


class FakeClock:
    """A clock that moves only when told: ``advance(s)``. Binary fractions keep every sum exact."""

    def __init__(self, t: float = 100.0):
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, s: float) -> None:
        self.t += s


def test_a_shared_prefill_counts_the_forward_it_replays():
    fake = FakeClock()
    clock = RolloutClock("cpu", clock=fake)
    clock.start()
    fake.advance(0.125)  # this rollout's replay and encode
    clock.prefill_done(shared_s=0.5)
    assert clock.prefill_s == 0.625 and clock.prefill_shared  # exact: binary fractions
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
    OFF.prefill_done(1.0)
    OFF.decode_start()
    OFF.decode_done(9)
    OFF.stop()
    assert OFF.prefill_s is None and OFF.decode_units == 0
