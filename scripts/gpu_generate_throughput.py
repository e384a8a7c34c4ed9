"""Decode tokens/s of ``model.generate`` through the compressed cache against the native cache.

    python scripts/gpu_generate_throughput.py                       # random Qwen2.5-7B shape, 32k context, CUDA
    python scripts/gpu_generate_throughput.py --batch 1,max         # also the largest batch the native cache fits
    python scripts/gpu_generate_throughput.py --tiny --device cpu   # a tiny model: checks the script runs

Random weights (no checkpoint needed): only the shapes matter for speed. Per cache (native, then
each codec@bits) and batch: one prefill of the context at batch 1 (``generate`` with one new
token), the cache repeated to the batch (every sequence the same: only the shapes matter), then
``generate`` of ``--new-tokens`` tokens from it. A logits processor timestamps each generated
token, so the decode rate excludes the prefill and the first decode step (which compiles what a
new batch size needs). ``--batch max`` = the largest batch whose native cache (context + new
tokens) fits the free device memory after the model, less ``--reserve-gib``.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from adapters.hf_cache import attach  # noqa: E402
from adapters.kv_cache import CacheConfig  # noqa: E402

QWEN25_7B = dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                 num_key_value_heads=4, vocab_size=152064, max_position_embeddings=131072, rope_theta=1e6)
TINY = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=1000, max_position_embeddings=4096)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


class StepClock:
    """A logits processor that timestamps every generated token (after a device sync)."""

    def __init__(self, device):
        self.device, self.times = device, []

    def __call__(self, input_ids, scores):
        sync(self.device)
        self.times.append(time.perf_counter())
        return scores


def generate(model, ids, cache, n_new, **kw):
    # an explicit all-ones mask: generate would otherwise infer padding from pad_token_id, masking
    # every random id that happens to equal it (and a masked step cannot take the fused kernel)
    return model.generate(ids, attention_mask=torch.ones_like(ids), past_key_values=cache, max_new_tokens=n_new,
                          min_new_tokens=n_new, do_sample=False, pad_token_id=0, **kw)


def timed_generate(model, ids, cache, n_new, device, steps: list | None = None):
    """-> (seconds to the first token, decode steps/s over the remaining tokens, output); ``steps``
    receives the duration of every token in seconds (the first: from the call)."""
    from transformers import LogitsProcessorList

    clock = StepClock(device)
    sync(device)
    t0 = time.perf_counter()
    out = generate(model, ids, cache, n_new, logits_processor=LogitsProcessorList([clock]))
    t = clock.times
    if steps is not None:
        steps[:] = [b - a for a, b in zip([t0] + t[:-1], t)]
    return t[0] - t0, (len(t) - 1) / max(t[-1] - t[0], 1e-9), out


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
    sync(device)
    t0 = time.perf_counter()
    out = generate(model, ids, cache, 1)
    sync(device)
    prefill_s = time.perf_counter() - t0
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


def cache_makers(specs: str, backends: str, new_cache):
    """[(label, backend, make_cache)]: native first, then each codec@bits per backend."""
    from transformers import DynamicCache

    runs = [("native", "-", DynamicCache)]
    for spec in specs.split(","):
        if not spec.strip():
            continue
        name, bits = spec.strip().split("@")
        for backend in backends.split(","):
            cc = CacheConfig(codec=name, bits=int(bits), backend=backend)
            runs.append((spec.strip(), backend, lambda cc=cc: new_cache(cc)))
    return runs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context", type=int, default=32768)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--codecs", default="octopus@3,octopus@2,turboquant-mse@3,kivi@2",
                    help="comma-separated codec@bits")
    ap.add_argument("--backends", default="auto", help="cache backends to time (auto = fused kernel on CUDA)")
    ap.add_argument("--batch", default="1", help="comma list of batch sizes; 'max' = the largest the native cache fits")
    ap.add_argument("--flow", choices=("split", "oneshot"), default="split",
                    help="split: prefill (batch 1), repeat, then time a second generate (its first step excluded); "
                         "oneshot: one generate from the bare context at batch 1 (the rate excludes the prefill "
                         "and its token only)")
    ap.add_argument("--reserve-gib", type=float, default=6.0, help="device memory left free by --batch max")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)

    device = torch.device(args.device)
    shape = TINY if args.tiny else QWEN25_7B
    context = min(args.context, 1024) if args.tiny else args.context
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    model = load_model(shape, device, dtype)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, shape["vocab_size"], (1, context), generator=g).to(device)  # 0 is the pad id
    if device.type == "cuda":
        print(f"device {torch.cuda.get_device_name(device)}", flush=True)
    batches = resolve_batches(args.batch, shape, context + args.new_tokens + 1, device, args.reserve_gib)
    results = []
    with torch.no_grad(), attach(model) as new_cache:
        runs = cache_makers(args.codecs, args.backends, new_cache)
        for label, backend, make in runs:  # warm-up: kernels compiled
            timed_generate(model, ids[:, :256], make(), 4, device)
        for batch in batches:
            if args.flow == "oneshot" and batch != 1:
                print(f"--flow oneshot times batch 1 only; batch {batch} skipped", flush=True)
                continue
            for label, backend, make in runs:
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                    torch.cuda.reset_peak_memory_stats()
                steps = []
                if args.flow == "oneshot":  # prefill and decode in one generate call, at batch 1
                    cache = make()
                    prefill_s, steps_s, _ = timed_generate(model, ids, cache, args.new_tokens, device, steps)
                    cont = None
                else:
                    cache, cont, prefill_s = prefilled(model, ids, make, batch, device)
                    _, steps_s, _ = timed_generate(model, cont, cache, args.new_tokens, device, steps)
                ms = sorted(x * 1e3 for x in steps[1:])
                row = {"cache": label, "backend": backend, "batch": batch, "context": context,
                       "new_tokens": args.new_tokens, "prefill_s": round(prefill_s, 3),
                       "decode_steps_s": round(steps_s, 2), "decode_tok_s": round(steps_s * batch, 1),
                       "step_ms_first": [round(x * 1e3, 1) for x in steps[1:4]],
                       "step_ms_median": round(ms[len(ms) // 2], 2) if ms else None,
                       "step_ms_max": round(ms[-1], 1) if ms else None,
                       "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if device.type == "cuda" else None}
                kv = getattr(cache, "kv", None)
                if kv is not None:
                    b = kv.nbytes()
                    row.update(cache_mib=round(b["total"] / 2**20, 1), native_mib=round(b["uncompressed"] / 2**20, 1))
                results.append(row)
                print(json.dumps(row), flush=True)
                del cache, cont
    print("\n| batch | cache | backend | decode tok/s | steps/s | vs native | cache MiB (native) | prefill s (B=1) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        base = next(x for x in results if x["batch"] == r["batch"] and x["cache"] == "native")["decode_steps_s"]
        print(f"| {r['batch']} | {r['cache']} | {r['backend']} | {r['decode_tok_s']} | {r['decode_steps_s']} | "
              f"{r['decode_steps_s'] / base:.2f}x | {r.get('cache_mib', '-')} ({r.get('native_mib', '-')}) | "
              f"{r['prefill_s']} |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
