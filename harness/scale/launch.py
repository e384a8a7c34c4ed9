"""harness launch: one run as N shards (harness/scale/shard.py), one process per shard.

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

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from tyro.conf import arg, create_mutex_group

from harness.cli.commands import RunCommand, parse_run
from harness.run.config import RunConfig, RunError
from harness.run.flags import parse
from harness.run.lock import RunLock
from harness.scale.merge import MERGE_WAIT_S, finish, states, stored_rows
from harness.run.rows import row_key
from harness.run.folder import claim_out, make_out, refuse_live_shards, wipe, write_config
from harness.scale.shard import ROWS_NAME, Shard, read_plan, shard_files
from harness.scale.slurm import SlurmConfig, job_failure, job_status, submit

#: variables that would make a child pick its shard or GPU itself: the launcher says both
CHILD_UNSET = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_ARRAY_TASK_ID",
               "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_MIN")


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


def gpu_list(spec: str, env: dict) -> list[str]:
    """CUDA_VISIBLE_DEVICES values, one per shard: '0,2' -> those visible GPUs, '3' -> the first 3."""
    visible = [d.strip() for d in env["CUDA_VISIBLE_DEVICES"].split(",") if d.strip()] \
        if "CUDA_VISIBLE_DEVICES" in env else None
    if visible is None:
        import torch

        visible = [str(i) for i in range(torch.cuda.device_count())]
    try:
        picks = [int(v) for v in spec.split(",") if v.strip()] if "," in spec else list(range(int(spec)))
    except ValueError:
        raise RunError(f"--gpus takes indices (0,1,3) or a count (4), got '{spec}'") from None
    if not picks:
        raise RunError(f"--gpus {spec}: no GPU named; give indices (0,1) or a count (2)")
    if not visible:
        raise RunError(f"--gpus {spec}: no CUDA device is visible here; use --procs N for CPU processes")
    bad = [i for i in picks if not 0 <= i < len(visible)]
    if bad or len(set(picks)) != len(picks):
        raise RunError(f"--gpus {spec}: {len(visible)} GPU(s) are visible (0..{len(visible) - 1}), each used once")
    return [visible[i] for i in picks]


def prepare(config: RunConfig, out: Path, fresh: bool) -> None:
    """Claim ``out`` for the run's shards (``--fresh``: start it over here, once) and write config.json."""
    make_out(out)
    with RunLock(out, role="start", wait=MERGE_WAIT_S):
        refuse_live_shards(out)
        claim_out(config, out, fresh)
        if fresh:
            wipe(out)
        write_config(config, out)


class Progress:
    """One line for every shard: rows stored of rows planned (from plan.json and the rows files,
    read incrementally)."""

    def __init__(self, out: Path, count: int, quiet: bool):
        from tqdm.auto import tqdm

        self.out, self.count = out, count
        self.keys: set = set()
        self.offsets: dict[Path, tuple[int, int]] = {}  # path -> (inode, bytes read)
        self.bar = tqdm(total=None, desc=f"{count} shards", unit="row", disable=quiet, dynamic_ncols=True)

    def _read(self, path: Path) -> None:
        try:
            st = path.stat()
        except FileNotFoundError:
            return
        inode, start = self.offsets.get(path, (st.st_ino, 0))
        if inode != st.st_ino or st.st_size < start:  # replaced by a merge: read it again
            start = 0
        with open(path, "rb") as f:
            f.seek(start)
            data = f.read()
        end = data.rfind(b"\n") + 1
        for line in data[:end].splitlines():
            try:
                self.keys.add(row_key(json.loads(line)))
            except (ValueError, KeyError, TypeError):
                continue
        self.offsets[path] = (st.st_ino, start + end)

    def update(self, exited: dict[int, int]) -> None:
        plan = read_plan(self.out)
        if plan is None:
            self.bar.set_postfix_str("loading the model")
            return
        for path in [self.out / ROWS_NAME, *(self.out / Shard(i, self.count).rows_name for i in range(self.count))]:
            self._read(path)
        found = states(self.out, plan, self.keys, self.count)
        self.bar.total = sum(s.planned for s in found)
        self.bar.n = sum(s.done for s in found)
        self.bar.set_postfix_str(" ".join(
            f"{i}:{s.done}/{s.planned}" + ("" if i not in exited else " done" if exited[i] == 0 else " FAILED")
            for i, s in enumerate(found)), refresh=False)
        self.bar.refresh()

    def close(self) -> None:
        self.bar.close()


def complete_shards(out: Path, count: int) -> set[int]:
    """The shards of ``count`` whose planned rows are all stored (none where there is no plan yet)."""
    plan = read_plan(out)
    if plan is None:
        return set()
    keys = {row_key(r) for r in stored_rows(out)}
    return {i for i, s in enumerate(states(out, plan, keys, count)) if s.complete}


def wait_all(out: Path, workers: dict[int, object], count: int, quiet: bool, poll, failure) -> int:
    """Show progress until every worker ended; ``poll(worker)``: exit status or None; ``failure(i,
    worker)``: a line naming what failed and where its log is. Returns launch's exit status."""
    progress = Progress(out, count, quiet)
    exited: dict[int, int] = {}
    try:
        while len(exited) < len(workers):
            for i, w in workers.items():
                if i not in exited and (rc := poll(w)) is not None:
                    exited[i] = rc
            progress.update(exited)
            time.sleep(0.5 if len(exited) < len(workers) else 0)
    finally:
        progress.close()
    failed = {i: rc for i, rc in exited.items() if rc != 0}
    complete = len(complete_shards(out, count)) == count
    if read_plan(out) is not None and (failed or shard_files(out)):
        # a shard failed (the report names what is missing), or the last merge did not run
        with RunLock(out, role="merge", wait=MERGE_WAIT_S):
            complete = finish(out)
    for i in failed:
        print(f"harness launch: {Shard(i, count)} failed: {failure(i, workers[i])}; rerun the same command to "
              f"resume it", file=sys.stderr)
    if not failed and complete:
        print(f"report: {out / 'report.md'} and {out / 'report.html'}")
    elif not failed:  # every process ended well, yet rows are missing (e.g. shards of another count ran beside)
        print(f"harness launch: every shard ended, yet rows are missing ({out / 'report.md'} names them); rerun "
              f"the same command to run them", file=sys.stderr)
    return 1 if failed or not complete else 0


def last_line(path: Path) -> str:
    try:
        lines = [ln for ln in path.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip()]
    except OSError:
        lines = []
    return (lines[-1].strip() if lines else "no output") + f" (log: {path})"


def run_local(out: Path, run_argv: list[str], devices: list[str], quiet: bool) -> int:
    """One ``harness run --shard I/N`` process per entry of ``devices`` (its CUDA_VISIBLE_DEVICES)."""
    import harness

    count = len(devices)
    logs = out / "logs"
    logs.mkdir(exist_ok=True)
    root = str(Path(harness.__file__).resolve().parents[1])  # the children import this very harness
    done = complete_shards(out, count)
    procs: dict[int, subprocess.Popen] = {}
    try:
        for i, dev in enumerate(devices):
            if i in done:
                continue
            env = {k: v for k, v in os.environ.items() if k not in CHILD_UNSET}
            env.update(CUDA_VISIBLE_DEVICES=dev, PYTHONUNBUFFERED="1", PYTHONPATH=os.pathsep.join([root, *filter(None, [
                os.environ.get("PYTHONPATH")])]))
            shard = Shard(i, count)
            with open(logs / f"{shard.tag}.log", "a", encoding="utf-8") as log:
                procs[i] = subprocess.Popen(
                    [sys.executable, "-m", "harness.cli", "run", *run_argv, "--out", str(out), "--quiet",
                     "--shard", f"{i}/{count}"], env=env, stdout=log, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL)
        return wait_all(out, procs, count, quiet, lambda p: p.poll(),
                        lambda i, p: f"exit {p.returncode}: {last_line(logs / f'{Shard(i, count).tag}.log')}")
    except KeyboardInterrupt:
        print(f"harness launch: interrupted; the shards stop, their rows are kept: rerun the same command to "
              f"resume ({out})", file=sys.stderr)
        return 130
    finally:
        for p in procs.values():  # an interrupted launch stops its own children
            if p.poll() is None:
                p.terminate()
                p.wait()


def run_slurm(config: RunConfig, out: Path, count: int, slurm: SlurmConfig, detach: bool, quiet: bool) -> int:
    """The shards of ``out`` not yet complete as one submitit array; wait for them (one progress line)
    unless ``detach``."""
    done = complete_shards(out, count)
    jobs = submit(config, out, [i for i in range(count) if i not in done], count, slurm)
    if detach:
        print(f"follow with: harness report {out}")
        return 0
    return wait_all(out, jobs, count, quiet, job_status, job_failure)


def main(argv: list[str]) -> int:
    from harness.runner import plan, resolve

    own, run_argv = split(argv)
    a = parse_launch(own)
    ra = run_command(run_argv)
    config, _ = resolve(ra.config)  # every run argument checked, and prompts read, before anything starts
    plan(config)
    out = Path(ra.out or config.default_out()).absolute()
    child_argv = [x for x in run_argv if x != "--fresh"]
    if a.slurm:
        if not a.shards or a.shards < 1:
            raise RunError("--slurm needs --shards N (N >= 1): the number of array tasks")
        slurm = a.cluster
        slurm.validate()
        prepare(config, out, ra.fresh)
        return run_slurm(config, out, a.shards, slurm, a.detach, a.quiet)
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
    return run_local(out, child_argv, devices, a.quiet)
