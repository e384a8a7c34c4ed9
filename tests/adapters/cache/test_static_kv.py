"""A layer in the static layout of graphed decode steps (adapters/cache/static_kv.py). On the fused path:
with the fused commit (kernels/triton/commit.py, one launch a step) it attends and hands back exactly what
the sequence it replaces does (the window writes, the encoders, the store writes), and both leave the
stores holding the eager steps' bytes; a non-finite key it commits raises at the next check. A block codec
(KIVI) hands back the eager steps' cache byte for byte. Runs on CUDA, else on the CPU under
TRITON_INTERPRET=1 (small shapes: the interpreter runs programs one by one)."""
from __future__ import annotations

import pytest
import torch

CUDA = torch.cuda.is_available()  # else the interpreter runs the kernels (tests/conftest.py sets TRITON_INTERPRET=1)
pytest.importorskip("triton")

from adapters.cache.config import CacheConfig  # noqa: E402
from adapters.cache.kv_cache import CompressedKVCache  # noqa: E402
from adapters.cache.static_kv import StaticCounters, StaticKV  # noqa: E402
from kernels.attention import decide_attention  # noqa: E402

DEV = "cuda" if CUDA else "cpu"
HQ, HKV, D, R = 4, 2, 64, 3


def _layer(codec: str):
    """A layer after a 13-token prefill: 10 committed, a window of R = 3."""
    cache = CompressedKVCache(CacheConfig(codec=codec, bits=3, residual=R, backend="triton"), 1, HKV, D, device=DEV)
    g = torch.Generator().manual_seed(0)
    k, v = (torch.randn(1, HKV, 13, D, generator=g).to(DEV, torch.bfloat16) for _ in range(2))
    cache[0].append(k, v)
    return cache[0]


def _steps(n: int, nan_at: int | None = None):
    g = torch.Generator().manual_seed(1)
    out = []
    for s in range(n):
        q, k, v = (torch.randn(1, h, 1, D, generator=g).to(DEV, torch.bfloat16) for h in (HQ, HKV, HKV))
        if s == nan_at:
            k[0, 1, 0, 5] = float("nan")
        out.append((q, k, v))
    return out


def _static(layer, steps, fused: bool, monkeypatch):
    """``steps`` static steps of a fork of ``layer`` -> (outputs, the fork handed back, the StaticKV)."""
    kv = layer.fork()
    counters = StaticCounters(1, R, DEV)
    counters.load(kv.committed, kv.columns)
    path = decide_attention(steps[0][0], kv.codec, HKV, "triton").path
    with monkeypatch.context() as m:
        if not fused:
            m.setattr(kv.codec, "fused_commit", lambda device: None)
        static = StaticKV(kv, counters, kv.committed + len(steps), path)
    assert (static._commit is not None) == fused
    static.load(kv)
    outs = []
    for q, k, v in steps:
        outs.append(static.step(q, k, v, D ** -0.5))
        counters.advance()
    static.unload(kv, len(steps))
    return outs, kv, static


def _bytes(state):
    return {name: t.view(torch.uint8) for name, t in state.tensors.items()}


def _same_state(a, b):
    a, b = _bytes(a), _bytes(b)
    assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)


@pytest.mark.parametrize("codec", ["octopus", "turboquant-mse"])
def test_the_fused_commit_leaves_what_the_sequence_leaves(codec, monkeypatch):
    layer = _layer(codec)
    steps = _steps(4)  # more than the window: tokens of the steps themselves are committed
    fused, by_fused, _ = _static(layer, steps, True, monkeypatch)
    seq, by_seq, _ = _static(layer, steps, False, monkeypatch)
    for a, b in zip(fused, seq):  # the same kernels read the same ring and store (a row past the lengths aside)
        assert torch.equal(a, b)
    eager = layer.fork()
    for q, k, v in steps:
        eager.attend(q, scale=D ** -0.5, k_new=k, v_new=v, causal=True)
        eager.append(k, v)
    for kv in (by_fused, by_seq):  # each byte the eager steps' (their encodes run the same fused encoders)
        assert (kv.seq_committed, kv.seq_window, kv.columns) == (eager.seq_committed, eager.seq_window, eager.columns)
        _same_state(kv.compressed_keys(), eager.compressed_keys())
        _same_state(kv.compressed_values(), eager.compressed_values())
        assert torch.equal(kv.window_k, eager.window_k) and torch.equal(kv.window_v, eager.window_v)


def test_a_non_finite_key_raises_at_the_next_check_once_committed(monkeypatch):
    """The fused commit notes a key it commits on the device (no sync, and nothing raised in the step);
    the layer handed back raises at its next check, as after the eager steps' deferred notes. A NaN key
    still in the window is not committed, so not noted (the eager window holds it natively too)."""
    layer = _layer("octopus")
    _, kv, _ = _static(layer, _steps(R, nan_at=0), True, monkeypatch)  # written at step 0, committed at step R
    kv.finite.raise_if_any()
    _, kv, _ = _static(layer, _steps(R + 1, nan_at=0), True, monkeypatch)
    with pytest.raises(ValueError, match="keys contained non-finite values"):
        kv.finite.raise_if_any()


def test_a_block_codec_hands_back_the_eager_steps_cache():
    """KIVI commits blocks of G tokens: in the static layout every step runs the same operations and only the
    step that fills a block commits it, so the layer handed back holds the eager steps' bytes: its stores,
    its window (the steps' own tokens), its counts."""
    cfg = CacheConfig(codec="kivi", bits=2, residual=R, options={"group_size": 4})
    cache = CompressedKVCache(cfg, 1, HKV, D, device=DEV)
    g = torch.Generator().manual_seed(0)
    k, v = (torch.randn(2, HKV, 13, D, generator=g).to(DEV, torch.bfloat16) for _ in range(2))
    cache[0].append(k, v)  # 8 committed, a window of 5 of its R + G - 1 = 6 at most
    layer = cache[0]
    # 10 steps: blocks commit at the 2nd, 6th and 10th
    steps = [[torch.randn(2, h, 1, D, generator=g).to(DEV, torch.bfloat16) for h in (HQ, HKV, HKV)] for _ in range(10)]
    kv, eager = layer.fork(), layer.fork()
    counters = StaticCounters(2, R, DEV, block=4)
    counters.load(kv.committed, kv.columns, kv.seq_window[0])
    static = StaticKV(kv, counters, kv.committed + len(steps), "torch")
    static.load(kv)
    for q, k, v in steps:
        static.step(q, k, v, D ** -0.5)
        counters.advance()
        eager.attend(q, scale=D ** -0.5, k_new=k, v_new=v, causal=True)
        eager.append(k, v)
    static.unload(kv, len(steps))
    assert eager.seq_committed == [20, 20] and eager.seq_window == [3, 3]
    assert (kv.seq_committed, kv.seq_window, kv.columns, kv._append_sizes) == \
        (eager.seq_committed, eager.seq_window, eager.columns, eager._append_sizes)
    _same_state(kv.compressed_keys(), eager.compressed_keys())
    _same_state(kv.compressed_values(), eager.compressed_values())
    assert torch.equal(kv.window_k, eager.window_k) and torch.equal(kv.window_v, eager.window_v)
    assert kv.nbytes() == eager.nbytes()
