"""summary.json of a run folder: per task and cache configuration, mean / min / max of every
metric and its mean difference from the baseline on the same prompts, plus the rates."""
from __future__ import annotations

import json
import math
from pathlib import Path

from .rows import BASELINE_LABEL, ID_FIELDS, num, read_rows

RATE_FIELDS = ("bits_per_coord", "value_bits_per_coord", "cache_bits_per_coord", "cache_bytes", "uncompressed_bytes")


def describe_metric(name: str) -> dict:
    """How reports label, sort and plot metric ``name``: the registry's display name, direction
    (None: unknown or neither) and scale; a column the registry does not know is shown as is."""
    from metrics import list_metrics

    m = list_metrics().get(name)
    if m is None:
        return {"name": name, "display": name, "higher_is_better": None, "scale": "linear"}
    return {"name": name, "display": m.display, "higher_is_better": m.higher_is_better, "scale": m.scale}


def _task_metrics(task_name: str, rows: list[dict]) -> list[str]:
    try:
        from harness.tasks import get_task

        names = list(get_task(task_name).metrics)
    except ValueError:
        names = []
    if not names:  # a task we cannot import here: every numeric column that is not a rate or id
        skip = set(RATE_FIELDS) | set(ID_FIELDS)
        names = sorted({k for r in rows for k, v in r.items() if k not in skip and num(v) is not None})
    return names


def _stats(values: list[float]) -> dict:
    finite = [v for v in values if not math.isnan(v)]
    if not finite:
        return {"mean": float("nan"), "min": float("nan"), "max": float("nan")}
    return {"mean": sum(finite) / len(finite), "min": min(finite), "max": max(finite)}


def summarize(out: Path) -> dict:
    out = Path(out)
    config = json.loads((out / "config.json").read_text())
    model = json.loads((out / "model.json").read_text()) if (out / "model.json").exists() else {}
    rows = read_rows(out / "rows.jsonl")
    summary = {"version": 1, "model": config.get("model"), "skipped": model.get("skipped", []), "tasks": {}}
    for task in dict.fromkeys(r["task"] for r in rows):
        trows = [r for r in rows if r["task"] == task]
        metric_names = _task_metrics(task, trows)
        base = {r["prompt"]: r for r in trows if r["label"] == BASELINE_LABEL}
        groups = []
        for label in dict.fromkeys(r["label"] for r in trows):
            grows = [r for r in trows if r["label"] == label]
            g = {"label": label, "codec": grows[0]["codec"], "bits": grows[0]["bits"], "n": len(grows)}
            for f in RATE_FIELDS:
                vals = [num(r.get(f)) for r in grows if num(r.get(f)) is not None]
                if vals:
                    g[f] = sum(vals) / len(vals)
            g["metrics"] = {}
            for m in metric_names:
                vals = [num(r.get(m)) for r in grows]
                vals = [v for v in vals if v is not None]
                if not vals:
                    continue
                s = _stats(vals)
                deltas = [num(r.get(m)) - num(base[r["prompt"]].get(m)) for r in grows
                          if r["prompt"] in base and num(r.get(m)) is not None and num(base[r["prompt"]].get(m)) is not None]
                deltas = [d for d in deltas if not math.isnan(d)]
                s["delta"] = sum(deltas) / len(deltas) if deltas else None
                g["metrics"][m] = s
            groups.append(g)
        summary["tasks"][task] = {
            "metrics": [describe_metric(m) for m in metric_names],
            "prompts": list(dict.fromkeys(r["prompt"] for r in trows)),
            "groups": groups,
        }
    return summary
