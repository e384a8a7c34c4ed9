"""Where a decode step of ``model.generate`` through the compressed cache spends its time (GPU).

    python scripts/gpu_profile_generate.py [--layers 4] [--context 8192] [--codec octopus@3]

Random weights in Qwen2.5-7B's per-layer shape; torch.profiler over a few decode steps; prints
the operators by host (self CPU) time and by device time, and the synchronising calls.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from adapters.hf_cache import attach  # noqa: E402
from adapters.kv_cache import CacheConfig  # noqa: E402
from scripts.gpu_generate_throughput import QWEN25_7B  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--codec", default="octopus@3")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rows", type=int, default=30)
    a = ap.parse_args()
    from torch.profiler import ProfilerActivity, profile
    from transformers import AutoModelForCausalLM, Qwen2Config

    dev = torch.device("cuda")
    cfg = Qwen2Config(**(QWEN25_7B | {"num_hidden_layers": a.layers}))
    torch.manual_seed(0)
    with dev:
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa").eval()
    ids = torch.randint(1, cfg.vocab_size, (1, a.context), device=dev)  # 0 is the pad id (see below)
    name, bits = a.codec.split("@")
    with torch.no_grad(), attach(model) as new_cache:
        for label, make in (("native", None), (a.codec, lambda: new_cache(CacheConfig(codec=name, bits=int(bits))))):
            kw = {} if make is None else {"past_key_values": make()}
            warm = ids[:, :512]
            model.generate(warm, attention_mask=torch.ones_like(warm), max_new_tokens=4, min_new_tokens=4,
                           do_sample=False, pad_token_id=0, **({} if make is None else {"past_key_values": make()}))
            cache = kw.get("past_key_values")
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=1, min_new_tokens=1,
                                 do_sample=False, pad_token_id=0, **kw)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                model.generate(out, attention_mask=torch.ones_like(out), max_new_tokens=a.steps,
                               min_new_tokens=a.steps, do_sample=False, pad_token_id=0,
                               **({} if cache is None else {"past_key_values": cache}))
                torch.cuda.synchronize()
            ka = prof.key_averages()
            tot_cpu = sum(e.self_cpu_time_total for e in ka) / 1e3
            tot_dev = sum(getattr(e, "self_device_time_total", 0) for e in ka) / 1e3
            print(f"\n===== {label}: {a.steps} steps x {a.layers} layers; "
                  f"host {tot_cpu:.1f} ms, device {tot_dev:.1f} ms")
            print(ka.table(sort_by="self_cpu_time_total", row_limit=a.rows))
            print(ka.table(sort_by="self_device_time_total", row_limit=12))
            sync_names = ("Synchronize", "_local_scalar_dense", "item", "nonzero")
            syncs = [e for e in ka if any(s in e.key for s in sync_names)]
            for e in syncs:
                print(f"sync-ish: {e.key} x{e.count}, {e.self_cpu_time_total / 1e3:.2f} ms self CPU")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
