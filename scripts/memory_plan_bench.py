#!/usr/bin/env python
"""The memory plan (harness.run.memory) beside a run's measured peak, on a GPU, and the run's wall time split: a
needle run (one prompt per context, as ``harness run --model hf --task needle --task-opt needle.contexts=N
--task-opt needle.depths=0.5 --codec octopus turboquant-mse --bits 2 --codec-seeds 0`` runs it) through the real
runner, every codec in one process, on a decoder of a given shape at seeded random weights (no checkpoint: the
byte tokenizer, the shape's own vocabulary).

    python -m scripts.memory_plan_bench --contexts 1048000 --codec octopus turboquant-mse vllm-fp8@8 --bits 2
    python -m scripts.memory_plan_bench --contexts 65536 --prefill-chunk 4096 --codec kivi --bits 2
    python -m scripts.memory_plan_bench --config /ckpt/config.json --contexts 32768 --json out.json

Per configuration (the baseline 'none' first) it prints the plan's moment, the measured peak of its rollout
(speed.jsonl's ``peak_bytes``) and the wall split speed.jsonl records: the shared native forward (the prefill,
computed once per batch: the same seconds in every row), the configuration's own replay and encode of it
(``prefill_s``), graph capture (``capture_s``, once per process and batch shape) and the decode (``decode_s``,
its tokens per second); the baseline's own rollout (not timed: rows compare against it) is in the total only.

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


def wall_split(speed: list[dict]) -> dict:
    """speed.jsonl's records -> {'shared_forward_s': the batch's native forward (once), 'configs': {label: {replay_
    encode_s, capture_s, decode_s, decode_per_s, peak_bytes}}}: each configuration's first row (a batch's rows
    share their rollout's record; one prompt per context here)."""
    shared = next((r["shared_forward_s"] for r in speed if r.get("shared_forward_s") is not None), None)
    configs = {}
    for r in speed:
        configs.setdefault(r["label"], {"replay_encode_s": r.get("prefill_s"), "capture_s": r.get("capture_s"),
                                        "decode_s": r.get("decode_s"), "decode_per_s": r.get("decode_per_s"),
                                        "peak_bytes": r.get("peak_bytes")})
    return {"shared_forward_s": shared, "configs": configs}


def _s(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--contexts", default="131072", help="needle contexts in tokens (comma list), one run each")
    ap.add_argument("--config", help="a config.json giving the shape (default: Qwen2.5-7B's)")
    ap.add_argument("--codec", nargs="+", default=["octopus"], help="codecs, as harness run's --codec takes them")
    ap.add_argument("--bits", nargs="+", type=int, default=[2])
    ap.add_argument("--prefill-chunk", default="auto")
    ap.add_argument("--batch-size", type=int, default=None)
    ap.add_argument("--device", default="cuda", help="cuda (measured) or cpu (the plan and the wall split: a smoke test)")
    ap.add_argument("--json", help="also write the results here")
    a = ap.parse_args(argv)
    from harness.run.config import RunConfig
    from harness.run.memory import GIB
    from harness.run.memory_check import RunPlan, task_shapes
    from harness.run.rows import read_rows
    from harness.runner import plan as run_plan
    from harness.runner import run

    config = json.loads(Path(a.config).read_text()) if a.config else QWEN_7B
    dtype = torch.bfloat16 if a.device.startswith("cuda") else torch.float32
    lm = random_lm(config, dtype, a.device)
    chunk = a.prefill_chunk if a.prefill_chunk == "auto" else int(a.prefill_chunk)
    results = []
    for ctx in (int(c) for c in a.contexts.split(",")):
        cfg = RunConfig(model="hf", model_path="(random)", tasks=["needle"], codecs=list(a.codec), bits=list(a.bits),
                        codec_seeds=[0], task_options={"needle": {"contexts": [ctx], "depths": [0.5]}},
                        prefill_chunk=chunk, batch_size=a.batch_size, device=a.device)
        lines: list[str] = []
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory() as out, PeakMeter(a.device, lm) as meter:
            folder = run(cfg, out=Path(out) / "run", model=lm, progress=False, log=lines.append)
            split = wall_split(read_rows(folder / "speed.jsonl"))
        total = time.perf_counter() - t0
        shapes = [s for s in task_shapes(cfg, run_plan(cfg, lambda *_: None), a.device) if s]
        planned, _ = RunPlan(cfg, shapes, lm.model.config.to_dict(), a.device).worst(lm.prefill_chunk)
        r = {"context": ctx, "chunk": lm.prefill_chunk, "plan_bytes": planned.peak, "moment": planned.peak_moment,
             "items": planned.items, "moments": planned.moments, "measured_bytes": meter.peak,
             "measured_stretches": meter.peaks, "seconds": round(total, 1), **split,
             "log": [x for x in lines if x.startswith(("memory", "  "))]}
        results.append(r)
        measured = f"{meter.peak / GIB:.1f} GiB (plan/measured {planned.peak / meter.peak:.3f})" if meter.peak else "-"
        print(f"context {ctx:,}, prefill chunk {r['chunk']}: plan {planned.peak / GIB:.1f} GiB at "
              f"{planned.peak_moment}, measured {measured}; {total:.1f} s in all; shared native forward "
              f"{_s(split['shared_forward_s'])} s (once per batch)", flush=True)
        print(f"  {'config':<22} {'plan GiB':>9} {'peak GiB':>9} {'replay+encode s':>16} {'capture s':>10} "
              f"{'decode s':>9} {'tokens/s':>9}")
        print(f"  {'(shared prefill)':<22} {planned.moments['prefill'] / GIB:>9.2f} "
              f"{(f'{meter.peaks[0] / GIB:.2f}' if meter.peaks else '-'):>9}")
        for label, c in split["configs"].items():
            moment = planned.moments.get(f"{label} rollout", planned.moments["baseline rollout"])
            peak = "-" if c["peak_bytes"] is None else f"{c['peak_bytes'] / GIB:.2f}"
            print(f"  {label:<22} {moment / GIB:>9.2f} {peak:>9} {_s(c['replay_encode_s']):>16} "
                  f"{_s(c['capture_s']):>10} {_s(c['decode_s']):>9} {_s(c['decode_per_s']):>9}", flush=True)
        if meter.cuda:
            torch.cuda.empty_cache()
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
