"""Decode tokens/s of ``model.generate`` through the compressed cache against the native cache.

    python scripts/gpu_generate_throughput.py                       # random Qwen2.5-7B shape, 32k context, CUDA
    python scripts/gpu_generate_throughput.py --tiny --device cpu   # a tiny model: checks the script runs

Random weights (no checkpoint needed): only the shapes matter for speed. A logits processor
timestamps each generated token, so the decode rate excludes the prefill and the first token.
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


def timed_generate(model, ids, cache, n_new, device):
    """-> (prefill seconds incl. the first token, decode tokens/s over the remaining tokens, output)."""
    from transformers import LogitsProcessorList

    clock = StepClock(device)
    sync(device)
    t0 = time.perf_counter()
    # an explicit all-ones mask: generate would otherwise infer padding from pad_token_id, masking
    # every random id that happens to equal it (and a masked step cannot take the fused kernel)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), past_key_values=cache, max_new_tokens=n_new,
                         min_new_tokens=n_new, do_sample=False, pad_token_id=0,
                         logits_processor=LogitsProcessorList([clock]))
    t = clock.times
    return t[0] - t0, (len(t) - 1) / max(t[-1] - t[0], 1e-9), out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context", type=int, default=32768)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--codecs", default="octopus@3,octopus@2,turboquant-mse@3,kivi@2",
                    help="comma-separated codec@bits")
    ap.add_argument("--backends", default="auto", help="cache backends to time (auto = fused kernel on CUDA)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)

    from transformers import AutoModelForCausalLM, Qwen2Config, DynamicCache

    device = torch.device(args.device)
    shape = TINY if args.tiny else QWEN25_7B
    context = min(args.context, 1024) if args.tiny else args.context
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    torch.manual_seed(0)
    cfg = Qwen2Config(**shape)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation="sdpa").eval()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, shape["vocab_size"], (1, context), generator=g).to(device)  # 0 is the pad id
    results = []
    with torch.no_grad():
        runs = [("native", None, None)]
        for spec in args.codecs.split(","):
            name, bits = spec.split("@")
            for backend in args.backends.split(","):
                runs.append((spec, CacheConfig(codec=name, bits=int(bits), backend=backend), backend))
        with attach(model) as new_cache:
            for label, cc, backend in runs:
                make = (lambda: DynamicCache()) if cc is None else (lambda cc=cc: new_cache(cc))
                timed_generate(model, ids[:, :256], make(), 4, device)  # warm-up: kernels compiled
                if device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats()
                cache = make()
                prefill_s, tok_s, out = timed_generate(model, ids, cache, args.new_tokens, device)
                row = {"cache": label, "backend": backend or "-", "context": context, "new_tokens": args.new_tokens,
                       "prefill_s": round(prefill_s, 3), "decode_tok_s": round(tok_s, 2),
                       "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if device.type == "cuda" else None}
                if cc is not None:
                    b = cache.kv.nbytes()
                    row.update(cache_mib=round(b["total"] / 2**20, 1), native_mib=round(b["uncompressed"] / 2**20, 1))
                results.append(row)
                print(json.dumps(row), flush=True)
    base = results[0]["decode_tok_s"]
    print(f"\n| cache | backend | decode tok/s | vs native | cache MiB (native) | prefill s |")
    print("|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['cache']} | {r['backend']} | {r['decode_tok_s']} | {r['decode_tok_s'] / base:.2f}x | "
              f"{r.get('cache_mib', '-')} ({r.get('native_mib', '-')}) | {r['prefill_s']} |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
