"""The processes of a launched run (``harness launch``, :mod:`harness.cli.launch`): one ``harness run --shard
I/N`` process per shard, pinned to its GPU with CUDA_VISIBLE_DEVICES, its output in RUN/logs/shard-I-of-N.log, or
a Slurm array's tasks (:mod:`harness.scale.slurm`); one progress line shows every shard's rows until all ended.
Shards already complete (by the run's plan.json) are not started again.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from harness.run.config import RunError
from harness.run.folder import RunFolder
from harness.run.claim import refuse_links
from harness.run.input_files import read_bytes
from harness.run.lines import stored_rows
from harness.run.plan import read_plan
from harness.run.rows import UnsafePath, open_append, open_file, row_key
from harness.scale.merge import states
from harness.scale.shard import Shard

#: variables that would make a child pick its shard or GPU itself: the launcher says both
CHILD_UNSET = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_ARRAY_TASK_ID",
               "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_MIN")

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
        try:
            data = read_bytes(path, "rows file")[start:]  # a regular file of bounded size (a shard's own rows)
        except (OSError, ValueError):
            return
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
        folder = RunFolder(self.out)
        for path in [folder.rows, *(folder.lines(folder.ROWS, Shard(i, self.count).tag) for i in range(self.count))]:
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


def watch(out: Path, workers: dict[int, object], count: int, quiet: bool, poll, failure) -> dict[int, str]:
    """Show progress until every worker ended; ``poll(worker)``: exit status or None; ``failure(i,
    worker)``: a line naming what failed and where its log is. Returns {shard index: that line} of the
    shards that failed (empty: none)."""
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
    return {i: failure(i, workers[i]) for i, rc in exited.items() if rc != 0}


def last_line(path: Path, tail: int = 1 << 16) -> str:
    """The log's last non-blank line (of its last ``tail`` bytes), read only from a file of one name."""
    try:
        with os.fdopen(open_file(path, os.O_RDONLY), "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - tail))
            lines = [ln for ln in f.read().decode("utf-8", errors="replace").splitlines() if ln.strip()]
    except (OSError, UnsafePath):
        lines = []
    return (lines[-1].strip() if lines else "no output") + f" (log: {path})"


def run_local(out: Path, run_argv: list[str], devices: list[str], quiet: bool) -> dict[int, str] | None:
    """One ``harness run --shard I/N`` process per entry of ``devices`` (its CUDA_VISIBLE_DEVICES), watched to
    their end (:func:`watch`: the shards that failed, and why); None where interrupted (the children stop)."""
    import harness

    count = len(devices)
    folder = RunFolder(out)
    refuse_links(out)  # claimed already; again here, where the logs are opened (a link planted since)
    folder.logs.mkdir(exist_ok=True)
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
            with open_append(folder.log(shard.tag)) as log:  # no link of either kind, no pipe
                procs[i] = subprocess.Popen(
                    [sys.executable, "-m", "harness.cli", "run", *run_argv, "--out", str(out), "--quiet",
                     "--shard", f"{i}/{count}"], env=env, stdout=log, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL)
        return watch(out, procs, count, quiet, lambda p: p.poll(),
                     lambda i, p: f"exit {p.returncode}: {last_line(folder.log(Shard(i, count).tag))}")
    except KeyboardInterrupt:
        print(f"harness launch: interrupted; the shards stop, their rows are kept: rerun the same command to "
              f"resume ({out})", file=sys.stderr)
        return None
    finally:
        for p in procs.values():  # an interrupted launch stops its own children
            if p.poll() is None:
                p.terminate()
                p.wait()




def run_slurm(config: dict, out: Path, count: int, slurm, run, detach: bool, quiet: bool) -> dict[int, str] | None:
    """The shards of ``out`` not yet complete as one submitit array of ``run`` (:mod:`harness.scale.slurm`),
    watched to their end unless ``detach`` (then None)."""
    from harness.scale.slurm import job_failure, job_status, submit

    done = complete_shards(out, count)
    jobs = submit(config, out, [i for i in range(count) if i not in done], count, slurm, run)
    if detach:
        print(f"follow with: harness report {out}")
        return None
    return watch(out, jobs, count, quiet, job_status, job_failure)
