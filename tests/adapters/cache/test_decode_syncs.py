"""A decode step through the compressed cache asks the host for nothing (issue #24: no host sync per
step, so a step can be captured in a CUDA graph); non-finite keys of such a step still raise, at the
next point that syncs anyway (a chunk, or the cache's statistics)."""
from __future__ import annotations

import pytest
import torch

from adapters.cache.config import CacheConfig

from adapters.cache.kv_cache import CompressedKVCache
from kernels.checks import DeferredFinite, check_finite

HKV, HQ, D = 2, 4, 128


def test_deferred_notes_without_raising_then_raises_once_asked():
    flags = DeferredFinite()
    flags.note(torch.ones(3, 4), "keys")
    flags.raise_if_any()  # finite: nothing
    bad = torch.ones(3, 4)
    bad[1, 2] = float("inf")
    flags.note(bad, "values")  # noted, not raised
    other = flags.fork()
    with pytest.raises(ValueError, match="values of layer 2 contained non-finite values"):
        flags.raise_if_any(" of layer 2")
    with pytest.raises(ValueError, match="values"):
        other.raise_if_any()  # a fork keeps what was noted before it
    with pytest.raises(ValueError, match=r"index \(1, 2\)"):
        check_finite(bad, "values", flags)  # on the CPU a check costs no sync: it runs at once
    nan = DeferredFinite()
    for x in (torch.ones(2, 2), torch.tensor([[1.0, float("nan")]]), torch.ones(2, 2)):  # a NaN noted between
        nan.note(x.bfloat16(), "keys")
    with pytest.raises(ValueError, match="keys contained"):
        nan.raise_if_any()


def _cache(codec: str, device) -> CompressedKVCache:
    return CompressedKVCache(CacheConfig(codec=codec, bits=3, residual=8), 2, HKV, D, device=device)


def _step(cache, q, k, v):
    outs = []
    for layer in cache.layers:
        outs.append(layer.attend(q, k_new=k, v_new=v, causal=True))
        layer.append(k, v)
    return outs


@pytest.mark.skipif(not torch.cuda.is_available(), reason="host syncs are a CUDA matter")
@pytest.mark.parametrize("codec", ["octopus", "turboquant-mse", "kivi"])
def test_a_decode_step_never_syncs(codec):
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    cache = _cache(codec, dev)
    k, v = (torch.randn(1, HKV, 200, D, device=dev, generator=g, dtype=torch.bfloat16) for _ in range(2))
    for layer in cache.layers:
        layer.append(k, v)  # the prefill commits all but the window
    steps = [[torch.randn(1, n, 1, D, device=dev, generator=g, dtype=torch.bfloat16) for n in (HQ, HKV, HKV)]
             for _ in range(40)]  # enough for a KIVI group of 32 to commit under watch
    _step(cache, *steps[0])  # the first step may build what later steps reuse (kernels, index tensors)
    torch.cuda.synchronize()
    before = cache.layers[0].committed
    torch.cuda.set_sync_debug_mode("error")
    try:
        for q, k1, v1 in steps[1:]:
            _step(cache, q, k1, v1)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert cache.layers[0].committed > before  # tokens were encoded and committed in the watched steps


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the deferred check is a CUDA matter")
def test_a_decode_steps_non_finite_keys_raise_at_the_statistics():
    dev = torch.device("cuda")
    cache = _cache("octopus", dev)
    k = torch.randn(1, HKV, 100, D, device=dev, dtype=torch.bfloat16)
    for layer in cache.layers:
        layer.append(k, k)
    bad = torch.randn(1, HKV, 1, D, device=dev, dtype=torch.bfloat16)
    bad[0, 1, 0, 5] = float("nan")
    good = torch.randn(1, HKV, 1, D, device=dev, dtype=torch.bfloat16)
    for x in [bad] + [good] * 8:  # the bad token leaves the 8-token window 8 steps later: encoded, noted
        cache.layers[1].append(x, x)
    torch.cuda.synchronize()  # nothing raised so far
    with pytest.raises(ValueError, match="keys of layer 1 contained non-finite values"):
        cache.stats()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="'auto' runs no fused kernel on the CPU")
def test_auto_without_a_kernel_is_the_torch_path_bit_for_bit():
    """Where 'auto' finds no kernel for a step (KIVI has none), it reads as backend 'torch' does."""
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(1)
    k, v = (torch.randn(1, HKV, 150, D, device=dev, generator=g, dtype=torch.bfloat16) for _ in range(2))
    q = torch.randn(1, HQ, 1, D, device=dev, generator=g, dtype=torch.bfloat16)
    outs = []
    for backend in ("torch", "auto"):
        cache = CompressedKVCache(CacheConfig(codec="kivi", bits=2, residual=8, backend=backend), 1, HKV, D, device=dev)
        cache.layers[0].append(k, v)
        outs.append(cache.layers[0].attend(q, k_new=k[..., :1, :], v_new=v[..., :1, :], causal=True))
    assert torch.equal(outs[0], outs[1])
