"""How ``harness bench`` times one call, and the bf16 attention it is timed against: CUDA-graph
and eager medians (Triton's ``do_bench``), the device-to-device copy bandwidth every achieved
bandwidth is a fraction of, and SDPA on the flash backend where it runs the inputs."""
from __future__ import annotations

import torch


def time_graph(fn, rep_ms: int) -> float:
    """Median seconds per call of fn, from CUDA-graph replays (events)."""
    import triton.testing as tt

    fn()
    torch.cuda.synchronize()
    return tt.do_bench_cudagraph(fn, rep=rep_ms, return_mode="median") * 1e-3


def time_eager(fn, rep_ms: int) -> float:
    """Median seconds per call of fn, timed eagerly (calls a CUDA graph cannot capture)."""
    import triton.testing as tt

    return tt.do_bench(fn, warmup=max(10, rep_ms // 4), rep=rep_ms, return_mode="median") * 1e-3


def copy_bandwidth(dev, nbytes: int = 1 << 30, rep_ms: int = 200) -> float:
    """Device-to-device copy, bytes read + written per second (CUDA-graph replays). On the CPU
    (``harness bench --generate --tiny``): the median of eager copies of a quarter as many bytes."""
    if torch.device(dev).type != "cuda":
        return _host_copy_bandwidth(nbytes // 4)
    x = torch.empty(nbytes // 4, dtype=torch.float32, device=dev).uniform_()
    y = torch.empty_like(x)
    return 2 * nbytes / time_graph(lambda: y.copy_(x), rep_ms)


def _host_copy_bandwidth(nbytes: int, reps: int = 7) -> float:
    import time

    x = torch.empty(nbytes // 4, dtype=torch.float32).uniform_()
    y = torch.empty_like(x)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        y.copy_(x)
        times.append(time.perf_counter() - t0)
    return 2 * nbytes / sorted(times)[reps // 2]


def sdpa(q, k, v, gqa: bool):
    """bf16 attention on the uncompressed cache, as the model would run it (GQA through enable_gqa)."""
    import torch.nn.functional as F

    return F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)


def sdpa_backend_fn(q, k, v, gqa):
    """SDPA restricted to the flash backend when it runs these inputs, else efficient; -> (fn, name)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    for backend, name in ((SDPBackend.FLASH_ATTENTION, "flash"), (SDPBackend.EFFICIENT_ATTENTION, "efficient")):
        try:
            with sdpa_kernel(backend):
                sdpa(q, k, v, gqa)
            torch.cuda.synchronize()
        except RuntimeError:
            continue

        def fn(backend=backend):
            with sdpa_kernel(backend):
                return sdpa(q, k, v, gqa)

        return fn, name
    return (lambda: sdpa(q, k, v, gqa)), "default"


def device_seconds(fn) -> tuple[float, int]:
    """(seconds of device work, kernels and copies) that ``fn()`` issues on CUDA, from torch.profiler.
    Against ``fn``'s unprofiled wall time it bounds what replaying its launches from a CUDA graph could
    save: the wall time less this is host time the device sat idle."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if getattr(e, "self_device_time_total", 0) > 0]
    return sum(e.self_device_time_total for e in events) / 1e6, sum(e.count for e in events)
