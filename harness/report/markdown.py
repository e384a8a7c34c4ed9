"""report.md of a run, with its plots: :func:`write_markdown` renders the report's content
(:func:`harness.report.model.build_report`) and nothing else; report.html (:mod:`harness.report.html`) renders
the same. Byte-identical for identical rows outside its speed sections (which speed.jsonl's measured figures
fill, between :mod:`harness.report.speed`'s markers).

The page walks the report's sections, each rendered by :data:`RENDER` after its type: tables by
:mod:`harness.report.tables`, plots (PNGs beside report.md) by :mod:`harness.report.png_plots`. Every task's
outputs are listed together at the end (## Artifacts), in the order of the rows.
"""
from __future__ import annotations

from pathlib import Path

from harness.report import tables
from harness.report.formatting import html_text, md_link, md_text, plot_file
from harness.report.png_plots import plot_effective, plot_rate
from harness.report.document import Report
from harness.report.sections import (Breakdown, Configurations, Deployed, Detectable, EffectiveLength, Front,
                                     MetricGrid, Outputs, Pairs, PerPrompt, RateGrid, RatePlots, Ranking, Speed)
from harness.report.speed import BEGIN, END
from harness.report.text import header, not_measured, prompts_line, speed_problem
from harness.run.folder import RunFolder
from harness.run.rows import atomic_write

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".webp", ".svg")


def write_markdown(report: Report, out: Path) -> Path:
    """report.md and its plots in run folder ``out``."""
    out = Path(out)
    h = report.header
    md = [f"# {md_text(h.title)}", "", *h.notes, *header(h)]
    if h.speed_problem:  # between the markers: the one part that differs between identical runs
        md += [BEGIN, "", *speed_problem(h), "", END, ""]
    for t in report.tasks:
        md += [f"## {md_text(t.name)}", "", prompts_line(t), ""]
        for s in t.sections:
            md += render(s, out)
    if report.not_measured:
        md += not_measured(report.not_measured)
    md += _artifacts([s for t in report.tasks for s in t.sections if isinstance(s, Outputs)], out)
    path = RunFolder(out).report_md
    atomic_write(path, "\n".join(md).rstrip() + "\n")
    return path


def render(section, out: Path) -> list[str]:
    """report.md's lines of ``section`` (plots written to ``out``)."""
    try:
        how = RENDER[type(section)]
    except KeyError:
        raise TypeError(f"report.md has no rendering of a {type(section).__name__} section; add one to "
                        f"harness.report.markdown.RENDER") from None
    return how(section, out)


def _rate_plots(s: RatePlots, out: Path) -> list[str]:
    md = []
    for f in s.plots:
        png = plot_file(f.task, f.metric.name)
        plot_rate(out / png, f)
        md += [f"![{md_text(f.task)} {md_text(f.metric.display)} against true bits per coordinate]({png})", ""]
    return md


def _effective(s: EffectiveLength, out: Path) -> list[str]:
    md = tables.effective(s)
    if s.baseline:
        png = plot_file(s.task, "effective_length")
        plot_effective(out / png, s)
        md += [f"![{md_text(s.task)} score against context length]({png})", ""]
    return md


def _artifacts(outputs: list[Outputs], out: Path) -> list[str]:
    """Every task's outputs (tasks in the order of their first row with artifacts), each row's files linked
    (images shown) where they are inside the run folder."""
    if not outputs:
        return []
    md = ["## Artifacts", ""]
    for s in sorted(outputs, key=lambda s: s.prompts[0].first_row):
        for p in s.prompts:
            md += [f"<details><summary>{html_text(s.task)} / {html_text(p.prompt)}</summary>", ""]
            for r in p.rows:
                links = []
                for name, rel in r.artifacts:
                    target = md_link(rel, out)  # None: not a path inside the run folder (never linked)
                    if target is None:
                        links.append(f"{md_text(name)} (outside the run folder)")
                    elif str(rel).lower().endswith(IMAGE_SUFFIXES):
                        md.append(f"![{md_text(r.label)} {md_text(name)}]({target})")
                    else:
                        links.append(f"[{md_text(name)}]({target})")
                md.append(f"- {md_text(r.label)}" + (": " + ", ".join(links) if links else ""))
            md += ["", "</details>", ""]
    return md


#: report.md's rendering of each kind of task section (the header and what was not measured: write_markdown)
RENDER = {
    Ranking: lambda s, out: tables.ranking(s),
    Front: lambda s, out: tables.front(s),
    RateGrid: lambda s, out: tables.rate_grid(s),
    MetricGrid: lambda s, out: tables.metric_grid(s),
    Configurations: lambda s, out: tables.configurations(s),
    RatePlots: _rate_plots,
    Deployed: lambda s, out: tables.deployed(s),
    Pairs: lambda s, out: tables.pairs(s),
    Detectable: lambda s, out: tables.detectable(s),
    Breakdown: lambda s, out: tables.breakdown(s),
    EffectiveLength: _effective,
    Speed: lambda s, out: tables.speed(s),  # before the per-prompt values: never the report's last lines
    PerPrompt: lambda s, out: tables.per_prompt(s),
    Outputs: lambda s, out: [],  # listed with every task's at the end (_artifacts)
}
