"""The commands ``harness`` parses itself, each a dataclass whose annotated fields declare its flags (tyro,
:mod:`harness.run.flags`): ``run`` (the :class:`harness.run.config.RunConfig` and where it goes), ``compare``, ``report``,
``list``. Imported only once a command needs them (tyro and the configuration pull in torch)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from tyro.conf import Positional, arg

from harness.run.config import PRESETS, RunConfig, with_preset
from harness.run.flags import nest, parse

Preset = Literal[tuple(PRESETS)]


@dataclass
class RunCommand:
    """``harness run``: the run's configuration and where it goes."""

    config: RunConfig
    preset: Annotated[Preset, arg(
        help="'default': the quick sweep (every codec; minutes on a CPU); 'full': the paper-sized sweep (perplexity "
        "at 1,024 tokens and needles, 5 codec seeds; hours on a CPU); 'deployed': the KV caches engines deploy, "
        "beside OCTOPUS and TurboQuant-MSE; 'ruler': the needle task with RULER's niah defaults (4 needles, 128 "
        "answer tokens, string_match_all). Flags given replace the preset's values")] = "default"
    out: Annotated[Path | None, arg(
        help="run folder (default reports/<model>-<config hash>; reruns resume)", metavar="DIR")] = None
    fresh: Annotated[bool, arg(help="discard what --out holds and start over")] = False
    quiet: Annotated[bool, arg(help="no progress bars")] = False
    shard: Annotated[str | None, arg(
        help="run shard I of N (0-based) of the run's prompts, in the same --out as the other shards; the last to "
        "end merges (default: from RANK/WORLD_SIZE or SLURM_ARRAY_TASK_ID/SLURM_ARRAY_TASK_COUNT where set, else "
        "the whole run)", metavar="I/N")] = None


def parse_run(argv: list[str], prog: str = "harness run") -> RunCommand:
    """``harness run``'s arguments: the preset's values under the flags given (task and codec options merge per
    option; the preset's options of a task the flags leave out of the run go)."""
    preset = _preset(argv)
    base = RunConfig(**with_preset(preset, {}))
    cmd = parse(RunCommand, argv, prog=prog, description=RunCommand.__doc__,
                default=RunCommand(config=base, preset=preset))
    c = cmd.config
    c.task_options, given_tasks = nest(c.task_options)
    c.codec_options, _ = nest(c.codec_options)
    if c.tasks != base.tasks:  # tasks given: a preset's options of a task left out go
        c.task_options = {t: o for t, o in c.task_options.items() if t in c.tasks or t in given_tasks}
    return cmd


def _preset(argv: list[str]) -> str:
    """``--preset``'s value (checked by the parse proper), read first: it gives every other flag's default."""
    for i, a in enumerate(argv):
        if a == "--preset" and i + 1 < len(argv):
            return argv[i + 1] if argv[i + 1] in PRESETS else "default"
        if a.startswith("--preset="):
            return a.partition("=")[2] if a.partition("=")[2] in PRESETS else "default"
    return "default"


@dataclass
class CompareCommand:
    """``harness compare``: later runs against the first, paired per configuration (refused for other models or
    prompts), and per-prompt tables."""

    runs: Annotated[list[Path], Positional, arg(metavar="RUN")]
    out: Annotated[Path | None, arg(help="write the markdown here instead of stdout", metavar="FILE")] = None
    html: Annotated[Path | None, arg(
        help="also write the comparison as an HTML page (plotly.min.js beside it; links to each run's report.html)",
        metavar="PAGE")] = None


@dataclass
class ReportCommand:
    """``harness report``: rebuild summary.json, report.md and report.html of a run (merging its shards' rows)."""

    run: Annotated[Path, Positional, arg(metavar="RUN")]


@dataclass
class ListCommand:
    """``harness list``: models, codecs (with bits and options), tasks (with options), metrics."""


#: the commands parsed here, each from its dataclass
COMMANDS = {"run": RunCommand, "compare": CompareCommand, "report": ReportCommand, "list": ListCommand}
