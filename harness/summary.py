"""summary.json of a run folder (version 2).

Per task: its metrics (name, display, direction, scale), the ``headline`` metric, prompts and
codec seeds; per cache configuration (``groups``) the rates and, per metric, n (cells: prompts x
codec seeds), mean, min, max, the 95% interval of the mean (``ci95``; :mod:`harness.stats`) and
``delta``, the paired difference from the baseline {mean, ci95, word, n}; per bit width the
``ranking`` on the headline metric with the pairwise comparisons, and the rate-matched
``front`` (:mod:`harness.ranking`). Rows without ``codec_seed`` (older runs) count as seed 0.
"""
from __future__ import annotations

import math
from pathlib import Path

from .input_files import read_run_json
from .ranking import Comparisons, Config, against, front, rank
from .rows import BASELINE_LABEL, ID_FIELDS, codec_seed, num, read_rows
from .stats import interval, paired

SUMMARY_VERSION = 3
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

        # a declared metric that no row carries (one a task option turns on) is left out
        names = [m for m in get_task(task_name).metrics if any(m in r for r in rows)]
    except ValueError:
        names = []
    if not names:  # a task we cannot import here: every numeric column that is not a rate or id
        skip = set(RATE_FIELDS) | set(ID_FIELDS)
        names = sorted({k for r in rows for k, v in r.items() if k not in skip and num(v) is not None})
    return names


def headline(task_name: str, metric_names: list[str]) -> str | None:
    """The metric that ranks configurations: the task's ``headline``, else its first metric."""
    try:
        from harness.tasks import get_task

        cls = get_task(task_name)
        name = getattr(cls, "headline", None) or (cls.metrics[0] if cls.metrics else None)
    except ValueError:
        name = None
    return name if name in metric_names else (metric_names[0] if metric_names else None)


def cells(rows: list[dict], metric: str) -> dict[tuple[str, int], float]:
    """{(prompt, codec seed): value} of ``metric`` over ``rows`` (one configuration); rows without
    a number there are left out."""
    return {(r["prompt"], codec_seed(r)): num(r.get(metric)) for r in rows if num(r.get(metric)) is not None}


def metric_entry(c: dict, base: dict | None, higher_is_better: bool | None) -> dict:
    """n (cells), prompts, codec_seeds, mean, min, max, ci95 (None: n = 1 or not finite), the
    interval's method, and ``delta``: the paired difference from the baseline's cells ``base``."""
    iv = interval(c)
    present = [v for v in c.values() if not math.isnan(v)]
    entry = {"n": iv.n, "prompts": iv.prompts, "codec_seeds": list(iv.seeds), "mean": iv.mean,
             "min": min(present) if present else None, "max": max(present) if present else None,
             "ci95": iv.ci95, "interval": iv.method}
    entry["delta"] = paired(c, base, higher_is_better).to_json() if base is not None else None
    return entry


def _group(label: str, grows: list[dict], metrics: list[dict], base_rows: list[dict]) -> dict:
    g = {"label": label, "codec": grows[0]["codec"], "bits": grows[0]["bits"], "n": len(grows),
         "prompts": len({r["prompt"] for r in grows}), "codec_seeds": sorted({codec_seed(r) for r in grows})}
    for f in RATE_FIELDS:
        vals = [num(r.get(f)) for r in grows if num(r.get(f)) is not None]
        if vals:
            g[f] = sum(vals) / len(vals)
    g["metrics"] = {}
    for m in metrics:
        c = cells(grows, m["name"])
        if c:
            base = cells(base_rows, m["name"]) if base_rows and label != BASELINE_LABEL else None
            g["metrics"][m["name"]] = metric_entry(c, base, m["higher_is_better"])
    return g


def _rankings(groups: list[dict], trows: list[dict], metric: dict) -> tuple[list[dict], list[dict], list[dict]]:
    """(per bit width {bits, configs, pairs}, the rate-matched front, research codecs against the engines'
    deployed caches) on the headline ``metric``."""
    from kernels import CODECS

    kept = [g for g in groups if g["label"] != BASELINE_LABEL and metric["name"] in g["metrics"]]
    configs = [Config(g["label"], g["bits"], cells([r for r in trows if r["label"] == g["label"]], metric["name"]),
                      g.get("cache_bits_per_coord")) for g in kept]
    cmp = Comparisons(configs, metric["higher_is_better"])
    by_bits = [{"bits": b, **rank([c for c in configs if c.bits == b], cmp)} for b in sorted({c.bits for c in configs})]
    engine = {g["label"] for g in kept if getattr(CODECS.get(g["codec"]), "engine_preset", False)}
    deployed = against([c for c in configs if c.label not in engine], [c for c in configs if c.label in engine], cmp)
    return by_bits, front(configs, cmp), deployed


def summarize(out: Path) -> dict:
    out = Path(out)
    config = read_run_json(out / "config.json")
    model = read_run_json(out / "model.json", {})
    rows = read_rows(out / "rows.jsonl")
    summary = {"version": SUMMARY_VERSION, "model": config.get("model"), "skipped": model.get("skipped", []), "tasks": {}}
    for task in dict.fromkeys(r["task"] for r in rows):
        trows = [r for r in rows if r["task"] == task]
        metric_names = _task_metrics(task, trows)
        metrics = [describe_metric(m) for m in metric_names]
        base_rows = [r for r in trows if r["label"] == BASELINE_LABEL]
        groups = [_group(label, [r for r in trows if r["label"] == label], metrics, base_rows)
                  for label in dict.fromkeys(r["label"] for r in trows)]
        head = headline(task, metric_names)
        ranking, rate_front, deployed = _rankings(groups, trows, metrics[metric_names.index(head)]) if head else ([], [], [])
        summary["tasks"][task] = {
            "metrics": metrics,
            "headline": head,
            "prompts": list(dict.fromkeys(r["prompt"] for r in trows)),
            "codec_seeds": sorted({codec_seed(r) for r in trows}),
            "groups": groups,
            "ranking": ranking,
            "front": rate_front,
            "against_deployed": deployed,
        }
    return summary
