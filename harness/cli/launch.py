"""harness launch: one run as N shards (harness/scale/shard.py), one process per shard (harness/scale/launch.py).

  harness launch --gpus 0,1 -- --model hf --model-path DIR --codec octopus --bits 2 3 4
  harness launch --gpus 4 -- ...            the first 4 visible GPUs
  harness launch --procs 2 -- ...           2 processes on the CPU (no GPU is visible to them)
  harness launch --slurm --shards 8 --partition gpu --time-min 240 -- ...   a submitit job array

Everything after -- is harness run's arguments, checked here before anything starts. Each
process is harness run ... --shard I/N, pinned to its GPU with CUDA_VISIBLE_DEVICES, its output in
RUN/logs/shard-I-of-N.log; one line shows every shard's rows. The last shard to end merges the
rows (byte-identical to one process's run); the exit status is 1 if any shard failed (its log is
named; the same command resumes it). --fresh after -- starts the run over once, here,
before the shards start. Shards already complete (by the run's plan.json) are not started again.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from tyro.conf import arg, create_mutex_group

from harness.cli.commands import RunCommand, parse_run
from harness.cli.main import say
from harness.report.build import finish
from harness.report.run_data import plot_names
from harness.run.claim import claim_out, make_out, refuse_live_shards, wipe, write_config
from harness.run.config import RunConfig, RunError
from harness.run.flags import parse
from harness.run.folder import RunFolder
from harness.run.lock import RunLock
from harness.run.plan import read_plan
from harness.run.safe_text import printable
from harness.runner import plan, resolve, run
from harness.scale.launch import complete_shards, gpu_list, run_local, run_slurm
from harness.scale.merge import MERGE_WAIT_S
from harness.scale.shard import Shard, shard_files
from harness.scale.slurm import SlurmConfig
from metrics import modalities


_WHERE = create_mutex_group(required=True, title="where the shards run (one of)")


@dataclass
class LaunchCommand:
    """``harness launch``'s own options (before ``--``); the cluster's go to slurm.json in the run folder."""

    cluster: SlurmConfig
    gpus: Annotated[str | None, _WHERE, arg(
        help="GPUs, one shard each: a list of indices (0,1,3) or a count (4: the first 4)", metavar="LIST")] = None
    procs: Annotated[int | None, _WHERE, arg(
        help="this many shards as CPU processes (CUDA hidden from them)", metavar="N")] = None
    slurm: Annotated[bool, _WHERE, arg(
        help="a submitit job array, one task per shard (needs '.[scale]'); the cluster options go to slurm.json "
        "in the run folder")] = False
    shards: Annotated[int | None, arg(help="--slurm: number of array tasks (shards)", metavar="N")] = None
    detach: Annotated[bool, arg(help="--slurm: submit and return (follow with harness report)")] = False
    quiet: Annotated[bool, arg(help="no progress line")] = False


def parse_launch(own: list[str]) -> LaunchCommand:
    return parse(LaunchCommand, own, prog="harness launch", description=__doc__)


def split(argv: list[str]) -> tuple[list[str], list[str]]:
    """(launch's own arguments, the run's) at the first '--'."""
    if "--" not in argv:
        if any(a in ("-h", "--help") for a in argv):
            return argv, []
        raise RunError("harness launch needs the run's arguments after '--', e.g. harness launch --procs 2 -- "
                       "--model hf --model-path DIR")
    i = argv.index("--")
    return argv[:i], argv[i + 1:]


def run_command(run_argv: list[str]) -> RunCommand:
    """The run's arguments parsed as `harness run` does (the children get them verbatim)."""
    cmd = parse_run(run_argv, prog="harness launch ... --")
    if cmd.shard:
        raise RunError("--shard is set per process by harness launch; leave it out of the run's arguments")
    return cmd


def prepare(config: RunConfig, out: Path, fresh: bool) -> None:
    """Claim ``out`` for the run's shards (``--fresh``: start it over here, once) and write config.json."""
    make_out(out)
    with RunLock(out, role="start", wait=MERGE_WAIT_S):
        refuse_live_shards(out)
        claim_out(config, out, fresh)
        if fresh:
            wipe(out, plot_names(out), modalities())
        write_config(config, out)


def conclude(out: Path, count: int, failed: dict[int, str]) -> int:
    """After the shards ended (``failed``: why each that failed did): merge and report what they stored
    where the last shard did not, say what failed; launch's exit status."""
    complete = len(complete_shards(out, count)) == count
    if read_plan(out) is not None and (failed or shard_files(out)):
        # a shard failed (the report names what is missing), or the last merge did not run
        with RunLock(out, role="merge", wait=MERGE_WAIT_S):
            complete = finish(out)
    folder = RunFolder(out)
    for i, why in failed.items():
        print(printable(f"harness launch: {Shard(i, count)} failed: {why}; rerun the same command to resume it"),
              file=sys.stderr)  # why: the last line of its log
    if not failed and complete:
        print(f"report: {folder.report_md} and {folder.report_html}")
    elif not failed:  # every process ended well, yet rows are missing (e.g. shards of another count ran beside)
        print(f"harness launch: every shard ended, yet rows are missing ({folder.report_md} names them); rerun "
              f"the same command to run them", file=sys.stderr)
    return 1 if failed or not complete else 0


def main(argv: list[str]) -> int:
    own, run_argv = split(argv)
    a = parse_launch(own)
    ra = run_command(run_argv)
    config, _ = resolve(ra.config, say)  # every run argument checked, and prompts read, before anything starts
    plan(config, say)
    out = Path(ra.out or config.default_out()).absolute()
    child_argv = [x for x in run_argv if x != "--fresh"]
    if a.slurm:
        if not a.shards or a.shards < 1:
            raise RunError("--slurm needs --shards N (N >= 1): the number of array tasks")
        slurm = a.cluster
        slurm.validate()
        prepare(config, out, ra.fresh)
        failed = run_slurm(config.to_json(), out, a.shards, slurm, run, a.detach, a.quiet)
        return 0 if failed is None else conclude(out, a.shards, failed)  # None: detached
    if a.shards or a.detach:
        raise RunError("--shards and --detach go with --slurm; --gpus / --procs start one shard per GPU / process")
    if a.procs is not None:
        if a.procs < 1:
            raise RunError(f"--procs must be >= 1, got {a.procs}")
        cores = os.cpu_count() or 1
        if a.procs > cores:  # each process loads its own model: more than the cores only thrashes
            raise RunError(f"--procs {a.procs} is more than the {cores} CPU cores here; use at most {cores}")
        if config.device.startswith("cuda"):
            raise RunError(f"--procs runs on the CPU, the run asks for --device {config.device}; use --gpus")
        devices = [""] * a.procs
    else:
        if config.device not in ("auto", "cuda", "cuda:0"):
            raise RunError(f"--gpus gives each shard one GPU (its cuda:0); the run asks for --device {config.device}: "
                           f"leave --device out")
        devices = gpu_list(a.gpus, dict(os.environ))
    prepare(config, out, ra.fresh)
    failed = run_local(out, child_argv, devices, a.quiet)
    return 130 if failed is None else conclude(out, len(devices), failed)  # None: interrupted
