"""``harness bench --generate``: decode tokens/s through each compressed cache against the native
cache, beside the memory roofline. On CUDA the steps are replayed from a CUDA graph
(:mod:`adapters.hf.graphed_decode`) where the cache allows, as the harness's rollouts run them; the row's
``decode`` says 'graphed' or why they ran eagerly (``--graphs off``: ``model.generate``'s eager steps;
``--graphs generate``: ``model.generate`` with its decode steps replayed,
:class:`adapters.hf.graphed_decode.GraphedForward`).

    harness bench --generate                                   # random Qwen2.5-7B shape, 32k context, CUDA
    harness bench --generate --contexts 32k,128k --batches 1,max
    harness bench --generate --tiny --device cpu               # a tiny model: checks it runs

Random weights (no checkpoint needed): only the shapes matter for speed. Per context, batch and
cache (native, then each codec@bits per backend): one prefill of the context at batch 1
(``generate`` with one new token), the cache repeated to the batch (every sequence the same: only
the shapes matter), then ``generate`` of ``--new-tokens`` tokens from it. A logits processor reads
the clock at every generated token (after a device sync), so the decode rate excludes the prefill
and the first decode step (which compiles what a new batch size needs). ``--batches max`` = the
largest batch whose native cache (context + new tokens) fits the free device memory after the
model, less ``--reserve-gib``.

The roofline: a decode step reads every weight it uses once and every sequence's cache once, so
it takes at least (weight bytes + cache bytes) / copy bandwidth, and
``roofline tok/s = batch x copy bandwidth / (weight bytes + cache bytes per step)``. Weight bytes
leave out an input embedding the output does not share (a lookup reads B of its rows); cache bytes
per step are those the cache holds after the last step (what that step read: codec states, native
window and layers); the copy bandwidth is a device-to-device copy of a large tensor measured in the
same process (bytes read + written per second, :func:`harness.bench.timing.copy_bandwidth`).
"""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch

from adapters.hf.compat import cache_kwargs
from adapters.cache.rollout_clock import wall

from harness.bench.inputs import parse_ctx
from harness.bench.timing import copy_bandwidth

QWEN25_7B = dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                 num_key_value_heads=4, vocab_size=152064, max_position_embeddings=131072, rope_theta=1e6)
TINY = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=1000, max_position_embeddings=4096)
TINY_MAX_CONTEXT = 1024  # --tiny: contexts are cut to this
HEADER = ("ctx", "B", "cache", "backend", "steps", "decode tok/s", "vs native", "cache MiB", "native MiB",
          "roofline tok/s", "of roofline", "prefill s", "peak GiB")


class StepClock:
    """A logits processor that reads the clock at every generated token (after a device sync)."""

    def __init__(self, device):
        self.devices, self.times = [torch.device(device)], []

    def __call__(self, input_ids, scores):
        self.times.append(wall(self.devices))
        return scores


def greedy_generate(model, ids, cache, n_new, **kw):
    """``model.generate`` of exactly ``n_new`` greedy tokens after ``ids`` [B, T] through ``cache``."""
    # an explicit all-ones mask: generate would otherwise infer padding from pad_token_id, masking
    # every random id that happens to equal it (and a masked step cannot take the fused kernel)
    return model.generate(ids, attention_mask=torch.ones_like(ids), **cache_kwargs(model, cache), max_new_tokens=n_new,
                          min_new_tokens=n_new, do_sample=False, pad_token_id=0, **kw)


def timed_generate(model, ids, cache, n_new, device, steps: list | None = None):
    """-> (seconds to the first token, decode steps/s over the remaining tokens, output); ``steps``
    receives the duration of every token in seconds (the first: from the call)."""
    from transformers import LogitsProcessorList

    clock = StepClock(device)
    t0 = wall(clock.devices)
    out = greedy_generate(model, ids, cache, n_new, logits_processor=LogitsProcessorList([clock]))
    t = clock.times
    if steps is not None:
        steps[:] = [b - a for a, b in zip([t0] + t[:-1], t)]
    return t[0] - t0, (len(t) - 1) / max(t[-1] - t[0], 1e-9), out


def timed_graphed(model, cache, first: list[int], n_new: int, device, steps: list | None = None):
    """The decode of ``timed_generate`` through :class:`adapters.hf.graphed_decode.GraphedDecode`: ``first``
    the B tokens after the prefill, then ``n_new - 1`` steps (the first eager, the second captured,
    the rest replays). -> (decode steps/s over the replays, the tokens [B, n_new]); ``steps``
    receives each step's seconds."""
    from adapters.hf.graphed_decode import GraphedDecode

    graph = GraphedDecode(model, cache, first, n_new - 1)
    t, tokens = [wall([device])], [torch.tensor(first, device=device)]
    try:
        for _ in range(n_new - 1):
            graph.step()
            tokens.append(graph.ids[:, 0].clone())
            t.append(wall([device]))
    finally:
        graph.close()
    if steps is not None:
        steps[:] = [b - a for a, b in zip(t, t[1:])]
    replays = t[3:] if len(t) > 3 else t[-2:]
    return (len(replays) - 1) / max(replays[-1] - replays[0], 1e-9), torch.stack(tokens, 1)


def repeat_batch(cache, batch: int) -> None:
    """Repeat a batch-1 cache (native ``DynamicCache`` or ``CompressedCache``) to ``batch`` sequences."""
    if batch == 1:
        return
    if getattr(cache, "kv", None) is None:  # a transformers cache
        cache.batch_repeat_interleave(batch)
        return
    cache.repeat_batch(batch)  # CompressedCache: its codec layers and its native sliding-window layers


def prefilled(model, ids, make_cache, batch: int, device):
    """A cache holding ``ids`` (prefilled at batch 1, then repeated) and the ids to continue from
    (the context plus its first generated token, per sequence). -> (cache, ids, prefill seconds)."""
    cache = make_cache()
    t0 = wall([device])
    out = greedy_generate(model, ids, cache, 1)
    prefill_s = wall([device]) - t0
    repeat_batch(cache, batch)
    return cache, out.repeat(batch, 1), prefill_s


def native_bytes_per_sequence(shape: dict, tokens: int, elem: int = 2) -> int:
    head_dim = shape["hidden_size"] // shape["num_attention_heads"]
    return shape["num_hidden_layers"] * 2 * shape["num_key_value_heads"] * head_dim * elem * tokens


def resolve_batches(spec: str, shape: dict, tokens: int, device, reserve_gib: float) -> list[int]:
    """'1,max' -> [1, the largest batch whose native cache of ``tokens`` fits the free memory]."""
    out = []
    for s in spec.split(","):
        s = s.strip()
        if s == "max":
            free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else 8 << 30
            per = native_bytes_per_sequence(shape, tokens)
            out.append(max(1, int((free - reserve_gib * 2**30) // per)))
        elif s:
            out.append(int(s))
    return list(dict.fromkeys(out))


def load_model(shape: dict, device, dtype):
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(0)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(Qwen2Config(**shape), dtype=dtype, attn_implementation="sdpa").eval()


def parse_codecs(specs: str) -> list[tuple[str, str, int]]:
    """'octopus@3,kivi@2' -> [(label, codec, bits)]."""
    out = []
    for spec in (s.strip() for s in specs.split(",") if s.strip()):
        name, sep, bits = spec.partition("@")
        if not sep or not bits.isdigit():
            raise ValueError(f"--codecs takes codec@bits items (e.g. octopus@3), got '{spec}'")
        out.append((spec, name, int(bits)))
    return out


def cache_makers(specs: str, backends: str, new_cache, graphs: bool = False):
    """[(label, backend, make_cache)]: native first (a DynamicCache; with ``graphs`` codec 'none', which
    graphed steps need), then each codec@bits per backend."""
    from transformers import DynamicCache

    from adapters.cache.config import CacheConfig

    runs = [("native", "-", (lambda: new_cache(CacheConfig())) if graphs else DynamicCache)]
    for label, name, bits in parse_codecs(specs):
        for backend in backends.split(","):
            cc = CacheConfig(codec=name, bits=bits, backend=backend)
            runs.append((label, backend, lambda cc=cc: new_cache(cc)))
    return runs


# --- what a step reads --------------------------------------------------------------------------
def weight_bytes(model) -> int:
    """Bytes of the weights a decode step reads: every parameter, less an input embedding that the
    output projection does not share (a lookup reads one row per sequence of it)."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    emb, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    return total if emb is head else total - emb.numel() * emb.element_size()


def cache_bytes(cache) -> tuple[int, int]:
    """(bytes the cache holds, bytes a native cache of the same tokens holds) over the whole batch."""
    kv = getattr(cache, "kv", None)
    if kv is not None:
        b = kv.nbytes()
        return b["total"], b["uncompressed"]
    n = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
    return n, n


def roofline_tok_s(batch: int, bandwidth: float, weights: int, cache: int) -> float:
    """batch x copy bandwidth / (weight bytes + cache bytes per step): the memory-bound decode rate."""
    return batch * bandwidth / (weights + cache)


# --- the benchmark ---------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="harness bench --generate", description=__doc__.splitlines()[0])
    p.add_argument("--contexts", "--context", default="32k", help="comma list of context tokens, e.g. 32k,128k")
    p.add_argument("--batches", "--batch", default="1",
                   help="comma list of batch sizes; 'max' = the largest the native cache fits")
    p.add_argument("--codecs", default="octopus@3,octopus@2,turboquant-mse@3,kivi@2", help="comma-separated codec@bits")
    p.add_argument("--backends", default="auto", help="cache backends to time (auto = fused kernel on CUDA)")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--reserve-gib", type=float, default=6.0, help="device memory left free by --batches max")
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true", help=f"a tiny random model, contexts cut to {TINY_MAX_CONTEXT} "
                                                        f"(checks the benchmark runs, e.g. on a CPU)")
    p.add_argument("--graphs", choices=("auto", "generate", "off"), default="auto",
                   help="auto: on CUDA, decode steps replayed from a CUDA graph (adapters.hf.graphed_decode) where "
                        "the cache allows; generate: model.generate, its decode steps replayed likewise; "
                        "off: model.generate's eager steps")
    p.add_argument("--json", type=Path, default=None, help="also write the rows as JSON here")
    return p


def run(args) -> dict:
    """-> {device, copy_bandwidth_Bps, weight_bytes, rows: one dict per (context, batch, cache)}."""
    from adapters.hf.attach import attach

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("harness bench --generate: no CUDA device here; pass --device cpu (with --tiny)")
    shape = TINY if args.tiny else QWEN25_7B
    contexts = [parse_ctx(c) for c in args.contexts.split(",") if c.strip()]
    contexts = list(dict.fromkeys(min(c, TINY_MAX_CONTEXT) if args.tiny else c for c in contexts))
    if not contexts or min(contexts) < 1 or args.new_tokens < 2:
        raise ValueError("harness bench --generate: give contexts >= 1 token and --new-tokens >= 2 (the first "
                         "decode step is not timed)")
    parse_codecs(args.codecs)  # a malformed list is refused before the model loads
    model = load_model(shape, device, torch.float32 if device.type == "cpu" else torch.bfloat16)
    result = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "copy_bandwidth_Bps": copy_bandwidth(device), "weight_bytes": weight_bytes(model),
              "shape": "tiny" if args.tiny else "qwen2.5-7b", "rows": []}
    print(f"device {result['device']}: copy bandwidth {result['copy_bandwidth_Bps'] / 1e9:.1f} GB/s (read + write); "
          f"weights read per step {result['weight_bytes'] / 2**30:.3f} GiB", flush=True)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, shape["vocab_size"], (1, max(contexts)), generator=g).to(device)  # 0 is the pad id
    with torch.no_grad(), attach(model) as new_cache:
        graphs = args.graphs if device.type == "cuda" else "off"
        runs = cache_makers(args.codecs, args.backends, new_cache, graphs != "off")
        for _, _, make in runs:  # warm-up: kernels compiled
            timed_generate(model, ids[:, :min(256, max(contexts))], make(), 4, device)
        for context in contexts:
            for batch in resolve_batches(args.batches, shape, context + args.new_tokens + 1, device, args.reserve_gib):
                for label, backend, make in runs:
                    row = decode_row(model, ids[:, :context], make, batch, args.new_tokens, device, result, graphs)
                    row.update(cache=label, backend=backend)
                    result["rows"].append(row)
                    print(json.dumps(row), flush=True)
    for r in result["rows"]:
        native = next(x for x in result["rows"] if (x["context"], x["batch"], x["cache"]) ==
                      (r["context"], r["batch"], "native"))
        r["vs_native"] = r["decode_tok_s"] / native["decode_tok_s"]
    return result


def decode_row(model, ids, make, batch: int, new_tokens: int, device, result: dict, graphs: str = "off") -> dict:
    """One (context, batch, cache): prefill, repeat, time the decode (graphed where ``graphs`` ('auto'
    or 'generate', ``--graphs``) and the cache allows: the row's 'decode' says which); its cache and roofline."""
    from adapters.hf.graphed_decode import GraphedForward, why_not

    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    cache, cont, prefill_s = prefilled(model, ids, make, batch, device)
    steps: list[float] = []
    why = why_not(model, cache, new_tokens - 1) if graphs != "off" else "--graphs off"
    if why is None and graphs == "auto":
        steps_s, _ = timed_graphed(model, cache, cont[:, -1].tolist(), new_tokens, device, steps)
    elif why is None:  # model.generate: every call feeds one token (the warm-up, the capture, then replays)
        with GraphedForward(model, cache, new_tokens) as fw:
            timed_generate(model, cont, cache, new_tokens, device, steps)
        replays = steps[2:]
        steps_s = len(replays) / max(sum(replays), 1e-9)
        if fw.replayed < new_tokens:  # generate's steps did not all come from the graph: say so
            why = f"{fw.replayed} of generate's {fw.calls} steps graphed"
    else:
        _, steps_s, _ = timed_generate(model, cont, cache, new_tokens, device, steps)
    held, native = cache_bytes(cache)
    ms = sorted(x * 1e3 for x in steps[2 if why is None else 1:])  # graphed: not the warm-up and the capture
    label = {"auto": "graphed", "generate": "graphed generate"}.get(graphs)
    return {"context": ids.shape[1], "batch": batch, "new_tokens": new_tokens, "prefill_s": prefill_s,
            "decode": label if why is None else f"eager ({why})",
            "decode_steps_s": steps_s, "decode_tok_s": steps_s * batch, "step_ms_median": ms[len(ms) // 2],
            "step_ms_max": ms[-1], "cache_bytes": held, "native_bytes": native,
            "roofline_tok_s": roofline_tok_s(batch, result["copy_bandwidth_Bps"], result["weight_bytes"], held),
            "peak_bytes": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None}


def table(result: dict) -> list[str]:
    """The Markdown table: one line per (context, batch, cache)."""
    md = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for r in result["rows"]:
        peak = "-" if r["peak_bytes"] is None else f"{r['peak_bytes'] / 2**30:.2f}"
        cells = [str(r["context"]), str(r["batch"]), r["cache"], r["backend"], r.get("decode", "eager").split(" ")[0],
                 f"{r['decode_tok_s']:.4g}",
                 f"{r['vs_native']:.2f}x", f"{r['cache_bytes'] / 2**20:.2f}", f"{r['native_bytes'] / 2**20:.2f}",
                 f"{r['roofline_tok_s']:.4g}", f"{r['decode_tok_s'] / r['roofline_tok_s']:.3f}",
                 f"{r['prefill_s']:.3f}", peak]
        md.append("| " + " | ".join(cells) + " |")
    return md


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    t0 = time.perf_counter()
    result = run(args)
    bad = [r for r in result["rows"] for k in ("decode_tok_s", "roofline_tok_s", "prefill_s")
           if not (math.isfinite(r[k]) and r[k] > 0)]
    print("\n" + "\n".join(table(result)))
    print(f"\n{len(result['rows'])} rows in {time.perf_counter() - t0:.1f} s; roofline tok/s = batch x copy "
          f"bandwidth / (weight bytes + cache bytes per step); 'of roofline' = decode tok/s / roofline tok/s")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
        print(f"wrote {args.json}")
    return 1 if bad else 0
