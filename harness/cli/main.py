"""``harness``: run codecs against the uncompressed baseline, compare runs, list what exists.

  harness run                                   the default sweep: smollm2-135m, perplexity (KL to the baseline),
                                                8 codecs at 2, 3, 4 bits, plus the baseline
  harness run --model smollm2-135m --codec octopus --bits 2
  harness run --model hf --model-path DIR --codec octopus qjl --bits 3 4 --task perplexity --prompts wikitext2
  harness compare reports/RUN [reports/RUN2 ...]  each later run minus the first, paired, with 95% intervals
  harness compare reports/A reports/B --html cmp.html   ... also as a page with plots and sortable tables
  harness report reports/RUN                     rebuild summary.json, report.md + report.html from rows.jsonl
                                                (merging the rows of shards first)
  harness launch --gpus 0,1 -- --model hf ...   one run split over GPUs (--procs N on CPUs, --slurm on a
                                                cluster); merged as one process would have written it
  harness list                                  models, codecs (with bits), tasks (with options), metrics
  harness probe ... / harness bench ...         the synthetic probe / kernel benchmarks
  harness lm-eval --model kvcodec --model_args pretrained=DIR,codec=octopus,bits=3 --tasks T
                                                lm-evaluation-harness tasks through the compressed cache
  harness lm-eval-sweep --codecs octopus kivi --bits 2 3   prompts/lm_eval's tasks, codecs x bits against
                                                --model hf in one process: a table with 95% intervals
"""
from __future__ import annotations

import dataclasses
import importlib
import os
import sys
import typing
from typing import TYPE_CHECKING

from harness.run.folder import RunFolder
from harness.run.safe_text import printable

if TYPE_CHECKING:
    from harness.cli.commands import CompareCommand, ListCommand, ReportCommand


def cmd_run(argv: list[str]) -> int:
    from harness.cli.commands import parse_run
    from harness.runner import run
    from harness.scale.shard import Shard, pin_local_gpu

    pin_local_gpu(os.environ)  # torchrun / accelerate: this process's GPU, before CUDA starts
    cmd = parse_run(argv)
    shard = Shard.parse(cmd.shard) if cmd.shard else Shard.from_env(os.environ)
    folder = RunFolder(run(cmd.config, out=cmd.out, fresh=cmd.fresh, progress=not cmd.quiet, shard=shard, log=say))
    print(f"report: {folder.report_md} and {folder.report_html}")
    return 0


def say(line: str) -> None:
    """A command's note on stdout, its control characters replaced: notes name prompt ids and labels."""
    print(printable(line))


def cmd_compare(a: CompareCommand) -> int:
    from harness.report.compare import compare

    text = compare(a.runs)
    if a.out:
        a.out.write_text(text, encoding="utf-8")
        print(f"wrote {a.out}")
    else:
        print(printable(text, keep="\n"))
    if a.html:
        from harness.report.html import write_compare_page

        print(f"wrote {write_compare_page(a.runs, a.html)}")
    return 0


def cmd_report(a: ReportCommand) -> int:
    from harness.report.build import report

    report(a.run)
    print(f"report: {RunFolder(a.run).report_md} and {RunFolder(a.run).report_html}")
    return 0


def _opt_text(value) -> str:
    """An option's default as --codec-opt takes it back ("4,2" for a tuple, "none" for None)."""
    if value is None:
        return "none"
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return str(value).lower() if isinstance(value, bool) else str(value)


def _option_lines(options_cls) -> list[tuple]:
    """(field, its type as shown) of an ``Options`` dataclass, in declaration order."""
    hints = typing.get_type_hints(options_cls)
    out = []
    for f in dataclasses.fields(options_cls):
        tp = hints[f.name]
        literal = typing.get_origin(tp) is typing.Literal
        shown = ("one of " + "|".join(map(str, typing.get_args(tp))) if literal
                 else tp.__name__ if isinstance(tp, type) else str(tp).replace("typing.", ""))
        out.append((f, shown))
    return out


def cmd_list(a: ListCommand) -> int:
    from adapters.registry import list_models
    from harness.run.config import WIDTHS
    from harness.tasks import UNAVAILABLE, list_tasks
    from kernels import codec_class, list_codecs
    from kernels.engines.preset import rate
    from registry.options import allowed, help_of
    from metrics import list_metrics

    print("models:")
    for name, spec in list_models().items():
        print(f"  {name:<26} {spec.modality:<6} {spec.description}")
    print("codecs (bits):  [an engine's cache: its engine; bits per coordinate, keys/values at head dim 128, 16-bit]")
    print(f"  widths: {WIDTHS}")
    for name, bits in list_codecs().items():
        cls = codec_class(name)
        rates = ""
        if cls.engine_preset:
            per = [f"{b}: {k:.3g}/{v:.3g}" for b in bits for k, v in [rate(cls, b)]]
            rates = f"  [{cls.engine}; {', '.join(per)}]"
        print(f"  {name:<26} {','.join(map(str, bits))}{rates}")
        for f, shown in _option_lines(codec_class(name).Options):
            where = str(allowed(f))
            print(f"      --codec-opt {name}.{f.name}={_opt_text(f.default)}  ({shown}{'; ' + where if where else ''})"
                  f"{'  ' + help_of(f) if help_of(f) else ''}")
    print("tasks:")
    for name, cls in list_tasks().items():
        print(f"  {name:<26} {cls.modality:<6} metrics: {', '.join(cls.metrics)}")
        for f, _ in _option_lines(cls.Options):
            d = ",".join(map(str, f.default)) if isinstance(f.default, tuple) else f.default
            where = str(allowed(f))
            print(f"      --task-opt {name}.{f.name}={d}  {help_of(f)}{f' ({where})' if where else ''}")
    for mod, why in sorted(UNAVAILABLE.items()):
        print(f"  ({mod}: unavailable, {why})")
    print("metrics (direction):")
    for name, m in list_metrics().items():
        better = {True: "higher is better", False: "lower is better"}.get(m.higher_is_better, "no direction")
        print(f"  {name:<26} {better:<16} {m.scale:<6} [{', '.join(m.modalities)}] {m.display}: {m.description}")
    return 0


#: subcommands that need an optional extra: the package they import, the extra that installs it
EXTRAS = {"lm-eval": ("lm_eval", "lm-eval"), "lm-eval-sweep": ("lm_eval", "lm-eval")}


def _delegate(module: str, what: str, argv: list[str]) -> int:
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        package, extra = EXTRAS.get(what, (None, None))
        if package and (e.name or "").partition(".")[0] == package:
            print(f"harness {what}: error: {package} is not installed: pip install '.[{extra}]'", file=sys.stderr)
            return 2
        if e.name != module:
            raise
        print(f"harness {what}: {module} is not available in this checkout", file=sys.stderr)
        return 2
    if not hasattr(mod, "main"):
        print(f"harness {what}: {module} has no main(argv)", file=sys.stderr)
        return 2
    try:
        return mod.main(argv) or 0
    except Exception as e:  # noqa: BLE001 (one line for any input; HARNESS_DEBUG=1 for the traceback)
        return error(what, e)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in DELEGATED:
        return _delegate(DELEGATED[argv[0]], argv[0], argv[1:])
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    from harness.cli.commands import COMMANDS  # tyro and the configurations: only once a command needs them
    from harness.run.flags import parse

    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(printable(f"harness: error: unknown command '{name}'; use one of {', '.join(COMMANDS)} (harness --help)"),
              file=sys.stderr)
        return 2
    handler = globals()[f"cmd_{name}"]  # looked up at call time (tests replace one)
    try:
        if name == "run":  # its preset gives the defaults: parsed in two steps (parse_run)
            return handler(rest)
        cls = COMMANDS[name]
        return handler(parse(cls, rest, prog=f"harness {name}", description=cls.__doc__))
    except Exception as e:  # noqa: BLE001 (one line for any input; HARNESS_DEBUG=1 for the traceback)
        return error(name, e)


#: the commands whose module parses its own arguments: the benchmarks and the probe, launch (its options, then
#: ``--`` and the run's), lm-eval (its own command line, with the kvcodec model registered) and the lm-eval sweep
DELEGATED = {"probe": "harness.bench.probe", "bench": "harness.bench", "launch": "harness.cli.launch",
             "lm-eval": "harness.lm_eval.command", "lm-eval-sweep": "harness.lm_eval.sweep"}


def debugging() -> bool:
    """HARNESS_DEBUG=1 (or true, yes, on): errors raise with their traceback; unset, 0 or anything
    else: one line."""
    return os.environ.get("HARNESS_DEBUG", "").strip().lower() in ("1", "true", "yes", "on")


def error(cmd: str, e: BaseException) -> int:
    """One line on stderr, ``harness CMD: error: ...`` (the message's own line breaks folded, its other
    control characters replaced: it may quote an id or a file's content), and exit code 2; HARNESS_DEBUG=1
    re-raises for the traceback. ValueError (RunError, InputError, the adapters' load errors) and OSError
    messages name the problem and the fix; any other exception is named by its type, with the debug hint."""
    if debugging():
        raise e
    text = " ".join(str(e).split()) or type(e).__name__
    if isinstance(e, OSError) and e.filename is not None and str(e.filename) not in text:
        text += f": {e.filename}"
    named = isinstance(e, (ValueError, OSError, ImportError, RuntimeError))
    if not named:
        text = f"{type(e).__name__}: {text}"
    hint = "" if isinstance(e, (ValueError, OSError)) else " (HARNESS_DEBUG=1 shows the traceback)"
    print(printable(f"harness {cmd}: error: {text}{hint}"), file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
