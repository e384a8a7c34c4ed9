#!/usr/bin/env python
"""The memory plan (harness.run.memory) beside a run's measured peak, on a GPU: a needle run (one prompt per
context, as ``harness run --model hf --task needle --task-opt needle.contexts=N --task-opt needle.depths=0.5
--codec octopus --bits 2 --codec-seeds 0`` runs it) through the real runner, on a decoder of a given shape
at seeded random weights (no checkpoint: the byte tokenizer, the shape's own vocabulary).

    python -m scripts.memory_plan_bench --contexts 131072,262144,524288,1048000
    python -m scripts.memory_plan_bench --contexts 65536 --prefill-chunk 4096 --codec kivi --bits 2
    python -m scripts.memory_plan_bench --config /ckpt/config.json --contexts 32768 --json out.json

The measured peak is ``torch.cuda.max_memory_allocated`` over the whole run, weights included (each rollout's
clock resets the counter: the peak before each reset is kept). The plan counts the same tensors; CUDA's own
context and the allocator's caching are outside both. A benchmark that prints, not a test: the plan is meant
to be within 10 % of the measured peak.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

#: Qwen2.5-7B-Instruct-1M's shape (its config.json's sizes)
QWEN_7B = {"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
           "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064, "tie_word_embeddings": False,
           "max_position_embeddings": 1_048_576, "rope_theta": 10_000_000.0, "rms_norm_eps": 1e-5}


def random_lm(config: dict, dtype: torch.dtype, device: str):
    """A CausalLM of ``config``'s shape with seeded random weights, built on ``device``, and the byte tokenizer."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from adapters.byte_tokenizer import byte_tokenizer
    from adapters.hf.causal_lm import CausalLM

    cfg = AutoConfig.for_model(**{**config, "eos_token_id": 256, "pad_token_id": 256, "bos_token_id": None})
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype).eval()
    model.generation_config.eos_token_id = model.generation_config.pad_token_id = 256
    return CausalLM(model, byte_tokenizer(), "hf", "(random weights)")


class PeakMeter:
    """The run's peak allocated bytes, by stretch: up to the shared prefill's end, then each rollout's (the
    rollout clocks reset the counter as each timed rollout starts: the peak before each reset is kept).
    None on the CPU."""

    def __init__(self, device: str, lm):
        self.cuda = device.startswith("cuda")
        self.lm = lm
        self.peaks: list[int] = []
        self._reset = torch.cuda.reset_peak_memory_stats

    def mark(self) -> None:
        self.peaks.append(torch.cuda.max_memory_allocated())
        self._reset()

    def __enter__(self):
        if not self.cuda:
            return self

        def keep_then_reset(device=None):
            self.mark()

        shared, get = self.lm._shared, self.lm._shared.get

        def marked_get(key, compute, devices):
            value, step = get(key, compute, devices)
            if step.fresh:
                self.mark()  # the prefill's stretch ends
            return value, step

        torch.cuda.reset_peak_memory_stats = keep_then_reset
        shared.get = marked_get
        self._reset()
        return self

    def __exit__(self, *exc):
        if self.cuda:
            self.peaks.append(torch.cuda.max_memory_allocated())
            torch.cuda.reset_peak_memory_stats = self._reset
            del self.lm._shared.get

    @property
    def peak(self) -> int | None:
        return max(self.peaks) if self.peaks else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--contexts", default="131072", help="needle contexts in tokens (comma list), one run each")
    ap.add_argument("--config", help="a config.json giving the shape (default: Qwen2.5-7B's)")
    ap.add_argument("--codec", default="octopus")
    ap.add_argument("--bits", type=int, default=2)
    ap.add_argument("--prefill-chunk", default="auto")
    ap.add_argument("--batch-size", type=int, default=None)
    ap.add_argument("--device", default="cuda", help="cuda (measured) or cpu (the plan alone: a smoke test)")
    ap.add_argument("--json", help="also write the results here")
    a = ap.parse_args(argv)
    from harness.run.config import RunConfig
    from harness.run.memory import GIB
    from harness.run.memory_check import RunPlan, task_shapes
    from harness.runner import plan as run_plan
    from harness.runner import run

    config = json.loads(Path(a.config).read_text()) if a.config else QWEN_7B
    dtype = torch.bfloat16 if a.device.startswith("cuda") else torch.float32
    lm = random_lm(config, dtype, a.device)
    chunk = a.prefill_chunk if a.prefill_chunk == "auto" else int(a.prefill_chunk)
    results = []
    print(f"{'context':>9} {'chunk':>7} {'plan GiB':>9} {'measured GiB':>13} {'plan/measured':>14}  peak moment")
    for ctx in (int(c) for c in a.contexts.split(",")):
        cfg = RunConfig(model="hf", model_path="(random)", tasks=["needle"], codecs=[a.codec], bits=[a.bits],
                        codec_seeds=[0], task_options={"needle": {"contexts": [ctx], "depths": [0.5]}},
                        prefill_chunk=chunk, batch_size=a.batch_size, device=a.device)
        lines: list[str] = []
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory() as out, PeakMeter(a.device, lm) as meter:
            run(cfg, out=Path(out) / "run", model=lm, progress=False, log=lines.append)
        shapes = [s for s in task_shapes(cfg, run_plan(cfg, print), a.device) if s]
        planned, _ = RunPlan(cfg, shapes, lm.model.config.to_dict(), a.device).worst(lm.prefill_chunk)
        r = {"context": ctx, "chunk": lm.prefill_chunk, "plan_bytes": planned.peak, "moment": planned.peak_moment,
             "items": planned.items, "moments": planned.moments, "measured_bytes": meter.peak,
             "seconds": round(time.perf_counter() - t0, 1), "log": [x for x in lines if x.startswith(("memory", "  "))]}
        results.append(r)
        measured = (f"{meter.peak / GIB:>13.1f} {planned.peak / meter.peak:>14.3f}" if meter.peak
                    else f"{'-':>13} {'-':>14}")
        print(f"{ctx:>9} {str(r['chunk']):>7} {planned.peak / GIB:>9.1f} {measured}  {planned.peak_moment}", flush=True)
        # the stretches measured: the prefill, the baseline's rollout, then each configuration's (codec 'none' first)
        stretches = ["prefill", "baseline rollout", "none rollout"] + [m for m in planned.moments if m.endswith(
            "rollout") and m != "baseline rollout"]
        r["measured_by_stretch"] = dict(zip(stretches, meter.peaks))
        for name, n in planned.moments.items():
            got = r["measured_by_stretch"].get(name)
            print(f"{'':>12}{name}: plan {n / GIB:.1f} GiB" + (f", measured {got / GIB:.1f} GiB" if got else ""))
        if "none rollout" in r["measured_by_stretch"]:
            print(f"{'':>12}none rollout: measured {r['measured_by_stretch']['none rollout'] / GIB:.1f} GiB")
        if meter.cuda:
            torch.cuda.empty_cache()
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
