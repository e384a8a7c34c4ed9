"""Throughput of the default text tasks at several batch sizes, same work, one process.

For each batch size: the task's baselines and every cache configuration of the default run
(``RunConfig()``: every codec at 2/3/4 bits, each codec seed), timed end to end through the
task's own batch methods, as the runner drives them (no report, no rows files). Prints a Markdown
table: seconds, prompt-configurations per second, speed-up over the first batch size, and the
largest difference of any row's headline metric from the first batch size's (rows do not depend
on the batch beyond float rounding).

    python -m scripts.text_batch_throughput --batch 1,8                 # CPU, SmolLM2
    python -m scripts.text_batch_throughput --batch 1,8,16 --device cuda \\
        --model-path DIR --random-weights                # DIR: config.json + tokenizer files only

``--random-weights``: the model is built from DIR's config.json with seeded random weights
(``adapters.loading.random_init_``): the same shapes, hence the same cost, where the weights
cannot be carried (a GPU machine without the GGUF).
"""
from __future__ import annotations

import argparse
import time

import torch


def load(args):
    from adapters.registry import get_model

    if not args.random_weights:
        return get_model(args.model).load(args.model_path, args.device, args.dtype)
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from adapters.hf.causal_lm import CausalLM
    from adapters.loading import NO_FOLDER_CODE, random_init_, resolve

    device, dtype = resolve(args.device, args.dtype)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(args.model_path, **NO_FOLDER_CODE), dtype=dtype)
    random_init_(model.to(device), "throughput")
    return CausalLM(model.eval(), AutoTokenizer.from_pretrained(args.model_path, **NO_FOLDER_CODE), "random", args.model_path)


def sync(model) -> None:
    if torch.device(model.device).type == "cuda":
        torch.cuda.synchronize()


def run(task, model, prompts, configs, seed: int) -> tuple[float, dict]:
    """(wall seconds, {(prompt id, label, codec seed): headline value}) of one pass."""
    rows = {}
    sync(model)
    t0 = time.perf_counter()
    for batch in task.batches(model, prompts):
        baselines = task.baseline_batch(model, batch, seed)
        for c in configs:
            for p, r in zip(batch, task.evaluate_batch(model, batch, c, seed, baselines, None)):
                rows[(p.id, c.label, c.seed)] = r[task.headline]
    sync(model)
    return time.perf_counter() - t0, rows


def main(argv=None) -> None:
    from harness.run.config import RunConfig, seeded
    from harness.tasks import get_task

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--model-path", default=None)
    ap.add_argument("--random-weights", action="store_true")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--tasks", default="perplexity", help="comma-separated text tasks (default: the default run's)")
    ap.add_argument("--batch", default="1,8", help="batch sizes, comma-separated")
    ap.add_argument("--limit", type=int, default=None, help="prompts per task (default: the task's)")
    ap.add_argument("--codec-seeds", default="0,1,2")
    args = ap.parse_args(argv)

    model = load(args)
    config = RunConfig(codec_seeds=[int(s) for s in args.codec_seeds.split(",")])
    configs = [c for cc in config.cache_configs() for c in seeded(cc, config.codec_seeds)]
    sizes = [int(b) for b in args.batch.split(",")]
    print(f"model {model.describe()}; {len(configs)} cache configurations; torch {torch.__version__}"
          + (f"; {torch.cuda.get_device_name()}" if torch.device(model.device).type == "cuda" else
             f"; {torch.get_num_threads()} CPU threads"))
    print("| task | batch | prompts | seconds | prompt-configs/s | speed-up | max abs diff of headline |")
    print("|---|---|---|---|---|---|---|")
    for name in args.tasks.split(","):
        task = get_task(name)()
        prompts = task.prompts(None, args.limit)
        task.batch_size = sizes[0]
        run(task, model, prompts[:1], configs[:2], 0)  # warm-up: kernels, tokenizer, codebooks
        first = None
        for bs in sizes:
            task.batch_size = bs
            secs, rows = run(task, model, prompts, configs, 0)
            first = first or (secs, rows)
            diff = max(abs(rows[k] - first[1][k]) for k in rows)
            n = len(prompts) * (len(configs) + 1)
            print(f"| {name} | {bs} | {len(prompts)} | {secs:.1f} | {n / secs:.2f} | {first[0] / secs:.2f}x | {diff:.2g} |",
                  flush=True)


if __name__ == "__main__":
    main()
