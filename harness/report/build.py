"""The one way from a run folder's rows to its reports: merge the line files (:mod:`harness.scale.merge`),
summarize (:mod:`harness.report.summary`), then render the report's content (:mod:`harness.report.model`)
as report.md (:mod:`harness.report.markdown`) and report.html (:mod:`harness.report.html`)."""
from __future__ import annotations

import json
from pathlib import Path

from harness.report.markdown import write_markdown
from harness.report.model import build_report
from harness.report.run_data import RunData, read_run
from harness.report.speed import summarize_speed_by_task
from harness.report.summary import summarize_run
from harness.run.folder import RunFolder
from harness.run.claim import refuse_not_regular
from harness.run.lock import NotALock, RunLock, RunLocked, describe, owner
from harness.run.rows import atomic_write, dumps
from harness.scale.merge import MERGE_WAIT_S, drop_shard_files, merge


def finish(out: Path) -> bool:
    """Merge the shard files into rows.jsonl (plan order) and write summary.json, report.md and
    report.html; the caller holds the folder's lock. Returns whether every planned row is stored
    (then the shard files whose shard is not running are removed)."""
    rows, note, speed_merged = merge(out)
    write_reports(read_run(out, rows), note)  # the rows read once, above
    if note:
        return False
    drop_shard_files(out, speed_merged)
    return True


def write_reports(run: RunData, notes: list[str] = ()) -> Path:
    """summary.json, then report.md with its plots and report.html, of ``run``: rows -> summary -> the report's
    content (:func:`harness.report.model.build_report`) -> its two renderings. Both take the summary as
    summary.json holds it (floats at 7 significant digits), so a report rebuilt later from the same rows has the
    same bytes. ``notes``: the lines under the report's title (what a run has not stored yet)."""
    from harness.report.html import write_run_page  # here: plotly loads only when a report is written

    text = dumps(summarize_run(run), indent=2) + "\n"
    atomic_write(RunFolder(run.path).summary, text)
    summary = json.loads(text)
    report = build_report(run, summary, summarize_speed_by_task(run.speed, summary), notes)
    path = write_markdown(report, run.path)
    write_run_page(report, run.path)
    return path


def report(out: Path) -> bool:
    """``harness report RUN``: ``finish`` under the folder's lock (waiting for a shard's start or a
    merge, which hold it briefly); a single-process run still going holds it to its end, and is
    refused in one line (its own report is written as it ends; shards' runs can be reported while they
    go, their rows merged so far)."""
    if not RunFolder(out).config.is_file():
        raise FileNotFoundError(f"{out} is not a run folder (no {RunFolder.CONFIG}); runs are under reports/")
    refuse_not_regular(out)
    lock = RunLock(out, role="report", wait=MERGE_WAIT_S)
    try:
        lock.acquire()
    except NotALock:
        raise
    except RunLocked:
        raise RunLocked(f"{out} is being written by a run still going ({describe(owner(lock.path))}); its "
                        f"report is written when it ends (a run launched as shards can be reported while it "
                        f"goes)") from None
    try:
        return finish(out)
    finally:
        lock.release()
