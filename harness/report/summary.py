"""summary.json of a run (version 4): :func:`summarize`, a function of the run's rows, what its registry.json
declares (:mod:`harness.report.run_data`) and its config alone; :func:`harness.scale.merge.finish` writes it.

Per task: its metrics (name, display, direction, scale), the ``headline`` metric, prompts and
codec seeds; per cache configuration (``groups``) the rates and, per metric, n (cells: prompts x
codec seeds), mean, min, max, the 95% interval of the mean (``ci95``; :mod:`harness.stats.intervals`) and
``delta``, the paired difference from the baseline {mean, ci95, word, n, p, test, mdd}
(:func:`harness.stats.pass_fail.compare`: McNemar's exact test for pass/fail metrics; ``mdd`` the
smallest difference the cells would detect), and with the run's ``--margin`` on the headline metric
``non_inferiority`` {mean, bound, margin, verdict}; per bit width the ``ranking`` on the headline
metric with the pairwise comparisons, and the rate-matched ``front`` (:mod:`harness.stats.ranking`); every
comparison between configurations on the headline metric (not those with the baseline) carries ``q``,
its Benjamini-Hochberg adjusted p-value across all of the task's (``comparisons``: how many), and
``word_bh``, its word after that correction. Rows without
``codec_seed`` (older runs) count as seed 0.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from harness.stats.pass_fail import compare, non_inferior
from harness.stats.effective_length import THRESHOLD, effective_lengths
from harness.stats.ranking import Comparisons, Config, against, front, rank
from harness.run.rows import BASELINE_LABEL, ID_FIELDS, codec_seed, num
from harness.stats.intervals import LEVEL, interval

if TYPE_CHECKING:
    from harness.report.run_data import RunData

SUMMARY_VERSION = 4
RATE_FIELDS = ("bits_per_coord", "value_bits_per_coord", "cache_bits_per_coord", "cache_bytes", "uncompressed_bytes")


def describe_metric(name: str, registry: dict) -> dict:
    """How reports label, sort and plot metric ``name``: its display name, direction (None: unknown or
    neither) and scale as ``registry`` (registry.json) declares them; a column it does not declare is shown
    as is."""
    m = registry["metrics"].get(name) or {"display": name, "higher_is_better": None, "scale": "linear"}
    return {"name": name, "display": m["display"], "higher_is_better": m["higher_is_better"], "scale": m["scale"]}


def task_metrics(declared: dict | None, rows: list[dict]) -> list[str]:
    """The metrics of a task (``declared``: its registry.json entry, None where undeclared) that its ``rows``
    carry, in report order; where none (a task no registry knew), every numeric column but the rates and ids."""
    # a declared metric that no row carries (one a task option turns on) is left out
    names = [m for m in (declared or {}).get("metrics", ()) if any(m in r for r in rows)]
    if not names:
        skip = set(RATE_FIELDS) | set(ID_FIELDS)
        names = sorted({k for r in rows for k, v in r.items() if k not in skip and num(v) is not None})
    return names


def headline(declared: dict | None, metric_names: list[str]) -> str | None:
    """The metric that ranks configurations: the task's ``headline``, else its first metric."""
    d = declared or {}
    name = d.get("headline") or (d["metrics"][0] if d.get("metrics") else None)
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


def _rankings(groups: list[dict], trows: list[dict], metric: dict, codecs: dict) -> tuple[list[dict], list[dict],
                                                                                           list[dict], int]:
    """(per bit width {bits, configs, pairs}, the rate-matched front, research codecs against the engines'
    deployed caches (``codecs``: registry.json's), the number of comparisons made) on the headline ``metric``;
    each pair with its Benjamini-Hochberg ``q`` across them all and ``word_bh``. The deployed pairs name the
    column's engine (``b_engine``; null in a folder whose registry.json predates it) and come engine by engine,
    in the order the run's codecs name them, each engine's caches by rate."""
    kept = [g for g in groups if g["label"] != BASELINE_LABEL and metric["name"] in g["metrics"]]
    configs = [Config(g["label"], g["bits"], cells([r for r in trows if r["label"] == g["label"]], metric["name"]),
                      g.get("cache_bits_per_coord")) for g in kept]
    cmp = Comparisons(configs, metric["higher_is_better"])
    by_bits = [{"bits": b, **rank([c for c in configs if c.bits == b], cmp)} for b in sorted({c.bits for c in configs})]
    engine = {g["label"] for g in kept if (codecs.get(g["codec"]) or {}).get("engine_preset")}
    deployed = against([c for c in configs if c.label not in engine], [c for c in configs if c.label in engine], cmp)
    engine_of = {g["label"]: (codecs.get(g["codec"]) or {}).get("engine") for g in kept}
    order = {e: i for i, e in enumerate(dict.fromkeys(c.get("engine") for c in codecs.values()))}
    for p in deployed:
        p["b_engine"] = engine_of[p["b"]]
    deployed.sort(key=lambda p: order.get(p["b_engine"], len(order)))  # stable: research rows, then rate, kept
    rate_front = front(configs, cmp)
    q = cmp.q_values()  # every comparison the report makes on this metric, corrected together
    for p in [p for b in by_bits for p in b["pairs"]] + deployed:
        p["q"] = q[(p["a"], p["b"])]
        p["word_bh"] = p["word"] if p["word"] is None or p["q"] is None or p["q"] < 1 - LEVEL else "indistinguishable"
    return by_bits, rate_front, deployed, len({tuple(sorted(k)) for k in q})


def _breakdown(declared: dict, trows: list[dict], groups: list[dict]) -> dict | None:
    """The task's score per value of the prompt_meta keys its class names (``Task.breakdown``, e.g. RULER's
    (task, context)): {metric, keys, columns: ["niah_single_1 @ 4096", ...], averages: ["4096", ...],
    configs: [{label, cells: {column: {mean, ci95, n}}, average: {value: {mean, ci95, n}}}]}. ``average`` is
    over the first key (RULER's average over its tasks) at each value of the others: per prompt repeat
    (``prompt_meta.repeat``) and codec seed, the mean across the first key's values, then their interval.
    None where the task (``declared``: its registry.json entry) names no breakdown."""
    keys, metric = tuple(declared.get("breakdown") or ()), declared.get("score_metric")
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


def _effective(metric: str | None, trows: list[dict], groups: list[dict]) -> dict | None:
    """{metric, threshold, configs: effective_lengths(...)} of the task's score ``metric`` over its rows'
    context lengths (``prompt_meta.context``), or None (no score metric, fewer than two lengths, no baseline)."""
    contexts = sorted({(r.get("prompt_meta") or {}).get("context") for r in trows} - {None})
    base_rows = [r for r in trows if r["label"] == BASELINE_LABEL]
    if metric is None or len(contexts) < 2 or not base_rows:
        return None

    def by_context(rows: list[dict]) -> dict[int, dict]:
        return {L: cells([r for r in rows if (r.get("prompt_meta") or {}).get("context") == L], metric)
                for L in contexts}

    labels = [g["label"] for g in groups if g["label"] != BASELINE_LABEL]
    entries = effective_lengths(by_context(base_rows),
                                {label: by_context([r for r in trows if r["label"] == label]) for label in labels})
    return {"metric": metric, "threshold": THRESHOLD, "configs": entries} if entries else None


def summarize(rows: list[dict], registry: dict, config: dict, skipped: list[dict] = ()) -> dict:
    """summary.json of a run's ``rows``, from what its ``registry`` (registry.json: :mod:`harness.report.run_data`)
    declares of its tasks, metrics and codecs, and its ``config`` (config.json: the model's name, ``margin``);
    ``skipped``: model.json's codecs that could not run. A function of its arguments alone."""
    summary = {"version": SUMMARY_VERSION, "model": config.get("model"), "skipped": list(skipped), "tasks": {}}
    for task in dict.fromkeys(r["task"] for r in rows):
        trows = [r for r in rows if r["task"] == task]
        declared = registry["tasks"].get(task) or {}
        metric_names = task_metrics(declared, trows)
        metrics = [describe_metric(m, registry) for m in metric_names]
        base_rows = [r for r in trows if r["label"] == BASELINE_LABEL]
        head = headline(declared, metric_names)
        groups = [_group(label, [r for r in trows if r["label"] == label], metrics, base_rows, head,
                         config.get("margin")) for label in dict.fromkeys(r["label"] for r in trows)]
        ranking, rate_front, deployed, made = (_rankings(groups, trows, metrics[metric_names.index(head)],
                                                         registry["codecs"]) if head else ([], [], [], 0))
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
            "effective_length": _effective(declared.get("score_metric"), trows, groups),
            "breakdown": _breakdown(declared, trows, groups),
        }
    return summary


def summarize_run(run: RunData) -> dict:
    """:func:`summarize` of a run folder as :func:`harness.report.run_data.read_run` read it."""
    return summarize(run.rows, run.registry, run.config, run.model.get("skipped", []))
