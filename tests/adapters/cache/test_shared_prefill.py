"""adapters/cache/shared_prefill: one entry, keyed by tensor contents, released before the next is computed."""
from __future__ import annotations

import torch

from adapters.cache.rollout_clock import SharedStep
from adapters.cache.shared_prefill import SharedPrefill, same_key


def test_keys_compare_tensors_by_contents():
    a = torch.arange(6.0).view(2, 3)
    assert same_key((a, (1, 2), True), (a.clone(), (1, 2), True))
    assert not same_key((a,), (a.double(),)) and not same_key((a,), (a.view(3, 2),))
    b = a.clone()
    b[1, 2] += 1e-6
    assert not same_key((a,), (b,)) and not same_key((a, 1), (a, 1.0)) and not same_key((a,), (a, None))


def test_one_entry_computed_once_per_key_and_timed():
    now = [100.0]  # a fake clock: only a compute moves it
    memo, calls = SharedPrefill(clock=lambda: now[0]), []

    def compute(tag):
        def run():
            calls.append(tag)
            now[0] += 0.25
            return {"tag": tag}
        return run

    first, s0 = memo.get(("x", torch.ones(2)), compute("x"), [torch.device("cpu")])
    again, s1 = memo.get(("x", torch.ones(2)), compute("x"), [torch.device("cpu")])
    # its compute's seconds, exact (binary fractions), computed by the first call and replayed by the second
    assert calls == ["x"] and again is first and s0 == SharedStep(0.25, True) and s1 == SharedStep(0.25, False)
    other, s2 = memo.get(("y",), compute("y"), [torch.device("cpu")])
    assert calls == ["x", "y"] and s2 == SharedStep(0.25, True) and other["tag"] == "y"
    back, _ = memo.get(("x", torch.ones(2)), compute("x"), [torch.device("cpu")])
    assert calls == ["x", "y", "x"] and back is not first  # one entry: 'x' was released for 'y'
    memo.release()
    memo.get(("x", torch.ones(2)), compute("x"), [torch.device("cpu")])
    assert calls == ["x", "y", "x", "x"]
