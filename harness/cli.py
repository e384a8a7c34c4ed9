"""``harness``: run codecs against the uncompressed baseline, compare runs, list what exists.

  harness run                                   the default sweep: smollm2-135m, perplexity + needle,
                                                8 codecs at 2, 3, 4 bits, plus the baseline
  harness run --model smollm2-135m --codec octopus --bits 2
  harness run --model hf --model-path DIR --codec octopus qjl --bits 3 4 --task perplexity --prompts wikitext2
  harness compare reports/RUN [reports/RUN2 ...]
  harness report reports/RUN                     rebuild summary.json + report.md from rows.jsonl
  harness list                                  models, codecs (with bits), tasks (with options), metrics
  harness probe ... / harness bench ...         the synthetic probe / kernel benchmarks
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path


def _split(values: list[str] | None) -> list[str]:
    """['a,b', 'c'] -> ['a', 'b', 'c'] (space- or comma-separated lists)."""
    return [v for item in values or [] for v in item.split(",") if v]


def _protect(s: str):
    if s in ("none", "boundary-1"):
        return s
    try:
        return [int(i) for i in s.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--protect takes 'none', 'boundary-1' or layer indices like 0,29; got '{s}'")


def _task_opts(items: list[str] | None) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for item in items or []:
        key, eq, value = item.partition("=")
        task, dot, name = key.partition(".")
        if not eq or not dot or not name:
            raise SystemExit(f"--task-opt takes TASK.NAME=VALUE (e.g. needle.contexts=512,1024), got '{item}'")
        out.setdefault(task, {})[name] = value
    return out


def run_parser(p: argparse.ArgumentParser) -> None:
    from adapters.kv_cache import DEFAULT_RESIDUAL
    from harness.runner import DEFAULT_BITS, DEFAULT_CODECS, DEFAULT_MODEL

    p.add_argument("--model", default=DEFAULT_MODEL, help=f"model name (default {DEFAULT_MODEL}; see `harness list`)")
    p.add_argument("--model-path", help="local checkpoint directory (or .gguf file) for the model")
    p.add_argument("--codec", nargs="+", help=f"codec(s) (default: {' '.join(DEFAULT_CODECS)})")
    p.add_argument("--bits", nargs="+", help=f"key bit width(s) (default: {' '.join(map(str, DEFAULT_BITS))})")
    p.add_argument("--task", nargs="+", help="task(s) (default: the model's; text: perplexity needle)")
    p.add_argument("--prompts", help="prompt source: a path, or for text wikitext2 / c4 (default: offline corpus)")
    p.add_argument("--limit", type=int, help="at most this many prompts per task")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--residual", type=int, default=DEFAULT_RESIDUAL, help=f"native window in tokens (default {DEFAULT_RESIDUAL})")
    p.add_argument("--protect", type=_protect, default="none", help="layers kept native: none, boundary-1, or 0,29")
    p.add_argument("--value-bits", type=int, help="value bit width (default: the key bit width)")
    p.add_argument("--value-group", type=int, default=32, help="value quantization group size (default 32)")
    p.add_argument("--attend", choices=("score", "reconstruct"), default="score",
                   help="read keys through each codec's score estimator (default) or its reconstruction")
    p.add_argument("--backend", choices=("auto", "triton", "torch"), default="auto")
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:1, ...")
    p.add_argument("--dtype", default="auto", help="auto (float32 on cpu, bfloat16 on cuda), float32, bfloat16, float16")
    p.add_argument("--task-opt", action="append", metavar="TASK.NAME=VALUE",
                   help="task option, repeatable (e.g. needle.contexts=512,1024; see `harness list`)")
    p.add_argument("--no-baseline-row", action="store_true", help="do not add the codec 'none' rows")
    p.add_argument("--out", type=Path, help="run folder (default reports/<model>-<config hash>; reruns resume)")
    p.add_argument("--fresh", action="store_true", help="discard what --out holds and start over")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def config_from_args(a) -> "RunConfig":
    from harness.runner import DEFAULT_BITS, DEFAULT_CODECS, RunConfig

    try:
        bits = [int(b) for b in _split(a.bits)] or list(DEFAULT_BITS)
    except ValueError:
        raise SystemExit(f"--bits takes integers, got {a.bits}")
    return RunConfig(model=a.model, model_path=a.model_path, tasks=_split(a.task),
                     codecs=_split(a.codec) or list(DEFAULT_CODECS), bits=bits, prompts=a.prompts, limit=a.limit,
                     seed=a.seed, residual=a.residual, protect=a.protect, value_bits=a.value_bits,
                     value_group=a.value_group, attend=a.attend, backend=a.backend, device=a.device, dtype=a.dtype,
                     task_options=_task_opts(a.task_opt), baseline=not a.no_baseline_row)


def cmd_run(a) -> int:
    from harness.runner import run

    config = config_from_args(a)
    out = run(config, out=a.out, fresh=a.fresh, progress=not a.quiet)
    print(f"report: {out / 'report.md'}")
    return 0


def cmd_compare(a) -> int:
    from harness.report import compare

    text = compare(a.runs)
    if a.out:
        a.out.write_text(text, encoding="utf-8")
        print(f"wrote {a.out}")
    else:
        print(text)
    return 0


def cmd_report(a) -> int:
    from harness.runner import finish

    finish(a.run)
    print(f"report: {Path(a.run) / 'report.md'}")
    return 0


def cmd_list(a) -> int:
    from adapters.registry import list_models
    from harness.tasks import UNAVAILABLE, list_tasks
    from kernels import list_codecs
    from metrics import list_metrics

    print("models:")
    for name, spec in list_models().items():
        print(f"  {name:<26} {spec.modality:<6} {spec.description}")
    print("codecs (bits):")
    for name, bits in list_codecs().items():
        print(f"  {name:<26} {','.join(map(str, bits))}")
    print("tasks:")
    for name, cls in list_tasks().items():
        print(f"  {name:<26} {cls.modality:<6} metrics: {', '.join(cls.metrics)}")
        for opt, (default, help_) in getattr(cls, "option_defaults", {}).items():
            d = ",".join(map(str, default)) if isinstance(default, (tuple, list)) else default
            print(f"      --task-opt {name}.{opt}={d}  {help_}")
    for mod, why in sorted(UNAVAILABLE.items()):
        print(f"  ({mod}: unavailable, {why})")
    print("metrics (direction):")
    for name, m in list_metrics().items():
        print(f"  {name:<26} {'higher' if m.higher_is_better else 'lower'} is better  [{m.modality}] {m.description}")
    return 0


def _delegate(module: str, what: str, argv: list[str]) -> int:
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name != module:
            raise
        print(f"harness {what}: {module} is not available in this checkout", file=sys.stderr)
        return 2
    if not hasattr(mod, "main"):
        print(f"harness {what}: {module} has no main(argv)", file=sys.stderr)
        return 2
    return mod.main(argv) or 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("probe", "bench"):  # their own argument parsers
        return _delegate(f"harness.{argv[0]}", argv[0], argv[1:])
    parser = argparse.ArgumentParser(prog="harness", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd")
    run_parser(sub.add_parser("run", help="run codecs against the uncompressed baseline"))
    pc = sub.add_parser("compare", help="per-prompt tables across runs")
    pc.add_argument("runs", nargs="+", type=Path)
    pc.add_argument("--out", type=Path, help="write the markdown here instead of stdout")
    pr = sub.add_parser("report", help="rebuild summary.json and report.md of a run")
    pr.add_argument("run", type=Path)
    sub.add_parser("list", help="models, codecs, tasks, metrics")
    sub.add_parser("probe", help="the synthetic probe (harness probe --help)")
    sub.add_parser("bench", help="kernel benchmarks (harness bench --help)")
    a = parser.parse_args(argv)
    if a.cmd is None:
        parser.print_help()
        return 0
    try:
        return {"run": cmd_run, "compare": cmd_compare, "report": cmd_report, "list": cmd_list}[a.cmd](a)
    except (ValueError, FileNotFoundError, ImportError, RuntimeError) as e:
        if os.environ.get("HARNESS_DEBUG"):
            raise
        hint = "" if isinstance(e, (ValueError, FileNotFoundError)) else " (HARNESS_DEBUG=1 shows the traceback)"
        print(f"harness {a.cmd}: error: {e}{hint}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
