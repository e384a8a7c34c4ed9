"""Merging a run's line files: the union of ``rows.jsonl`` and the shard files ``rows.shard-I-of-N.jsonl``
(:mod:`harness.scale.shard`), deduplicated by row key (the same key gives the same row, whoever computed it),
written back to rows.jsonl in plan order (:mod:`harness.run.plan`), the order one process writes them, so the
merged rows.jsonl is byte-identical to a single-process run's; speed.jsonl the same way, by the same key. Once
every planned row is stored the shard files go. Rows a run planned but does not hold are named, per shard,
with how to resume them (:func:`incomplete_note`, which the report shows). Writing the reports is
:mod:`harness.report.build`'s.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness.run.folder import RunFolder
from harness.run.lines import read_speed, stored_rows
from harness.run.lock import RunLock, holder
from harness.run.plan import Plan, in_plan_order, read_plan
from harness.run.rows import atomic_write, dumps, row_key
from harness.scale.shard import Shard, shard_files

#: seconds a process waits for another's brief hold of the folder's lock (a shard starting, a merge)
MERGE_WAIT_S = 600.0


@dataclass
class ShardState:
    shard: Shard | None  # None: the single-process view of the run
    planned: int
    done: int
    running: bool

    @property
    def complete(self) -> bool:
        return self.done >= self.planned


def states(out: Path, plan: Plan, keys: set, count: int | None = None) -> list[ShardState]:
    """Per shard of ``count`` (default: the latest count seen, else one process): rows planned,
    rows stored (in any file), and whether its process is alive."""
    folder = RunFolder(out)
    counts = folder.shard_counts()
    count = count or (counts[0] if counts else 1)
    if count == 1:
        planned = plan.keys()
        return [ShardState(None, len(planned), sum(k in keys for k in planned), holder(folder.lock()) is not None)]
    found = []
    for i in range(count):
        shard = Shard(i, count)
        planned = plan.shard_keys(shard)
        found.append(ShardState(shard, len(planned), sum(k in keys for k in planned),
                                holder(folder.lock(shard.tag)) is not None))
    return found


def incomplete_note(out: Path, plan: Plan | None, rows: list[dict]) -> list[str]:
    """report.md's lines naming what is missing and how to resume it; none when complete."""
    if plan is None:
        return []
    keys = {row_key(r) for r in rows}
    planned = plan.keys()
    have = sum(k in keys for k in planned)
    if have == len(planned):
        return []
    parts = []
    for s in states(out, plan, keys):
        if s.complete or s.shard is None:
            continue
        what = "running" if s.running else ("not started" if s.done == 0 else "stopped")
        parts.append(f"{s.shard} has {s.done} of {s.planned} rows ({what})")
    head = f"**Incomplete**: {have} of {len(planned)} planned rows are stored"
    how = ("rerun the same `harness launch` / `harness run --shard I/N` command to resume them" if parts else
           "rerun the same `harness run` command to resume")
    return [head + ("; " + "; ".join(parts) if parts else "") + f"; {how} (rows already stored are kept).", ""]


def complete(out: Path) -> bool:
    """Whether every row of the run's plan is stored (in any rows file)."""
    plan = read_plan(out)
    if plan is None:
        return False
    keys = {row_key(r) for r in stored_rows(out)}
    return all(k in keys for k in plan.keys())


def merge_speed(out: Path, plan: Plan | None) -> bool:
    """speed.jsonl := the union of the speed files in plan order (where shard files exist). Returns
    False where a damaged file kept it from merging: the shard files must then stay."""
    if not shard_files(out, RunFolder.SPEED):
        return True
    lines, problem = read_speed(out)
    if problem is None:
        atomic_write(RunFolder(out).lines(RunFolder.SPEED), "".join(dumps(r) + "\n" for r in in_plan_order(lines, plan)))
    return problem is None


def merge(out: Path) -> tuple[list[dict], list[str], bool]:
    """Merge the shard files into rows.jsonl and speed.jsonl (plan order); the caller holds the folder's
    lock. Returns (the rows, the lines naming what is missing, whether speed.jsonl merged)."""
    folder = RunFolder(out)
    plan = read_plan(out)
    rows = stored_rows(out)
    if shard_files(out):
        rows = in_plan_order(rows, plan)
        atomic_write(folder.rows, "".join(dumps(r) + "\n" for r in rows))
    return rows, incomplete_note(out, plan, rows), merge_speed(out, plan)


def drop_shard_files(out: Path, speed_merged: bool) -> None:
    """Once every planned row is in rows.jsonl: remove the shard files whose shard is not running."""
    out = Path(out)
    for shard in {**shard_files(out), **shard_files(out, RunFolder.SPEED)}:
        lock = RunLock(out, shard.lock_name, role="merge")
        if lock.try_acquire() is None:  # its process is gone: rows.jsonl (speed.jsonl) holds its lines now
            try:
                (out / shard.rows_name).unlink(missing_ok=True)
                if speed_merged:  # else its lines are still only there
                    (out / shard.file_name(RunFolder.SPEED)).unlink(missing_ok=True)
            finally:
                lock.release()
