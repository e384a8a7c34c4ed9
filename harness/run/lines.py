"""The line files of a run (rows, speed, timings: one JSON line per row key, :attr:`RunFolder.LINE_STEMS`)
read back with their shards' files, and a row's speed line.

Speed gets a file of its own because its figures are measured: two identical runs give different ones, and
rows.jsonl and summary.json must stay byte-identical (they hold none of them). A speed line is keyed like its
row, so it is appended, resumed (a resumed run skips stored rows and their lines with them) and merged from
shards as rows are; where a key has two lines (its row deleted by hand and computed again), the latest counts.
It holds its rollout's :meth:`adapters.cache.rollout_clock.RolloutClock.record`, the device it ran on, and
``rollout``: the first prompt of the rows that rollout produced (a batched rollout scores several prompts at
once; its rows share its figures). The report's speed tables are :mod:`harness.report.speed`'s.
"""
from __future__ import annotations

from pathlib import Path

from harness.run.folder import RunFolder
from harness.run.rows import CorruptRows, dumps, read_rows, row_key


def stored_lines(out: Path, stem: str = RunFolder.ROWS, repair: Path | None = None, last: bool = False) -> list[dict]:
    """Every complete line of ``STEM.jsonl`` and its shard files, one per row key: its first
    occurrence (``last``: its latest, in its first occurrence's place). ``repair``: the one file this
    process writes, whose torn last line (a crash) is cut off; the others may be mid-append by their
    own process, and their partial last line is only skipped."""
    folder = RunFolder(out)
    found: dict = {}
    for path in [folder.lines(stem), *folder.shard_files(stem).values()]:
        for r in read_rows(path, repair=path == repair):
            key = row_key(r)
            if last or key not in found:
                found[key] = r
    return list(found.values())


def stored_rows(out: Path, repair: Path | None = None) -> list[dict]:
    """Every complete row of rows.jsonl and the shard files, first occurrence of each key kept
    (``repair``: the file this process writes)."""
    return stored_lines(out, RunFolder.ROWS, repair)


def speed_line(key: tuple[str, str, str, int], rollout: str, record: dict, device: str | None) -> str:
    """A row's speed line: its key, the rollout that produced it, the device's name, the clock's record."""
    task, prompt, label, seed = key
    return dumps({"task": task, "prompt": prompt, "label": label, "codec_seed": seed, "rollout": rollout,
                  "device": device, **record})


def read_speed(out: Path) -> tuple[list[dict], str | None]:
    """(every stored line of speed.jsonl and its shard files, one per row key; why they could not
    be read, or None). A damaged speed file never stops a merge or a report: it is named instead."""
    try:  # the latest line of a key: a row deleted by hand and run again was timed again
        return stored_lines(out, RunFolder.SPEED, last=True), None
    except CorruptRows as e:
        return [], str(e)
