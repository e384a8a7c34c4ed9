"""Where a decode step of ``model.generate`` through the compressed cache spends its time (GPU).

    python -m scripts.gpu_profile_generate [--layers 28] [--context 32768] [--codecs octopus@3,octopus@2]
    python -m scripts.gpu_profile_generate --graphs --commit both --codecs octopus@3,turboquant-mse@3,kivi@2,vllm-fp8@8

Random weights in Qwen2.5-7B's shape (``--layers`` of them); per cache (native first, then each
codec@bits): prefill at batch 1, repeat to ``--batch``, the first decode step after it under
torch.profiler, then ``--steps`` decode steps timed without the profiler (wall ms per step) and
again under torch.profiler. Prints, per cache: the
attention path 'auto' takes (and why the others were passed over), ms per step (wall, host
operators, device kernels), the synchronising calls per step, the operators by host time and the
kernels by device time.

``--graphs``: the graphed steps instead (adapters/hf/graphed_decode.py): wall ms per replayed step, the kernels
one step runs (the static steps run eagerly under the profiler), and the codec work alone (every codec layer's
window write and commit, :meth:`adapters.cache.static_kv.StaticKV.codec_work`, replayed from a graph of its
own) with its share of the step; ``--commit both`` profiles each codec with its fused commit (one launch a layer:
kernels/triton/commit.py) and with the sequence it replaces (the encoders and indexed writes), before and after.
"""
from __future__ import annotations

import argparse
import contextlib
import time
from pathlib import Path

import torch

from adapters.hf.attach import attach
from harness.bench import QWEN25_7B, cache_makers, greedy_generate, load_model, prefilled, timed_generate

#: host-device synchronisations (CUDA runtime calls; aten::item etc. name the operators that cause them)
SYNC_NAMES = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")
CAUSE_NAMES = ("aten::_local_scalar_dense", "aten::item", "aten::is_nonzero", "aten::nonzero")
LAUNCH_NAMES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx")


def attention_path(cache, q_heads: int, device) -> str:
    """The decode-attention decision for the first codec layer (str of kernels.backend.Decision)."""
    from kernels.attention import decide_attention

    kv = getattr(cache, "kv", None)
    layer = next((lay for lay in (kv.layers if kv is not None else []) if lay.codec is not None), None)
    if layer is None:
        return "native (the model's sdpa)"
    q = torch.zeros(1, q_heads, 1, layer.codec.head_dim, dtype=torch.bfloat16, device=device)
    return str(decide_attention(q, layer.codec, kv.num_kv_heads, layer.config.backend))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--context", type=int, default=32768)
    ap.add_argument("--codecs", default="octopus@3,octopus@2")
    ap.add_argument("--backends", default="auto")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--rows", type=int, default=20)
    ap.add_argument("--trace", type=Path, default=None, help="write a Chrome trace per cache into this folder")
    ap.add_argument("--graphs", action="store_true",
                    help="profile the graphed steps instead (adapters.hf.graphed_decode): wall ms per replay, and the "
                         "kernels a replay runs (the static steps run eagerly under the profiler)")
    ap.add_argument("--commit", choices=("fused", "sequence", "both"), default="fused",
                    help="with --graphs: the codec layers' commit as one fused launch (where the codec has one), as "
                         "the sequence of encoders and writes it replaces, or both, one after the other")
    a = ap.parse_args(argv)
    from torch.profiler import ProfilerActivity, profile

    dev = torch.device("cuda")
    shape = QWEN25_7B | {"num_hidden_layers": a.layers}
    model = load_model(shape, dev, torch.bfloat16)
    ids = torch.randint(1, shape["vocab_size"], (1, a.context), device=dev)  # 0 is the pad id
    print(f"device {torch.cuda.get_device_name(dev)}; {a.layers} layers, context {a.context}, batch {a.batch}, "
          f"{a.steps} steps", flush=True)
    summary = []
    with torch.no_grad(), attach(model) as new_cache:
        runs = cache_makers(a.codecs, a.backends, new_cache, graphs=a.graphs)
        for label, backend, make in runs:  # warm-up: kernels compiled
            greedy_generate(model, ids[:, :256], make(), 4)
        for label, backend, make in runs:
            torch.cuda.empty_cache()
            cache, cont, _ = prefilled(model, ids, make, a.batch, dev)
            path = attention_path(cache, shape["num_attention_heads"], dev)
            if a.graphs:
                modes = ("fused", "sequence") if a.commit == "both" else (a.commit,)
                for commit in ("-",) if label == "native" else modes:  # the same cache, a few steps on per mode
                    with commit_mode(commit):
                        print(f"\n===== {label} ({backend}), commit: {commit}; attention path {path}", flush=True)
                        summary.append((label, backend, commit, path,
                                        *graphed_profile(model, cache, cont, a.steps, a.rows)))
                del cache, cont
                continue
            # the first decode step after the prefill, alone
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof1:
                cont = greedy_generate(model, cont, cache, 1)
                torch.cuda.synchronize()
            first = (time.perf_counter() - t0) * 1e3
            k1 = prof1.key_averages()
            print(f"\n===== {label} ({backend}): the first decode step after the prefill, {first:.1f} ms (profiled)")
            print(k1.table(sort_by="cpu_time_total", row_limit=a.rows))
            # wall time per step, no profiler
            steps = []
            _, _, out = timed_generate(model, cont, cache, a.steps + 1, dev, steps)
            wall = sum(steps[1:]) * 1e3 / a.steps
            print(f"steps after it (ms): {[round(x * 1e3, 1) for x in steps]}")
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                greedy_generate(model, out, cache, a.steps)
                torch.cuda.synchronize()
            ka = prof.key_averages()
            host = sum(e.self_cpu_time_total for e in ka) / 1e3 / a.steps
            devt = sum(getattr(e, "self_device_time_total", 0) for e in ka) / 1e3 / a.steps
            per_step = {e.key: e.count / a.steps for e in ka if e.key in SYNC_NAMES + CAUSE_NAMES + LAUNCH_NAMES}
            syncs = sum(per_step.get(k, 0) for k in SYNC_NAMES)
            launches = sum(per_step.get(k, 0) for k in LAUNCH_NAMES)
            print(f"\n===== {label} ({backend}): attention path {path}")
            print(f"wall {wall:.2f} ms/step (no profiler); profiled: host ops {host:.2f} ms/step, device kernels "
                  f"{devt:.2f} ms/step; {syncs:.0f} syncs and {launches:.0f} kernel launches per step; "
                  f"per step: {per_step}", flush=True)
            print(ka.table(sort_by="self_cpu_time_total", row_limit=a.rows))
            print(ka.table(sort_by="self_device_time_total", row_limit=a.rows))
            if a.trace:
                a.trace.mkdir(parents=True, exist_ok=True)
                prof.export_chrome_trace(str(a.trace / f"trace_{label.replace('@', '_')}.json"))
            summary.append((label, backend, path, first, wall, host, devt, syncs, launches))
            del cache, cont, out
    if a.graphs:
        print("\n| cache | backend | commit | attention path | wall ms/replay | codec work ms/step | "
              "share of the step | device ms/step | kernels/step |")
        print("|---|---|---|---|---|---|---|---|---|")
        for label, backend, commit, path, wall, codec, devt, n in summary:
            print(f"| {label} | {backend} | {commit} | {path} | {wall:.2f} | {codec:.3f} | {codec / wall:.1%} | "
                  f"{devt:.2f} | {n:.0f} |")
        return 0
    print("\n| cache | backend | attention path | first step ms | wall ms/step | host ms/step | device ms/step | "
          "syncs/step | launches/step |")
    print("|---|---|---|---|---|---|---|---|---|")
    for label, backend, path, first, wall, host, devt, ns, nl in summary:
        print(f"| {label} | {backend} | {path} | {first:.1f} | {wall:.2f} | {host:.2f} | {devt:.2f} | {ns:.0f} | {nl:.0f} |")
    return 0


@contextlib.contextmanager
def commit_mode(commit: str):
    """'fused' (or '-': native): the codecs' own decision (kernels.base.Codec.fused_commit); 'sequence': no codec
    commits in one launch, so every static layer runs the sequence the fused commit replaces (the state before it)."""
    from kernels.base import Codec

    if commit != "sequence":
        yield
        return
    own = Codec.fused_commit
    Codec.fused_commit = lambda self, device: None
    try:
        yield
    finally:
        Codec.fused_commit = own


def codec_work_ms(model, cache, reps: int) -> float:
    """ms per step of every codec layer's window write and commit alone (StaticKV.codec_work), replayed from a
    CUDA graph over throwaway static buffers loaded from ``cache`` (which is left as it is)."""
    from adapters.hf.graphed_decode import _Graph, _need

    g = _Graph(model, cache, _need(cache, 1))
    kvs = [layer.kv for layer in cache.layers]
    coded = next((kv for kv in kvs if kv.codec is not None), None)
    if coded is None:
        return 0.0
    g.counters.load(coded.committed, kvs[0].columns, coded.seq_window[0])
    layers = []
    for kv, static in zip(kvs, g.statics):
        if kv.codec is not None:
            static.load(kv)
            layers.append((static, torch.randn_like(static.wk[:, :, :1]), torch.randn_like(static.wv[:, :, :1])))

    def work():
        for static, k, v in layers:
            static.codec_work(k, v)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # the warm-up (compiles, allocates), as a capture asks
        work()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        work()
    graph.replay()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        graph.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3 / reps


def graphed_profile(model, cache, cont, steps: int, rows: int) -> tuple[float, float, float, float]:
    """(wall ms per replayed step, ms per step of the codec work alone, device ms per step, kernels per step) of
    the graphed steps from ``cache``; prints the kernels by device time (the static steps run eagerly: the
    kernels a replay runs)."""
    from torch.profiler import ProfilerActivity, profile

    from adapters.hf.graphed_decode import GraphedDecode

    codec = codec_work_ms(model, cache, 20 * steps)
    ids = cont[:, -1].tolist()
    graph = GraphedDecode(model, cache, ids, steps + 2)
    graph.step(), graph.step()  # the warm-up and the capture
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        graph.step()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) * 1e3 / steps
    graph.close()
    static = GraphedDecode(model, cache, ids, steps + 1, capture=False)
    static.step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            static.step()
        torch.cuda.synchronize()
    static.close()
    ka = [e for e in prof.key_averages() if getattr(e, "self_device_time_total", 0) > 0]
    devt = sum(e.self_device_time_total for e in ka) / 1e3 / steps
    kernels = sum(e.count for e in ka) / steps
    print(f"graphed: {wall:.2f} ms per replayed step; the codec work alone {codec:.3f} ms ({codec / wall:.1%}); its "
          f"kernels {devt:.2f} ms of device time, {kernels:.0f} per step")
    for e in sorted(ka, key=lambda e: -e.self_device_time_total)[:rows]:
        print(f"  {e.self_device_time_total / 1e3 / steps:8.3f} ms  {e.count / steps:6.1f}x  {e.key[:110]}")
    return wall, codec, devt, kernels


if __name__ == "__main__":
    raise SystemExit(main())
