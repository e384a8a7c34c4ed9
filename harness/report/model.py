"""The report's content, built once: :func:`build_report`, a function of a run as
:func:`harness.report.run_data.read_run` read it, its summary (as summary.json holds it), its measured speed
and the notes under its title, to a :class:`harness.report.document.Report`. report.md and report.html render
that and nothing else, so the two pages show the same tables, verdicts, q values, detectable differences,
breakdowns, effective lengths, plots and speed."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from harness.report.document import Header, ModelInfo, NotMeasured, Report, TaskReport
from harness.report.sections import (Breakdown, BreakdownRow, ConfigRow, Configurations, Deployed, Detectable,
                                     DetectableRow, EffectiveConfig, EffectiveLength, EffectivePoint, Front, FrontRow,
                                     MetricCell, MetricGrid, OutputRow, Outputs, Pair, Pairs, PerPrompt, PerPromptRow,
                                     PromptOutputs, RateFigure, RateGrid, RatePlots, RatePoint, Rates, Ranked, Ranking,
                                     Section, Speed, SpeedRow)
from harness.report.values import Difference, Estimate, Metric, NonInferiority
from harness.run.rows import BASELINE_LABEL, codec_seed, num

if TYPE_CHECKING:
    from harness.report.run_data import RunData


def build_report(run: RunData, summary: dict, speed: dict[str, list[dict]] | None = None,
                 notes: list[str] = ()) -> Report:
    """The report of ``run``: ``summary`` as summary.json holds it (floats at 7 significant digits, so a report
    rebuilt from the same rows has the same bytes); ``speed``: per task the entries of
    :func:`harness.report.speed.summarize_speed` (none: no speed sections); ``notes``: Markdown lines shown
    under the title (what a run has not stored yet, :mod:`harness.scale.merge`)."""
    config, declared = run.config, run.registry["tasks"]
    header = _header(config, run.model, run.registry["codecs"], summary, tuple(notes), run.speed_problem)
    tasks = tuple(_task(task, summary["tasks"][task], run.rows, (declared.get(task) or {}).get("media", {}),
                        (speed or {}).get(task, ())) for task in task_order(config, summary))
    return Report(header, tasks, _not_measured(run.rows))


def task_order(config: dict, summary: dict) -> list[str]:
    """The summary's tasks in the order the run names them (config.json), then any other."""
    order = [t for t in config.get("tasks", []) if t in summary["tasks"]]
    return order + [t for t in summary["tasks"] if t not in order]


# --- around the tasks -----------------------------------------------------------------------------------
def _header(config: dict, model: dict, codecs: dict, summary: dict, notes: tuple[str, ...],
            speed_problem: str | None) -> Header:
    m = model.get("model", {})
    info = ModelInfo(**{k: m.get(k) for k in ModelInfo.__dataclass_fields__}) if m else None
    # video and audio models keep their own native window (a frame, a scale) and say so
    window = m.get("window_note") or m.get("cache_window") or f"the last {config['residual']} tokens"
    engine = []
    for n in dict.fromkeys(str(c).partition("@")[0] for c in config.get("codecs", [])):
        native = (codecs.get(n) or {}).get("native_layers")
        if native:
            engine.append((n, tuple(sorted(native))))
    return Header(model=config["model"], info=info, window=window, protect=f"{config['protect']}",
                  engine_layers=tuple(engine), value_group=config["value_group"], value_bits=config.get("value_bits"),
                  score_estimator=config["attend"] == "score", seed=config["seed"],
                  codec_seeds=tuple(config.get("codec_seeds", [0])), codecs=tuple(config["codecs"]),
                  bits=tuple(config["bits"]),
                  skipped=tuple((s["label"], s["reason"]) for s in summary.get("skipped") or ()),
                  notes=notes, speed_problem=speed_problem)


def _not_measured(rows: list[dict]) -> NotMeasured | None:
    reasons: dict[str, set[str]] = {}
    for r in rows:
        for what, why in (r.get("unavailable") or {}).items():
            reasons.setdefault(what, set()).add(str(why))
    return NotMeasured(tuple((w, tuple(sorted(y))) for w, y in sorted(reasons.items()))) if reasons else None


# --- a task -----------------------------------------------------------------------------------------------
def _task(task: str, t: dict, rows: list[dict], media: dict, speed: list[dict]) -> TaskReport:
    metrics = [Metric.of(m) for m in t["metrics"]]
    head = next((m for m in metrics if m.name == t.get("headline")), None)
    groups = t["groups"]
    sections: list[Section | None] = []
    if head is not None:
        sections += [_ranking(t, head), _front(t, head)]
    sections += [_rate_grid(groups), *(_metric_grid(groups, m) for m in metrics), _configurations(groups, metrics),
                 RatePlots(tuple(f for f in (rate_figure(task, m, groups) for m in metrics) if f.codecs))]
    if head is not None:
        sections += [_deployed(t, head), _pairs(t, head), _detectable(t, head)]
    sections += [_breakdown(t.get("breakdown")), _effective(task, t.get("effective_length")),
                 Speed(tuple(_speed_row(e) for e in speed)) if speed else None,
                 _per_prompt(task, t, rows, metrics), _outputs(task, rows, metrics, media)]
    return TaskReport(task, tuple(t["prompts"]), tuple(t.get("codec_seeds") or [0]), head,
                      tuple(s for s in sections if s is not None))


def _ranking(t: dict, head: Metric) -> Ranking | None:
    if not t.get("ranking"):
        return None
    rate = {g["label"]: num(g.get("bits_per_coord")) for g in t["groups"]}
    return Ranking(head, tuple((b["bits"], tuple(Ranked(c["label"], c["rank"], Estimate.of(c), rate.get(c["label"]))
                                                 for c in b["configs"])) for b in t["ranking"]))


def _front(t: dict, head: Metric) -> Front | None:
    if not t.get("front"):
        return None
    means = {c["label"]: c for b in t.get("ranking", []) for c in b["configs"]}
    return Front(head, tuple(FrontRow(f["label"], f["bits"], num(f["cache_bits_per_coord"]),
                                      Estimate.of(means.get(f["label"])), f["front"], tuple(f["dominated_by"]))
                             for f in t["front"]))


def _grid(groups: list[dict]) -> tuple[tuple[str, ...], tuple[int, ...], dict]:
    """(codecs, bit widths, {(codec, bits): group}) of the configurations but the baseline; where two share a
    codec and bit width, the later one."""
    codecs = tuple(dict.fromkeys(g["codec"] for g in groups if g["label"] != BASELINE_LABEL))
    bits = tuple(sorted({g["bits"] for g in groups if g["label"] != BASELINE_LABEL}))
    return codecs, bits, {(g["codec"], g["bits"]): g for g in groups}


def _rate_grid(groups: list[dict]) -> RateGrid | None:
    codecs, bits, group = _grid(groups)
    if not codecs:
        return None
    cell = {k: Rates(num(g.get("bits_per_coord")), num(g.get("cache_bytes"))) for k, g in group.items()}
    return RateGrid(codecs, bits, tuple(tuple(cell.get((c, b)) for b in bits) for c in codecs))


def _metric_grid(groups: list[dict], m: Metric) -> MetricGrid | None:
    codecs, bits, group = _grid(groups)
    if not codecs:
        return None
    base = next((g for g in groups if g["label"] == BASELINE_LABEL), None)
    cell = {k: Estimate.of(g["metrics"].get(m.name)) for k, g in group.items()}
    return MetricGrid(m, Estimate.of(base["metrics"].get(m.name)) if base else None, codecs, bits,
                      tuple(tuple(cell.get((c, b)) for b in bits) for c in codecs))


def _configurations(groups: list[dict], metrics: list[Metric]) -> Configurations:
    rows = []
    for g in groups:
        cb, ub = num(g.get("cache_bytes")), num(g.get("uncompressed_bytes"))
        cells = []
        for m in metrics:
            s = g["metrics"].get(m.name)
            cells.append(None if s is None else MetricCell(Estimate.of(s), Difference.of(s.get("delta"))))
        rows.append(ConfigRow(g["label"], g["label"] == BASELINE_LABEL, num(g.get("bits_per_coord")),
                              num(g.get("value_bits_per_coord")), cb, cb / ub if cb is not None and ub else None,
                              tuple(cells)))
    return Configurations(tuple(metrics), tuple(rows))


def rate_figure(task: str, m: Metric | dict, groups: list[dict]) -> RateFigure:
    """Metric ``m`` against true key bits per coordinate over summary ``groups`` (a codec's points need a finite
    mean and rate; the baseline a finite mean: no codec's point, nothing to draw). ``harness compare`` draws
    one per run on one plot."""
    m = Metric.of(m)
    by_codec: dict[str, list[RatePoint]] = {}
    base = None
    for g in groups:
        e = Estimate.of(g["metrics"].get(m.name))
        if e is None or e.mean is None or not math.isfinite(e.mean):
            continue
        x = num(g.get("bits_per_coord"))
        p = RatePoint(g["label"], x, e, num(g.get("cache_bytes")), Difference.of(g["metrics"][m.name].get("delta")))
        if g["label"] == BASELINE_LABEL:
            base = p
        elif x is not None and math.isfinite(x):
            by_codec.setdefault(g["codec"], []).append(p)
    return RateFigure(task, m, tuple((c, tuple(sorted(pts, key=lambda p: p.x))) for c, pts in by_codec.items()), base)


def _deployed(t: dict, head: Metric) -> Deployed | None:
    pairs = t.get("against_deployed") or []
    if not pairs:
        return None
    rows, cols = tuple(dict.fromkeys(p["a"] for p in pairs)), tuple(dict.fromkeys(p["b"] for p in pairs))
    cell = {(p["a"], p["b"]): Difference.of(p) for p in pairs}
    rate = {p["a"]: num(p["a_rate"]) for p in pairs} | {p["b"]: num(p["b_rate"]) for p in pairs}
    engines: dict = {}
    for c in cols:  # the summary orders them engine by engine
        engines.setdefault(next(p.get("b_engine") for p in pairs if p["b"] == c), []).append(c)
    return Deployed(head, rows, cols, tuple(rate.items()), tuple(tuple(cell[(r, c)] for c in cols) for r in rows),
                    tuple((e, tuple(cs)) for e, cs in engines.items()))


def _pairs(t: dict, head: Metric) -> Pairs | None:
    widths = tuple((b["bits"], tuple(Pair(p["a"], p["b"], Difference.of(p)) for p in b["pairs"]))
                   for b in t.get("ranking", []) if b["pairs"])
    return Pairs(head, t.get("comparisons"), widths) if widths else None


def _detectable(t: dict, head: Metric) -> Detectable | None:
    rows = tuple(DetectableRow(g["label"], Difference.of(e["delta"]), NonInferiority.of(e.get("non_inferiority")))
                 for g in t["groups"] for e in [g["metrics"].get(head.name) or {}] if e.get("delta"))
    return Detectable(head, num(t.get("margin")), rows) if rows else None


def _breakdown(bd: dict | None) -> Breakdown | None:
    if not bd:
        return None
    rows = tuple(BreakdownRow(c["label"], tuple(Estimate.of(c["cells"].get(k)) for k in bd["columns"]),
                              tuple(Estimate.of(c["average"].get(a)) for a in bd["averages"])) for c in bd["configs"])
    return Breakdown(bd["metric"], tuple(bd["keys"]), tuple(bd["columns"]), tuple(bd["averages"]), rows)


def _effective(task: str, eff: dict | None) -> EffectiveLength | None:
    if not eff:
        return None
    configs = tuple(EffectiveConfig(c["label"], c["effective"], c["shown"], c["possible"],
                                    tuple(EffectivePoint(p["context"], num(p["score"]), num(p["baseline"]),
                                                         num(p["ratio"])) for p in c["points"]))
                    for c in eff["configs"])
    # the baseline's score per length: every configuration carries it; the first that has it
    baseline = next((pts for c in configs
                     if (pts := tuple((p.context, p.baseline) for p in c.points if p.baseline is not None))), ())
    return EffectiveLength(task, eff["metric"], eff["threshold"], tuple(p.context for p in configs[0].points), configs,
                           baseline)


def _speed_row(e: dict) -> SpeedRow:
    return SpeedRow(e["label"], e["rollouts"], tuple(e["sequences"]), tuple(e["devices"]), e["unit"],
                    bool(e["prefill_shared"]), Estimate.of(e["prefill"]), Estimate.of(e["decode"]),
                    Estimate.of(e["peak"]), Estimate.of(e.get("shared_forward")), Estimate.of(e.get("capture")))


# --- per prompt -------------------------------------------------------------------------------------------
def values(rows: list[dict], task: str, label: str, metric: str) -> dict:
    """{prompt: value}; a configuration with several codec seeds gets the mean over its seeds."""
    by_prompt: dict[str, list[float]] = {}
    for r in rows:
        if r["task"] == task and r["label"] == label and num(r.get(metric)) is not None:
            by_prompt.setdefault(r["prompt"], []).append(num(r[metric]))
    return {p: sum(v) / len(v) for p, v in by_prompt.items()}


def per_prompt_rows(entries: list[tuple[str, dict, dict]], prompts: list[str]) -> tuple[PerPromptRow, ...]:
    """entries: (row name, {prompt: value}, {prompt: baseline value}) -> per row its value per prompt, the
    min / mean / max of the finite ones and the mean difference from the baseline over the prompts both have."""
    out = []
    for name, vals, base in entries:
        xs = [num(vals.get(p)) for p in prompts]
        finite = [x for x in xs if x is not None and not math.isnan(x)]
        deltas = [num(vals[p]) - num(base[p]) for p in prompts
                  if num(vals.get(p)) is not None and num(base.get(p)) is not None]
        deltas = [d for d in deltas if not math.isnan(d)]
        stats = (min(finite), sum(finite) / len(finite), max(finite)) if finite else (None,) * 3
        out.append(PerPromptRow(name, tuple(xs), *stats, sum(deltas) / len(deltas) if deltas else None))
    return tuple(out)


def _per_prompt(task: str, t: dict, rows: list[dict], metrics: list[Metric]) -> PerPrompt:
    tables = []
    for m in metrics:
        base = values(rows, task, BASELINE_LABEL, m.name)
        entries = [(g["label"], values(rows, task, g["label"], m.name), base) for g in t["groups"]]
        tables.append((m, per_prompt_rows(entries, t["prompts"])))
    return PerPrompt(tuple(t["prompts"]), tuple(tables))


def _outputs(task: str, rows: list[dict], metrics: list[Metric], media: dict) -> Outputs | None:
    declared = tuple((kind, tuple(roles.items())) for kind, roles in media.items())
    prompts: dict[str, list[tuple[int, dict]]] = {}
    for i, r in enumerate(rows):
        if r["task"] == task and isinstance(r.get("artifacts"), dict) and r["artifacts"]:
            prompts.setdefault(r["prompt"], []).append((i, r))
    if not prompts:
        return None
    return Outputs(task, tuple(PromptOutputs(prompt, found[0][0], declared, tuple(
        OutputRow(r["label"], codec_seed(r), tuple(r["artifacts"].items()),
                  tuple((m, num(r[m.name])) for m in metrics if num(r.get(m.name)) is not None)) for _, r in found))
        for prompt, found in prompts.items()))
