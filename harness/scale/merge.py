"""Merging a run's rows files and writing its summary and reports (:func:`summarize_and_render`).

A run folder's rows are the union of ``rows.jsonl`` and the shard files ``rows.shard-I-of-N.jsonl``
(:mod:`harness.scale.shard`), deduplicated by row key (the same key gives the same row, whoever
computed it). ``finish`` writes them back to rows.jsonl in plan order, the order one process
writes them, so the merged rows.jsonl and summary.json are byte-identical to a single-process
run's (report.md and report.html too, but for their measured speed sections); once every planned
row is there the shard files go. Each row's speed line (``speed.jsonl``, :mod:`harness.report.speed`) is
merged the same way, by the same key. Rows a run planned but does not hold are named in report.md,
per shard, with how to resume them.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from harness.run.lock import LOCK_NAME, RunLock, RunLocked, describe, holder, owner
from harness.report.markdown import write_markdown
from harness.run.rows import atomic_write, dumps, row_key
from harness.report.run_data import RunData, read_run
from harness.scale.shard import ROWS_NAME, ROWS_STEM, SPEED_STEM, Plan, Shard, in_plan_order, read_plan, shard_files, stored_lines
from harness.report.speed import merge_speed, summarize_speed_by_task
from harness.report.summary import summarize_run

#: seconds a process waits for another's brief hold of the folder's lock (a shard starting, a merge)
MERGE_WAIT_S = 600.0


def stored_rows(out: Path, repair: Path | None = None) -> list[dict]:
    """Every complete row of rows.jsonl and the shard files, first occurrence of each key kept
    (:func:`harness.scale.shard.stored_lines`; ``repair``: the file this process writes)."""
    return stored_lines(out, ROWS_STEM, repair)


@dataclass
class ShardState:
    shard: Shard | None  # None: the single-process view of the run
    planned: int
    done: int
    running: bool

    @property
    def complete(self) -> bool:
        return self.done >= self.planned


def shard_counts(out: Path) -> list[int]:
    """Shard counts seen in ``out`` (rows files and locks), the most recently written first."""
    seen: dict[int, float] = {}
    for pattern in ("rows.shard-*-of-*.jsonl", f"{LOCK_NAME}.shard-*-of-*"):
        for p in Path(out).glob(pattern):
            tail = p.name.removesuffix(".jsonl").rpartition("-of-")[2]
            if tail.isdigit() and int(tail) > 0:
                try:
                    seen[int(tail)] = max(seen.get(int(tail), 0.0), p.stat().st_mtime)
                except FileNotFoundError:
                    continue
    return sorted(seen, key=lambda n: -seen[n])


def states(out: Path, plan: Plan, keys: set, count: int | None = None) -> list[ShardState]:
    """Per shard of ``count`` (default: the latest count seen, else one process): rows planned,
    rows stored (in any file), and whether its process is alive."""
    counts = shard_counts(out)
    count = count or (counts[0] if counts else 1)
    if count == 1:
        planned = plan.keys()
        return [ShardState(None, len(planned), sum(k in keys for k in planned),
                           holder(Path(out) / LOCK_NAME) is not None)]
    found = []
    for i in range(count):
        shard = Shard(i, count)
        planned = plan.shard_keys(shard)
        found.append(ShardState(shard, len(planned), sum(k in keys for k in planned),
                                holder(Path(out) / shard.lock_name) is not None))
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


def finish(out: Path) -> bool:
    """Merge the shard files into rows.jsonl (plan order) and write summary.json, report.md and
    report.html; the caller holds the folder's lock. Returns whether every planned row is stored
    (then the shard files whose shard is not running are removed)."""
    out = Path(out)
    plan, files, speed_files = read_plan(out), shard_files(out), shard_files(out, SPEED_STEM)
    rows = stored_rows(out)
    if files:
        rows = in_plan_order(rows, plan)
        atomic_write(out / ROWS_NAME, "".join(dumps(r) + "\n" for r in rows))
    speed_merged = merge_speed(out, plan)
    note = incomplete_note(out, plan, rows)
    summarize_and_render(read_run(out, rows), note)  # the rows read once, above
    if note:
        return False
    for shard in {**files, **speed_files}:
        lock = RunLock(out, shard.lock_name, role="merge")
        if lock.try_acquire() is None:  # its process is gone: rows.jsonl (speed.jsonl) holds its lines now
            try:
                (out / shard.rows_name).unlink(missing_ok=True)
                if speed_merged:  # else its lines are still only there
                    (out / shard.speed_name).unlink(missing_ok=True)
            finally:
                lock.release()
    return True


def summarize_and_render(run: RunData, notes: list[str] = ()) -> Path:
    """summary.json, then report.md with its plots and report.html, of ``run``: rows -> summary -> renderers.
    Both renderers take the summary as summary.json holds it (floats at 7 significant digits), so a report
    rebuilt later from the same rows has the same bytes. ``notes``: report.md's lines under its title."""
    from harness.report.html import write_run_page  # here: plotly loads only when a report is written

    text = dumps(summarize_run(run), indent=2) + "\n"
    atomic_write(run.path / "summary.json", text)
    summary = json.loads(text)
    speed = summarize_speed_by_task(run.speed, summary)
    path = write_markdown(run, summary, speed, notes)
    write_run_page(run, summary, speed)
    return path


def report(out: Path) -> bool:
    """``harness report RUN``: ``finish`` under the folder's lock (waiting for a shard's start or a
    merge, which hold it briefly); a single-process run still going holds it to its end, and is
    refused in one line (its own report is written as it ends; shards' runs can be reported while they
    go, their rows merged so far)."""
    if not (Path(out) / "config.json").is_file():
        raise FileNotFoundError(f"{out} is not a run folder (no config.json); runs are under reports/")
    lock = RunLock(out, role="report", wait=MERGE_WAIT_S)
    try:
        lock.acquire()
    except RunLocked:
        raise RunLocked(f"{out} is being written by a run still going ({describe(owner(lock.path))}); its "
                        f"report is written when it ends (a run launched as shards can be reported while it "
                        f"goes)") from None
    try:
        return finish(out)
    finally:
        lock.release()
