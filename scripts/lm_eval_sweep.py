"""lm-eval tasks through the compressed cache, one process, several codecs and bit widths.

  python scripts/lm_eval_sweep.py [--pretrained DIR] [--tasks kv_passage_mc kv_passage_gen]
      [--codecs octopus turboquant-mse kivi] [--bits 2 3 4] [--seeds 0 1 2] [--out reports/lm_eval_smollm2.md]

Each configuration is what ``harness lm-eval --model kvcodec --model_args pretrained=DIR,codec=C,bits=B
--tasks T --include_path prompts/lm_eval`` runs (run from the repository root: the task files name
their data by relative path); this script runs them in one process (one model load, one task index)
and writes the table of :mod:`harness.lm_eval_table`: the task metrics and their paired difference
from ``--model hf`` on the same checkpoint, the mean |Δ log-likelihood| and is_greedy / generation
agreement against it, each with its 95% interval over documents (x codec seeds: a randomized codec
runs once per ``--seeds`` value, ``codec_seed=S``), and the true bits per coordinate.
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path


def main() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    p = argparse.ArgumentParser()
    p.add_argument("--pretrained", default=None)
    p.add_argument("--tasks", nargs="+", default=["kv_passage_mc", "kv_passage_gen"])
    p.add_argument("--codecs", nargs="+", default=["octopus", "turboquant-mse", "kivi"])
    p.add_argument("--bits", nargs="+", type=int, default=[2, 3, 4])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2],
                   help="codec seeds (model_args codec_seed=); a codec without random draws runs at the first")
    p.add_argument("--extra", default="", help="more model_args, e.g. residual=16")
    p.add_argument("--out", type=Path, default=Path("reports/lm_eval_smollm2.md"))
    a = p.parse_args()
    from kernels import codec_class

    for c in a.codecs:
        try:
            codec_class(c)  # an unknown codec fails here, in one line, before lm-eval or a model loads
        except ValueError as e:
            p.error(str(e))
    if len(set(a.seeds)) != len(a.seeds):
        p.error(f"--seeds must be distinct, got {a.seeds}")

    import lm_eval
    from lm_eval.tasks import TaskManager

    import harness.lm_eval_model  # noqa: F401  (registers kvcodec)
    from adapters.cache_config import CacheConfig
    from adapters.model_store import prepared_smollm2
    from harness.config import seeded
    from harness.lm_eval_table import Row, Run, table, table_row

    ckpt = a.pretrained or str(prepared_smollm2())
    tm = TaskManager(include_path="prompts/lm_eval", include_defaults=False)

    def run(model: str, args: str, seed: int = 0) -> Run:
        t = time.time()
        r = lm_eval.simple_evaluate(model=model, model_args=args, tasks=a.tasks, batch_size=1, device="cpu",
                                    log_samples=True, task_manager=tm)
        return Run(seed, r, time.time() - t)

    ref = run("hf", f"pretrained={ckpt},dtype=float32")
    extra = f",{a.extra}" if a.extra else ""
    rows = []
    for codec, bits in [("none", None)] + [(c, b) for c in a.codecs for b in a.bits]:
        seeds = [c.seed for c in seeded(CacheConfig(codec=codec), a.seeds)]  # the harness's rule: once if not randomized
        args = f"pretrained={ckpt},dtype=float32,codec={codec}" + (f",bits={bits}" if bits else "") + extra
        rows.append(Row(codec + (f"@{bits}" if bits else ""),
                        tuple(run("kvcodec", f"{args},codec_seed={s}", s) for s in seeds)))
        print(table_row(rows[-1], ref, a.tasks), flush=True)
    lines = table(ref, rows, a.tasks)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(f"checkpoint: {ckpt}\n\n" + "\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
