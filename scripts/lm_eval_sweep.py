"""lm-eval tasks through the compressed cache, one process, several codecs and bit widths.

  python scripts/lm_eval_sweep.py [--pretrained DIR] [--tasks kv_passage_mc kv_passage_gen]
      [--codecs octopus turboquant-mse kivi] [--bits 2 3 4] [--out reports/lm_eval_smollm2.md]

Each configuration is what ``harness lm-eval --model kvcodec --model_args pretrained=DIR,codec=C,bits=B
--tasks T --include_path prompts/lm_eval`` runs (run from the repository root: the task files name
their data by relative path); this script runs them in one process (one model load, one task index)
and writes a table: the task metrics, the mean |Δ log-likelihood| and is_greedy / generation
agreement against ``--model hf`` on the same checkpoint, and the true bits per coordinate.
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path


def main() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    import lm_eval
    from lm_eval.tasks import TaskManager

    import harness.lm_eval_model  # noqa: F401  (registers kvcodec)
    from adapters.model_store import prepared_smollm2

    p = argparse.ArgumentParser()
    p.add_argument("--pretrained", default=None)
    p.add_argument("--tasks", nargs="+", default=["kv_passage_mc", "kv_passage_gen"])
    p.add_argument("--codecs", nargs="+", default=["octopus", "turboquant-mse", "kivi"])
    p.add_argument("--bits", nargs="+", type=int, default=[2, 3, 4])
    p.add_argument("--extra", default="", help="more model_args, e.g. residual=16")
    p.add_argument("--out", type=Path, default=Path("reports/lm_eval_smollm2.md"))
    a = p.parse_args()
    ckpt = a.pretrained or str(prepared_smollm2())
    tm = TaskManager(include_path="prompts/lm_eval", include_defaults=False)

    def run(model: str, args: str) -> tuple[dict, float]:
        t = time.time()
        r = lm_eval.simple_evaluate(model=model, model_args=args, tasks=a.tasks, batch_size=1, device="cpu",
                                    log_samples=True, task_manager=tm)
        return r, time.time() - t

    def resps(r: dict, task: str) -> list:
        return [x for s in sorted(r["samples"][task], key=lambda s: s["doc_id"]) for x in (y[0] for y in s["resps"])]

    ref, ref_s = run("hf", f"pretrained={ckpt},dtype=float32")
    extra = f",{a.extra}" if a.extra else ""
    configs = [("none", None)] + [(c, b) for c in a.codecs for b in a.bits]
    lines = ["| model_args | " + " | ".join(f"{t} {m}" for t in a.tasks for m in _metrics(ref, t)) +
             " | mean abs Δ loglik | is_greedy agree | generations equal | key bits | value bits | s |",
             "|---" * (1 + sum(len(_metrics(ref, t)) for t in a.tasks) + 6) + "|"]
    lines.append("| `--model hf` | " + " | ".join(f"{ref['results'][t][m]:.3f}" for t in a.tasks for m in _metrics(ref, t))
                 + f" | 0 | 1 | 1 | 32 | 32 | {ref_s:.0f} |")
    for codec, bits in configs:
        args = f"pretrained={ckpt},dtype=float32,codec={codec}" + (f",bits={bits}" if bits else "") + extra
        r, secs = run("kvcodec", args)
        d_ll, agree, gen_eq = [], [], []
        for t in a.tasks:
            for x, y in zip(resps(r, t), resps(ref, t)):
                if isinstance(x, str):
                    gen_eq.append(x == y)
                else:
                    d_ll.append(abs(x[0] - y[0]))
                    agree.append(x[1] == y[1])
        kv = r["config"]["kvcodec"]["mean"]
        mean = lambda v: sum(v) / len(v) if v else float("nan")  # noqa: E731
        lines.append(f"| {codec}" + (f"@{bits}" if bits else "") + " | "
                     + " | ".join(f"{r['results'][t][m]:.3f}" for t in a.tasks for m in _metrics(ref, t))
                     + f" | {mean(d_ll):.4f} | {mean(agree):.3f} | {mean(gen_eq):.3f} | {kv['bits_per_coord']:.2f} "
                     f"| {kv['value_bits_per_coord']:.2f} | {secs:.0f} |")
        print(lines[-1], flush=True)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(f"checkpoint: {ckpt}\n\n" + "\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


def _metrics(r: dict, task: str) -> list[str]:
    return [m for m, v in r["results"][task].items() if isinstance(v, float) and "stderr" not in m]


if __name__ == "__main__":
    main()
