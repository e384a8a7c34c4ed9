"""report.html of one run: :func:`write_run_page` renders the report's content
(:func:`harness.report.model.build_report`), the same that report.md renders, and nothing else. Each section
becomes a view for the template (``report.html.j2``) by :data:`VIEWS` after its type, in the page's order
(:data:`ORDER`): per task the ranking on the headline metric with its 95% intervals, the rate-matched front,
the research codecs against the deployed caches, an interactive rate–quality plot per metric with the codec x
bit-width grids, every configuration, the paired comparisons with their q values, the detectable differences,
the breakdown (RULER's task by length), the effective length with its plot, the measured speed and memory
(:mod:`harness.report.speed`, between its markers: the page is byte-identical for identical rows outside them),
sortable per-prompt tables and the media per prompt (:mod:`harness.report.html.media`)."""
from __future__ import annotations

from pathlib import Path

from harness.report import speed as speed_mod
from harness.report.formatting import (with_rate, fmt, fmt_bytes, fmt_ci, fmt_diff, fmt_non_inferior, fmt_pct, fmt_test,
                                       metric_title, verdict)
from harness.report.html import media as media_mod
from harness.report.html import plots
from harness.report.html.page import (cell, diff_cell, interval_cell, mean_cell, number, per_prompt, prose, render,
                                      slug, table, word_class)
from harness.report.document import Report, TaskReport
from harness.report.sections import (Breakdown, Configurations, Deployed, Detectable, EffectiveLength, Front,
                                     MetricGrid, Outputs, Pairs, PerPrompt, RateGrid, RatePlots, Ranking, Speed)
from harness.report.text import (FRONT, INTERVALS, RANKING, breakdown_note, detectable_note, effective_note, header,
                                 not_measured, pairs_note, speed_problem)
from harness.run.folder import RunFolder

ON = {True: "yes", False: "no", None: "—"}


def ranking(s: Ranking, task: TaskReport, ctx: dict) -> dict:
    """Per bit width, best mean first: rank (ties share one), mean ± 95%, the interval, n, the rate."""
    rows = [[number(bits), cell("—" if c.rank is None else c.rank, c.rank, "best" if c.rank == 1 else None),
             cell(c.label), mean_cell(c.estimate), interval_cell(c.estimate), number(c.estimate.n), number(c.rate, 3)]
            for bits, configs in s.widths for c in configs]
    return {"title": s.titles[0], "note": RANKING, "table": table(
        ["bits", "rank", "config", f"{metric_title(s.metric)}, mean ± 95%", "95% interval", "n", "key bits/coord"],
        rows, cls="ranking")}


def front(s: Front, task: TaskReport, ctx: dict) -> dict:
    rows = [[cell(f.label), number(f.bits), number(f.cache_bits_per_coord, 3), mean_cell(f.estimate),
             cell(ON[f.on], None, "better" if f.on else None), cell(", ".join(f.dominated_by) or "—")]
            for f in s.rows]
    head = ["config", "bits", "cache bits/coord", f"{metric_title(s.metric)}, mean ± 95%", "on the front",
            "dominated by"]
    return {"title": s.titles[0], "note": FRONT, "table": table(head, rows, cls="front")}


def deployed(s: Deployed, task: TaskReport, ctx: dict) -> dict:
    """Each research codec (rows) against each engine's deployed cache (columns): the verdict with row −
    column ± 95%, coloured by it; a table per engine, captioned with its name."""
    def name(label):
        return with_rate(label, s.rate(label))

    tables = []
    for engine, cols, cells in s.by_engine():
        body = [[cell(name(r), s.rate(r)), *(cell(f"{verdict(d)} ({fmt_diff(d, with_word=False)})", d.mean,
                                                  word_class(d.word)) for d in row)] for r, row in zip(s.rows, cells)]
        tables.append(table(["research codec (cache bits/coord)", *map(name, cols)], body, caption=engine,
                            cls="deployed"))
    return {"title": s.titles[0], "tables": tables}


def rate_plots(s: RatePlots, task: TaskReport, ctx: dict) -> dict:
    return {"plots": [plots.rate_quality(f.metric, [("", f)], slug("plot", f.task, f.metric.name),
                                         f"{f.task}: {f.metric.display}, mean and 95% interval") for f in s.plots]}


def rate_grid(s: RateGrid, task: TaskReport, ctx: dict) -> dict:
    rows = [[cell(c), *(cell("—") if r is None else cell(f"{fmt(r.bits_per_coord, 3)} / {fmt_bytes(r.cache_bytes)}",
                                                         r.bits_per_coord) for r in row)]
            for c, row in zip(s.codecs, s.cells)]
    return {"table": table([s.titles[0], *(f"{b} bits" for b in s.bits)], rows, cls="grid")}


def metric_grid(s: MetricGrid, task: TaskReport, ctx: dict) -> dict:
    rows = [[cell(c), *(mean_cell(e) for e in row)] for c, row in zip(s.codecs, s.cells)]
    return {"table": table([s.titles[0], *(f"{b} bits" for b in s.bits)], rows, cls="grid")}


def configurations(s: Configurations, task: TaskReport, ctx: dict) -> dict:
    """Every configuration: rates, then per metric mean ± 95% (n) [min, max] and the paired Δ."""
    head = ["config", "key bits/coord", "value bits/coord", "cache bytes", "× native"]
    for m in s.metrics:
        head += [metric_title(m), "Δ vs baseline"]
    rows = []
    for g in s.rows:
        r = [cell(g.label), number(g.bits_per_coord, 3), number(g.value_bits_per_coord, 3),
             cell(fmt_bytes(g.cache_bytes), g.cache_bytes), number(g.ratio, 3)]
        for c in g.cells:
            if c is None:
                r += [cell("—"), cell("—")]
                continue
            e = c.estimate
            rng = f" [{fmt(e.min)}, {fmt(e.max)}]" if (1 if e.n is None else e.n) > 1 else ""
            r += [cell(fmt_ci(e) + rng, e.mean), cell("") if g.baseline else diff_cell(c.delta)]
        rows.append(r)
    return {"table": table(head, rows, cls="configs")}


def pairs(s: Pairs, task: TaskReport, ctx: dict) -> dict:
    """Per bit width with two or more configurations: A − B ± 95%, what A is (†: not after the
    Benjamini-Hochberg correction) and its q."""
    return {"title": s.titles[0], "note": prose([pairs_note(s.comparisons)]), "tables": [
        (f"{bits} bits", table(["A", "B", "A − B ± 95%", "A is", "q", "n"], [
            [cell(p.a), cell(p.b), diff_cell(p.diff, with_word=False),
             cell(verdict(p.diff) if p.diff.word else "—", None, word_class(p.diff.word)), number(p.diff.q, 2),
             number(p.diff.n)] for p in ps])) for bits, ps in s.widths]}


def detectable(s: Detectable, task: TaskReport, ctx: dict) -> dict:
    head = ["config", "Δ ± 95%", "test", "smallest detectable Δ"]
    head += ["non-inferior"] if s.margin is not None else []
    rows = [[cell(r.label), diff_cell(r.delta), cell(fmt_test(r.delta.test)), number(r.delta.mdd, 2)]
            + ([cell(fmt_non_inferior(r.non_inferiority), r.non_inferiority.bound if r.non_inferiority else None)]
               if s.margin is not None else []) for r in s.rows]
    return {"title": s.titles[0], "note": prose([detectable_note(s.margin)]), "table": table(head, rows,
                                                                                              cls="detectable")}


def breakdown(s: Breakdown, task: TaskReport, ctx: dict) -> dict:
    rows = [[cell(r.label), *(cell(fmt_pct(e), e.mean if e else None) for e in (*r.cells, *r.averages))]
            for r in s.rows]
    return {"title": s.titles[0], "note": prose([breakdown_note(s)]), "table": table(
        ["config", *s.columns, *(f"average @ {a}" for a in s.averages)], rows, cls="breakdown")}


def effective(s: EffectiveLength, task: TaskReport, ctx: dict) -> dict:
    rows = [[cell(c.label), *(cell("—" if v is None else v, v) for v in (c.effective, c.shown, c.possible)),
             *(number(p.ratio, 3) for p in c.points)] for c in s.configs]
    return {"title": s.titles[0], "note": prose([effective_note(s)]),
            "table": table(["config", "effective", "shown", "possible", *map(str, s.contexts)], rows, cls="effective"),
            "plot": plots.effective_length(s, slug("plot", s.task, "effective_length"))}


def speed(s: Speed, task: TaskReport, ctx: dict) -> dict:
    """Per configuration: rollouts, sequences, shared forward s, own prefill s, decode rate, capture s, peak MiB
    (each mean ± 95%), device."""
    rows = []
    for e in s.rows:
        rows.append([cell(x, k) for x, k in zip(speed_mod.cells_text(e), speed_mod.sort_keys(e))])
    return {"table": table(speed_mod.columns(list(s.rows)), rows, cls="speed"),
            "notes": prose(speed_mod.notes(list(s.rows)))}


def per_prompt_tables(s: PerPrompt, task: TaskReport, ctx: dict) -> dict:
    return {"tables": [(metric_title(m), per_prompt(rows, s.prompts)) for m, rows in s.tables]}


def outputs(s: Outputs, task: TaskReport, ctx: dict) -> dict:
    return {"media": media_mod.sections(ctx["media"], s, slug(task.name))}


#: report.html's view of each kind of task section: (the template's name for it, how it is made)
VIEWS = {Ranking: ("ranking", ranking), Front: ("front", front), Deployed: ("deployed", deployed),
         RatePlots: ("plots", rate_plots), RateGrid: ("grid", rate_grid), MetricGrid: ("grid", metric_grid),
         Configurations: ("configs", configurations), Pairs: ("pairs", pairs), Detectable: ("detectable", detectable),
         Breakdown: ("breakdown", breakdown), EffectiveLength: ("effective", effective), Speed: ("speed", speed),
         PerPrompt: ("per_prompt", per_prompt_tables), Outputs: ("media", outputs)}
#: the page's order of a task's sections, its layout from before the report was built once (report.md's is the
#: report's own: there the plots follow every configuration and the deployed caches the plots)
ORDER = (Ranking, Front, Deployed, RatePlots, RateGrid, MetricGrid, Configurations, Pairs, Detectable, Breakdown,
         EffectiveLength, Speed, PerPrompt, Outputs)


def _place(section) -> int:
    """``section``'s place in the page's order of a task's sections."""
    if type(section) not in VIEWS or type(section) not in ORDER:
        raise TypeError(f"report.html has no view of a {type(section).__name__} section; add one to "
                        f"harness.report.html.run_page.VIEWS and ORDER")
    return ORDER.index(type(section))


def view(section, task: TaskReport, ctx: dict) -> dict:
    """The template's view of ``section``: its kind and what the template shows of it."""
    kind, make = VIEWS[type(section)]
    return {"kind": kind, **make(section, task, ctx)}


def task_view(out: Path, t: TaskReport) -> dict:
    """The page's section of task ``t``."""
    ctx = {"media": media_mod.Media(out, out)}  # notes the artifacts it cannot find
    sections = [view(s, t, ctx) for s in sorted(t.sections, key=_place)]
    return {"name": t.name, "id": slug("task", t.name), "prompts": t.prompts, "seeds": t.seeds,
            "headline": metric_title(t.headline) if t.headline else None,
            "no_ranking": t.headline is not None and not any(isinstance(s, Ranking) for s in t.sections),
            "sections": sections, "missing": ctx["media"].missing}


def write_run_page(report: Report, out: Path) -> Path:
    """report.html (and plotly.min.js) in run folder ``out``."""
    out = Path(out)
    h = report.header
    tasks = [task_view(out, t) for t in report.tasks]
    html_header = prose([line for line in header(h) if line != INTERVALS])
    if h.speed_problem:  # between the markers, as in report.md: the one part that differs between identical runs
        html_header += "\n" + speed_mod.BEGIN + prose(speed_problem(h)) + speed_mod.END
    files = [name for name in (RunFolder.REPORT_MD, RunFolder.CONFIG, RunFolder.MODEL, RunFolder.SUMMARY,
                               RunFolder.lines_name(RunFolder.ROWS))
             if (out / name).is_file()]
    return render("report.html.j2", RunFolder(out).report_html, title=h.title, files=files, notes=prose(list(h.notes)),
                  header=html_header, intervals=prose([INTERVALS]), tasks=tasks,
                  unavailable=prose(not_measured(report.not_measured)) if report.not_measured else "",
                  speed_markers=(speed_mod.BEGIN, speed_mod.END), unknown=_unknown)


def _unknown(kind: str):
    raise TypeError(f"report.html.j2 has no rendering of a '{kind}' section view; add one")
