"""``harness lm-eval-sweep``: lm-eval tasks through the compressed cache, one process, several codecs and bit widths.

  harness lm-eval-sweep [--pretrained DIR] [--tasks kv_passage_mc kv_passage_gen]
      [--codecs octopus turboquant-mse kivi] [--bits 2 3 4] [--seeds 0 1 2] [--out reports/lm_eval_smollm2.md]

Each configuration is what ``harness lm-eval --model kvcodec --model_args pretrained=DIR,codec=C,bits=B
--tasks T --include_path prompts/lm_eval`` runs (run from the repository root: the task files name
their data by relative path); this runs them in one process (one model load, one task index)
and writes the table of :mod:`harness.lm_eval.table`: the task metrics and their paired difference
from ``--model hf`` on the same checkpoint, the mean |Δ log-likelihood| and is_greedy / generation
agreement against it, each with its 95% interval over documents (x codec seeds: a randomized codec
runs once per ``--seeds`` value, ``codec_seed=S``), and the true bits per coordinate.

lm-eval is an optional extra (``pip install '.[lm-eval]'``): it is reached through
:func:`harness.lm_eval.command.evaluator` only.
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from adapters.cache.config import CacheConfig
from adapters.model_store import prepared_smollm2
from kernels import codec_class

from harness.run.config import seeded
from harness.lm_eval.command import evaluator
from harness.lm_eval.table import Row, Run, table, table_row

INCLUDE_PATH = "prompts/lm_eval"  # the offline tasks over hand-written passages (relative: run from the root)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="harness lm-eval-sweep", description=__doc__.splitlines()[0])
    p.add_argument("--pretrained", default=None, help="checkpoint folder (default: the prepared SmolLM2-135M)")
    p.add_argument("--tasks", nargs="+", default=["kv_passage_mc", "kv_passage_gen"])
    p.add_argument("--codecs", nargs="+", default=["octopus", "turboquant-mse", "kivi"])
    p.add_argument("--bits", nargs="+", type=int, default=[2, 3, 4])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2],
                   help="codec seeds (model_args codec_seed=); a codec without random draws runs at the first")
    p.add_argument("--extra", default="", help="more model_args, e.g. residual=16")
    p.add_argument("--out", type=Path, default=Path("reports/lm_eval_smollm2.md"))
    return p


def configurations(codecs: list[str], bits: list[int]) -> list[tuple[str, int | None]]:
    """(codec, bits) of each row: the native cache (codec none, no bits) first, then codecs x bits."""
    return [("none", None)] + [(c, b) for c in codecs for b in bits]


def sweep(evaluate, ckpt: str, tasks: list[str], codecs: list[str], bits: list[int], seeds: list[int],
          extra: str = "") -> tuple[Run, list[Row]]:
    """``evaluate(model, model_args) -> results`` (:func:`harness.lm_eval.command.evaluator`) of ``--model
    hf`` and of every configuration at each of its codec seeds -> (the reference run, one row per
    configuration); each row's line of the table is printed as it ends."""
    def run(model: str, args: str, seed: int = 0) -> Run:
        t = time.time()
        r = evaluate(model, args)
        return Run(seed, r, time.time() - t)

    ref = run("hf", f"pretrained={ckpt},dtype=float32")
    extra = f",{extra}" if extra else ""
    rows = []
    for codec, b in configurations(codecs, bits):
        codec_seeds = [c.seed for c in seeded(CacheConfig(codec=codec), seeds)]  # once if not randomized
        args = f"pretrained={ckpt},dtype=float32,codec={codec}" + (f",bits={b}" if b else "") + extra
        rows.append(Row(codec + (f"@{b}" if b else ""),
                        tuple(run("kvcodec", f"{args},codec_seed={s}", s) for s in codec_seeds)))
        print(table_row(rows[-1], ref, tasks), flush=True)
    return ref, rows


def main(argv: list[str] | None = None) -> int:
    """``harness lm-eval-sweep ARGS``: the sweep, its table written to --out and printed."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    p = build_parser()
    a = p.parse_args(argv)
    for c in a.codecs:
        try:
            codec_class(c)  # an unknown codec fails here, in one line, before a model loads
        except ValueError as e:
            p.error(str(e))
    if len(set(a.seeds)) != len(a.seeds):
        p.error(f"--seeds must be distinct, got {a.seeds}")
    ckpt = a.pretrained or str(prepared_smollm2())
    ref, rows = sweep(evaluator(INCLUDE_PATH, a.tasks), ckpt, a.tasks, a.codecs, a.bits, a.seeds, a.extra)
    lines = table(ref, rows, a.tasks)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(f"checkpoint: {ckpt}\n\n" + "\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))
    return 0
