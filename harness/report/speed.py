"""The reports' speed sections: the prefill seconds, decode rate and peak device memory of each row's
rollout, from speed.jsonl (its lines: :mod:`harness.run.lines`).

A text rollout's first forward is shared (:mod:`adapters.cache.shared_prefill`): computed once per prompt
batch, natively, and replayed into each configuration's cache. The table keeps the two apart: *shared
forward* is that forward (the batch's cost, paid once, the same seconds in every configuration of the
batch), *own prefill* the configuration's replay and encode of it (its whole first step where nothing
was shared); *capture* the seconds graphed decode steps took to warm up and capture (once per process,
configuration and batch shape), outside the decode rate.

Reports show, per task and configuration, each figure's mean ± 95% interval over rollouts × codec
seeds (:func:`harness.stats.intervals.interval`, a rollout in the place of a prompt, so a batch counts once,
not once per prompt; the report's :class:`harness.report.sections.Speed` section, whose columns, notes and
cells are written here), between the markers ``BEGIN`` and ``END`` in report.md and report.html:
everything outside them is byte-identical for identical rows. A run folder without speed.jsonl (written before
it existed) shows no speed section.
"""
from __future__ import annotations

import re

from typing import TYPE_CHECKING

from harness.report.formatting import fmt_ci
from harness.run.folder import RunFolder
from harness.run.rows import num, codec_seed
from harness.stats.intervals import interval

if TYPE_CHECKING:
    from harness.report.sections import SpeedRow

SPEED_NAME = RunFolder.lines_name(RunFolder.SPEED)
#: report.md's speed sections are between these (comments: Markdown viewers show nothing of them)
BEGIN, END = "<!-- speed: measured, differs between identical runs -->", "<!-- /speed -->"
MIB = 2 ** 20


# --- summaries ------------------------------------------------------------------------------------
def _cells(lines: list[dict], field: str, scale: float = 1.0) -> dict[tuple[str, int], float]:
    """{(rollout, codec seed): value}: one cell per rollout (its rows share the value)."""
    return {(str(r.get("rollout", r["prompt"])), codec_seed(r)): num(r[field]) / scale
            for r in lines if num(r.get(field)) is not None}


def _entry(cells: dict) -> dict | None:
    if not cells:
        return None
    iv = interval(cells)
    return {"mean": iv.mean, "ci95": iv.ci95, "n": iv.n}


def summarize_speed(lines: list[dict], task: str, labels: list[str]) -> list[dict]:
    """Per configuration of ``task`` (in ``labels``' order) that has lines: {label, rollouts,
    sequences (per rollout, sorted), devices, unit, prefill_shared, shared_forward (s, the batch's shared
    native forward), prefill (s, this configuration's own part), capture (s, graphed steps' warm-up and
    capture), decode (units/s), peak (MiB)}; each figure {mean, ci95, n} or None where nothing measured it
    (no decode; no shared forward; nothing captured; the CPU's peak memory)."""
    out = []
    for label in labels:
        mine = [r for r in lines if r["task"] == task and r["label"] == label]
        if not mine:
            continue
        out.append({
            "label": label,
            "rollouts": len({(r.get("rollout", r["prompt"]), codec_seed(r)) for r in mine}),
            "sequences": sorted({int(r.get("sequences", 1)) for r in mine}),
            "devices": sorted({str(r.get("device")) for r in mine if r.get("device")}),
            "unit": next((r["decode_unit"] for r in mine if r.get("decode_unit")), "token"),
            "prefill_shared": any(r.get("prefill_shared") for r in mine),
            "shared_forward": _entry(_cells(mine, "shared_forward_s")),
            "prefill": _entry(_cells(mine, "prefill_s")),
            "capture": _entry(c) if any((c := _cells(mine, "capture_s")).values()) else None,
            "decode": _entry(_cells(mine, "decode_per_s")),
            "peak": _entry(_cells(mine, "peak_bytes", MIB)),
        })
    return out


def summarize_speed_by_task(lines: list[dict], summary: dict) -> dict[str, list[dict]]:
    """{task: :func:`summarize_speed` over its configurations in ``summary``'s order}: what both reports show."""
    return {task: summarize_speed(lines, task, [g["label"] for g in t["groups"]])
            for task, t in summary["tasks"].items()}


# --- what the reports show ---------------------------------------------------------------------------
NOTHING_DECODED = "nothing decoded"
NO_PEAK = "not measured on the CPU"
NOT_SHARED = "not shared"
NOT_CAPTURED = "none captured"


def columns(rows: list[SpeedRow]) -> list[str]:
    unit = rows[0].unit if rows else "token"
    return ["config", "rollouts", "sequences per rollout", "shared forward s (once per batch), mean ± 95%",
            "own prefill s (replay + encode), mean ± 95%", f"decode {unit}s/s, mean ± 95%",
            "capture s (once per shape), mean ± 95%", "peak memory MiB, mean ± 95%", "device"]


def notes(rows: list[SpeedRow]) -> list[str]:
    """The sentences under the table: what each figure is, and that it is measured."""
    unit = rows[0].unit if rows else "token"
    shared = any(e.prefill_shared for e in rows)
    text = [f"Measured on this run's device, so it differs from one identical run to the next ({SPEED_NAME}; "
            "rows.jsonl and summary.json hold none of it). Mean ± 95% interval over rollouts × codec seeds; "
            "a batched rollout counts once, its rows sharing its figures.",
            "*Shared forward*: the native first forward of a prompt batch, computed once and replayed into "
            "every configuration's cache (the batch's cost, paid once: the same seconds in each configuration"
            + ("" if shared else f"; {NOT_SHARED}: each rollout computed its own") + "); "
            "*own prefill*: this configuration's part of its first step, the replay and encode of the shared "
            "forward (where not shared, its whole first forward into the empty cache)"
            + "; *capture*: warming up and capturing graphed decode steps, once per process, configuration and "
            f"batch shape, outside the decode's seconds ({NOT_CAPTURED}: eager steps, or steps captured by an "
            "earlier rollout)"
            + f"; *decode*: {unit}s generated after the first, over the rollout's batch, per second of decode"
            + (f" ({NOTHING_DECODED}: teacher forcing generates none)" if any(e.decode is None for e in rows)
               else "")
            + "; *peak memory*: torch.cuda.max_memory_allocated over the rollout, weights included"
            + (f" ({NO_PEAK}: it has no allocator counter to read)" if any(e.peak is None for e in rows)
               else "") + "."]
    return text


def cells_text(e: SpeedRow) -> list[str]:
    """A configuration's cells as text, as both reports show them."""
    seqs = e.sequences
    return [e.label, str(e.rollouts), "–".join(map(str, (seqs[0], seqs[-1]) if len(seqs) > 1 else seqs)),
            fmt_ci(e.shared_forward, with_n=False) if e.shared_forward else NOT_SHARED,
            fmt_ci(e.prefill, with_n=False),
            fmt_ci(e.decode, with_n=False) if e.decode else NOTHING_DECODED,
            fmt_ci(e.capture, with_n=False) if e.capture else NOT_CAPTURED,
            fmt_ci(e.peak, with_n=False) if e.peak else NO_PEAK, ", ".join(e.devices) or "—"]


def sort_keys(e: SpeedRow) -> list:
    """The numbers the HTML table sorts each of :func:`cells_text`'s cells by (None: by its text)."""
    means = [x.mean if x else None for x in (e.shared_forward, e.prefill, e.decode, e.capture, e.peak)]
    return [None, e.rollouts, e.sequences[-1], *means, None]


def without_speed(text: str) -> str:
    """``text`` (report.md or report.html) without its speed sections: what identical runs share."""
    return re.sub(re.escape(BEGIN) + r".*?" + re.escape(END) + r"\n\n?", "", text, flags=re.S)
