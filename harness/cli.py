"""``harness``: run codecs against the uncompressed baseline, compare runs, list what exists.

  harness run                                   the default sweep: smollm2-135m, perplexity + needle,
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
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import sys
import types
import typing
from dataclasses import MISSING, Field, fields
from pathlib import Path


def _flag(f: Field) -> str:
    return f.metadata["cli"]["flag"] or "--" + f.name.replace("_", "-")


def _kind(tp) -> tuple[str, type]:
    """(how the field is parsed, its element/value type) from its annotation."""
    origin = typing.get_origin(tp)
    if tp is bool:
        return "switch", bool
    if origin is list:
        return "list", typing.get_args(tp)[0]
    if origin is dict:
        return "options", str
    if origin in (typing.Union, types.UnionType):  # `int | None`: the non-None type
        args = [t for t in typing.get_args(tp) if t is not type(None)]
        return "value", args[0] if len(args) == 1 else str
    return "value", tp


def _list_item(flag: str, kind: type):
    def parse(s: str) -> list:
        """'a,b' -> [a, b]: lists may be space- or comma-separated."""
        try:
            return [kind(v) for v in s.split(",") if v]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} takes {kind.__name__} values, got '{s}'") from None
    return parse


def _option_item(flag: str, metavar: str):
    def parse(s: str) -> tuple[str, str, str]:
        """'OWNER.NAME=VALUE' -> (owner, name, value)."""
        key, eq, value = s.partition("=")
        owner, dot, name = key.partition(".")
        if not eq or not dot or not owner or not name:
            raise argparse.ArgumentTypeError(f"{flag} takes {metavar}, got '{s}'")
        return owner, name, value
    return parse


def _value(flag: str, parse):
    def wrapped(s: str):
        try:
            return parse(s)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e) if parse.__module__ != "builtins" else
                                             f"{flag} takes {parse.__name__} values, got '{s}'") from None
    return wrapped


def _default_text(f: Field, m: dict) -> str:
    if m["default_note"]:
        return f" (default: {m['default_note']})"
    default = f.default_factory() if f.default_factory is not MISSING else f.default
    if default is None or isinstance(default, (bool, dict)) or default == []:
        return ""
    return f" (default: {' '.join(map(str, default)) if isinstance(default, list) else default})"


def add_config_arguments(p: argparse.ArgumentParser, cls=None) -> None:
    """One option per field of ``cls`` (default :class:`RunConfig`) that carries ``cli`` metadata.
    Options left out are absent from the namespace, so the dataclass defaults apply."""
    from harness.config import RunConfig

    cls = cls or RunConfig
    hints = typing.get_type_hints(cls)
    for f in fields(cls):
        m = f.metadata.get("cli")
        if m is None:
            continue
        flag, (kind, tp) = _flag(f), _kind(hints[f.name])
        kw = dict(dest=f.name, default=argparse.SUPPRESS, help=m["help"] + _default_text(f, m),
                  metavar=m["metavar"] or flag.lstrip("-").replace("-", "_").upper())
        if kind == "switch":
            kw.update(action="store_const", const=not f.default, metavar=None)
        elif kind == "list":
            kw.update(nargs="+", type=_list_item(flag, tp))
        elif kind == "options":
            kw.update(action="append", type=_option_item(flag, m["metavar"]))
        else:
            kw.update(type=_value(flag, m["parse"] or tp), choices=m["choices"])
            if m["choices"]:
                del kw["metavar"]  # argparse shows {a,b}
        p.add_argument(flag, **kw)


def config_from_args(a: argparse.Namespace, cls=None):
    """The dataclass (default :class:`RunConfig`) of the options ``add_config_arguments`` parsed."""
    from harness.config import RunConfig

    cls = cls or RunConfig
    return cls(**config_kwargs(a, cls))


def config_kwargs(a: argparse.Namespace, cls) -> dict:
    """The fields of ``cls`` given on the command line (the others are left out)."""
    hints = typing.get_type_hints(cls)
    given = vars(a)
    kw = {}
    for f in fields(cls):
        if "cli" not in f.metadata or f.name not in given:
            continue
        kind, value = _kind(hints[f.name])[0], given[f.name]
        if kind == "list":
            value = [v for part in value for v in part]
            if not value:  # `--codec ,`: nothing given, the default applies
                continue
        elif kind == "options":
            nested: dict[str, dict[str, str]] = {}
            for owner, name, v in value:
                nested.setdefault(owner, {})[name] = v
            value = nested
        kw[f.name] = value
    return kw


def run_parser(p: argparse.ArgumentParser) -> None:
    from harness.config import PRESETS

    p.add_argument("--preset", default="default", choices=tuple(PRESETS),
                   help="'default': the quick sweep (every codec; minutes on a CPU); 'full': the paper-sized "
                        "sweep (perplexity at 1,024 tokens and needles, 5 codec seeds; hours on a CPU); 'ruler': the "
                        "needle task with RULER's niah defaults (4 needles, 128 answer tokens, string_match_all). "
                        "Flags given replace the preset's values")
    add_config_arguments(p)
    p.add_argument("--out", type=Path, help="run folder (default reports/<model>-<config hash>; reruns resume)")
    p.add_argument("--fresh", action="store_true", help="discard what --out holds and start over")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--shard", metavar="I/N", help="run shard I of N (0-based) of the run's prompts, in the same "
                   "--out as the other shards; the last to end merges (default: from RANK/WORLD_SIZE or "
                   "SLURM_ARRAY_TASK_ID/SLURM_ARRAY_TASK_COUNT where set, else the whole run)")


def run_config(a: argparse.Namespace):
    """The :class:`RunConfig` of ``harness run``'s parsed arguments (the preset under the flags given)."""
    from harness.config import RunConfig, with_preset

    return RunConfig(**with_preset(a.preset, config_kwargs(a, RunConfig)))


def cmd_run(a) -> int:
    from harness.runner import run
    from harness.shard import Shard, pin_local_gpu

    pin_local_gpu(os.environ)  # torchrun / accelerate: this process's GPU, before CUDA starts
    config = run_config(a)
    shard = Shard.parse(a.shard) if a.shard else Shard.from_env(os.environ)
    out = run(config, out=a.out, fresh=a.fresh, progress=not a.quiet, shard=shard)
    print(f"report: {out / 'report.md'} and {out / 'report.html'}")
    return 0


def cmd_compare(a) -> int:
    from harness.compare import compare

    text = compare(a.runs)
    if a.out:
        a.out.write_text(text, encoding="utf-8")
        print(f"wrote {a.out}")
    else:
        print(text)
    if a.html:
        from harness.html_report import write_compare_page

        print(f"wrote {write_compare_page(a.runs, a.html)}")
    return 0


def cmd_report(a) -> int:
    from harness.merge import report

    report(a.run)
    print(f"report: {Path(a.run) / 'report.md'} and {Path(a.run) / 'report.html'}")
    return 0


def _opt_text(value) -> str:
    """An option's default as --codec-opt takes it back ("4,2" for a tuple, "none" for None)."""
    if value is None:
        return "none"
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return str(value).lower() if isinstance(value, bool) else str(value)


def cmd_list(a) -> int:
    from adapters.registry import list_models
    from harness.tasks import UNAVAILABLE, list_tasks
    from kernels import codec_class, list_codecs
    from metrics import list_metrics

    print("models:")
    for name, spec in list_models().items():
        print(f"  {name:<26} {spec.modality:<6} {spec.description}")
    print("codecs (bits):")
    for name, bits in list_codecs().items():
        print(f"  {name:<26} {','.join(map(str, bits))}")
        opts = codec_class(name).Options
        hints = typing.get_type_hints(opts)
        for f in dataclasses.fields(opts):
            tp = hints[f.name]
            shown = ("one of " + "|".join(map(str, typing.get_args(tp)))) if typing.get_origin(tp) is typing.Literal \
                else str(tp).replace("typing.", "")
            print(f"      --codec-opt {name}.{f.name}={_opt_text(f.default)}  ({shown})")
    print("tasks:")
    for name, cls in list_tasks().items():
        print(f"  {name:<26} {cls.modality:<6} metrics: {', '.join(cls.metrics)}")
        for opt, (default, help_, *_) in getattr(cls, "option_defaults", {}).items():
            d = ",".join(map(str, default)) if isinstance(default, (tuple, list)) else default
            print(f"      --task-opt {name}.{opt}={d}  {help_}")
    for mod, why in sorted(UNAVAILABLE.items()):
        print(f"  ({mod}: unavailable, {why})")
    print("metrics (direction):")
    for name, m in list_metrics().items():
        better = {True: "higher is better", False: "lower is better"}.get(m.higher_is_better, "no direction")
        print(f"  {name:<26} {better:<16} {m.scale:<6} [{', '.join(m.modalities)}] {m.display}: {m.description}")
    return 0


#: subcommands that need an optional extra: the package they import, the extra that installs it
EXTRAS = {"lm-eval": ("lm_eval", "lm-eval")}


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
    if argv and argv[0] in ("probe", "bench"):  # their own argument parsers
        return _delegate(f"harness.{argv[0]}", argv[0], argv[1:])
    if argv and argv[0] == "launch":  # its own options, then `--` and the run's
        return _delegate("harness.launch", "launch", argv[1:])
    if argv and argv[0] == "lm-eval":  # lm-eval's own command line, with the kvcodec model registered
        return _delegate("harness.lm_eval_model", "lm-eval", argv[1:])
    parser = argparse.ArgumentParser(prog="harness", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd")
    run_parser(sub.add_parser("run", help="run codecs against the uncompressed baseline"))
    pc = sub.add_parser("compare", help="later runs against the first, paired per configuration "
                                        "(refused for other models or prompts), and per-prompt tables")
    pc.add_argument("runs", nargs="+", type=Path)
    pc.add_argument("--out", type=Path, help="write the markdown here instead of stdout")
    pc.add_argument("--html", type=Path, metavar="PAGE", help="also write the comparison as an HTML page "
                    "(plotly.min.js beside it; links to each run's report.html)")
    pr = sub.add_parser("report", help="rebuild summary.json, report.md and report.html of a run")
    pr.add_argument("run", type=Path)
    sub.add_parser("list", help="models, codecs, tasks, metrics")
    sub.add_parser("launch", help="one run as shards in several processes: --gpus 0,1 / --procs N / --slurm "
                                  "(harness launch --help)")
    sub.add_parser("probe", help="the synthetic probe (harness probe --help)")
    sub.add_parser("bench", help="kernel benchmarks (harness bench --help)")
    sub.add_parser("lm-eval", help="lm-evaluation-harness with the 'kvcodec' model: harness lm-eval --model kvcodec "
                                   "--model_args pretrained=DIR,codec=octopus,bits=3 --tasks T (needs '.[lm-eval]')")
    a = parser.parse_args(argv)
    if a.cmd is None:
        parser.print_help()
        return 0
    try:
        return {"run": cmd_run, "compare": cmd_compare, "report": cmd_report, "list": cmd_list}[a.cmd](a)
    except Exception as e:  # noqa: BLE001 (one line for any input; HARNESS_DEBUG=1 for the traceback)
        return error(a.cmd, e)


def debugging() -> bool:
    """HARNESS_DEBUG=1 (or true, yes, on): errors raise with their traceback; unset, 0 or anything
    else: one line."""
    return os.environ.get("HARNESS_DEBUG", "").strip().lower() in ("1", "true", "yes", "on")


def error(cmd: str, e: BaseException) -> int:
    """One line on stderr, ``harness CMD: error: ...`` (the message's own line breaks folded), and
    exit code 2; HARNESS_DEBUG=1 re-raises for the traceback. ValueError (RunError, InputError, the
    adapters' load errors) and OSError messages name the problem and the fix; any other exception is
    named by its type, with the debug hint."""
    if debugging():
        raise e
    text = " ".join(str(e).split()) or type(e).__name__
    if isinstance(e, OSError) and e.filename is not None and str(e.filename) not in text:
        text += f": {e.filename}"
    named = isinstance(e, (ValueError, OSError, ImportError, RuntimeError))
    if not named:
        text = f"{type(e).__name__}: {text}"
    hint = "" if isinstance(e, (ValueError, OSError)) else " (HARNESS_DEBUG=1 shows the traceback)"
    print(f"harness {cmd}: error: {text}{hint}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
