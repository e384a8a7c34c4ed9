"""summary.json of a run folder (version 4).

Per task: its metrics (name, display, direction, scale), the ``headline`` metric, prompts and
codec seeds; per cache configuration (``groups``) the rates and, per metric, n (cells: prompts x
codec seeds), mean, min, max, the 95% interval of the mean (``ci95``; :mod:`harness.stats`) and
``delta``, the paired difference from the baseline {mean, ci95, word, n, p, test, mdd}
(:func:`harness.binary_stats.compare`: McNemar's exact test for pass/fail metrics; ``mdd`` the
smallest difference the cells would detect), and with the run's ``--margin`` on the headline metric
``non_inferiority`` {mean, bound, margin, verdict}; per bit width the ``ranking`` on the headline
metric with the pairwise comparisons, and the rate-matched ``front`` (:mod:`harness.ranking`); every
comparison between configurations on the headline metric (not those with the baseline) carries ``q``,
its Benjamini-Hochberg adjusted p-value across all of the task's (``comparisons``: how many), and
``word_bh``, its word after that correction. Rows without
``codec_seed`` (older runs) count as seed 0.
"""
from __future__ import annotations

import math
from pathlib import Path

from .input_files import read_run_json
from .ranking import Comparisons, Config, against, front, rank
from .rows import BASELINE_LABEL, ID_FIELDS, codec_seed, num, read_rows
from .binary_stats import compare, non_inferior
from .effective_length import effective_lengths
from .stats import LEVEL, interval

SUMMARY_VERSION = 4
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
    entry["delta"] = compare(c, base, higher_is_better).to_json() if base is not None else None
    return entry


def _group(label: str, grows: list[dict], metrics: list[dict], base_rows: list[dict], head: str | None = None,
           margin: float | None = None) -> dict:
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
            g["metrics"][m["name"]] = entry = metric_entry(c, base, m["higher_is_better"])
            if margin is not None and base is not None and m["name"] == head and m["higher_is_better"] is not None:
                entry["non_inferiority"] = non_inferior(c, base, margin, m["higher_is_better"]).to_json()
    return g


def _rankings(groups: list[dict], trows: list[dict], metric: dict) -> tuple[list[dict], list[dict], list[dict], int]:
    """(per bit width {bits, configs, pairs}, the rate-matched front, research codecs against the engines'
    deployed caches, the number of comparisons made) on the headline ``metric``; each pair with its
    Benjamini-Hochberg ``q`` across them all and ``word_bh``."""
    from kernels import CODECS

    kept = [g for g in groups if g["label"] != BASELINE_LABEL and metric["name"] in g["metrics"]]
    configs = [Config(g["label"], g["bits"], cells([r for r in trows if r["label"] == g["label"]], metric["name"]),
                      g.get("cache_bits_per_coord")) for g in kept]
    cmp = Comparisons(configs, metric["higher_is_better"])
    by_bits = [{"bits": b, **rank([c for c in configs if c.bits == b], cmp)} for b in sorted({c.bits for c in configs})]
    engine = {g["label"] for g in kept if getattr(CODECS.get(g["codec"]), "engine_preset", False)}
    deployed = against([c for c in configs if c.label not in engine], [c for c in configs if c.label in engine], cmp)
    rate_front = front(configs, cmp)
    q = cmp.q_values()  # every comparison the report makes on this metric, corrected together
    for p in [p for b in by_bits for p in b["pairs"]] + deployed:
        p["q"] = q[(p["a"], p["b"])]
        p["word_bh"] = p["word"] if p["word"] is None or p["q"] is None or p["q"] < 1 - LEVEL else "indistinguishable"
    return by_bits, rate_front, deployed, len({tuple(sorted(k)) for k in q})


def score_metric(task_name: str) -> str | None:
    """The task's task score (``Task.score_metric``: what a benchmark reports, e.g. RULER's), or None."""
    try:
        from harness.tasks import get_task

        return getattr(get_task(task_name), "score_metric", None)
    except ValueError:
        return None


def _breakdown(task: str, trows: list[dict], groups: list[dict]) -> dict | None:
    """The task's score per value of the prompt_meta keys its class names (``Task.breakdown``, e.g. RULER's
    (task, context)): {metric, keys, columns: ["niah_single_1 @ 4096", ...], averages: ["4096", ...],
    configs: [{label, cells: {column: {mean, ci95, n}}, average: {value: {mean, ci95, n}}}]}. ``average`` is
    over the first key (RULER's average over its tasks) at each value of the others: per prompt repeat
    (``prompt_meta.repeat``) and codec seed, the mean across the first key's values, then their interval.
    None where the task names no breakdown."""
    try:
        from harness.tasks import get_task

        keys = tuple(getattr(get_task(task), "breakdown", ()) or ())
    except ValueError:
        keys = ()
    metric = score_metric(task)
    if not keys or metric is None:
        return None

    def meta(r, k):
        return str((r.get("prompt_meta") or {}).get(k))

    def column(r):
        return " @ ".join(meta(r, k) for k in keys)

    def rest(r):
        return " @ ".join(meta(r, k) for k in keys[1:]) or "all"

    columns = list(dict.fromkeys(column(r) for r in trows))
    averages = list(dict.fromkeys(rest(r) for r in trows))
    width = {a: len({meta(r, keys[0]) for r in trows if rest(r) == a}) for a in averages}
    out = []
    for g in groups:
        grows = [r for r in trows if r["label"] == g["label"]]
        by = {c: interval(cells([r for r in grows if column(r) == c], metric)).to_json() for c in columns}
        avg = {}
        for a in averages:
            parts: dict[tuple[str, int], list[float]] = {}
            for r in grows:
                v = num(r.get(metric))
                if rest(r) == a and v is not None:
                    parts.setdefault((meta(r, "repeat"), codec_seed(r)), []).append(v)
            avg[a] = interval({k: sum(v) / len(v) for k, v in parts.items() if len(v) == width[a]}).to_json()
        out.append({"label": g["label"], "cells": by, "average": avg})
    return {"metric": metric, "keys": list(keys), "columns": columns, "averages": averages, "configs": out}


def _effective(task: str, trows: list[dict], groups: list[dict]) -> dict | None:
    """{metric, threshold, configs: effective_lengths(...)} over the task's context lengths, or None (no score
    metric, or fewer than two lengths)."""
    from .effective_length import THRESHOLD

    metric = score_metric(task)
    if metric is None:
        return None
    entries = effective_lengths(trows, [g["label"] for g in groups if g["label"] != BASELINE_LABEL], BASELINE_LABEL,
                                metric)
    return {"metric": metric, "threshold": THRESHOLD, "configs": entries} if entries else None


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
        head = headline(task, metric_names)
        groups = [_group(label, [r for r in trows if r["label"] == label], metrics, base_rows, head,
                         config.get("margin")) for label in dict.fromkeys(r["label"] for r in trows)]
        ranking, rate_front, deployed, made = (_rankings(groups, trows, metrics[metric_names.index(head)]) if head
                                               else ([], [], [], 0))
        summary["tasks"][task] = {
            "metrics": metrics,
            "headline": head,
            "prompts": list(dict.fromkeys(r["prompt"] for r in trows)),
            "codec_seeds": sorted({codec_seed(r) for r in trows}),
            "groups": groups,
            "ranking": ranking,
            "front": rate_front,
            "against_deployed": deployed,
            "comparisons": made,
            "margin": config.get("margin"),
            "effective_length": _effective(task, trows, groups),
            "breakdown": _breakdown(task, trows, groups),
        }
    return summary
