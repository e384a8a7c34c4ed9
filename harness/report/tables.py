"""report.md's text of each table section (:mod:`harness.report.sections`), and the per-prompt table
``harness compare`` shares; cells written by :mod:`harness.report.formatting`, prose by :mod:`harness.report.text`.
Rows go through :func:`~harness.report.formatting.md_row` and headings through :func:`_heading`, so every label,
name and title from input is shown as written."""
from __future__ import annotations

from harness.report.formatting import (with_rate, arrow, fmt, fmt_bytes, fmt_ci, fmt_delta, fmt_diff, fmt_non_inferior, fmt_pct,
                                       fmt_test, md_row, md_text, metric_title, verdict)
from harness.report.sections import (Breakdown, Configurations, Deployed, Detectable, EffectiveLength, Front,
                                     MetricGrid, Pairs, PerPrompt, PerPromptRow, RateGrid, Ranking, Speed)
from harness.report.speed import BEGIN, END, cells_text, columns, notes
from harness.report.text import FRONT, RANKING, breakdown_note, detectable_note, effective_note, pairs_note


def _heading(s) -> str:
    """A section's heading: its first title (which names a metric or a task: input) shown as written."""
    return f"### {md_text(s.titles[0])}"


def per_prompt_table(rows: tuple[PerPromptRow, ...], prompts: list[str]) -> str:
    """One column per prompt, then min / mean / max and the mean difference from the baseline."""
    head = ["config", *prompts, "min", "mean", "max", "Δ mean vs baseline"]
    lines = [md_row(head), "|" + "---|" * len(head)]
    lines += [md_row([r.label, *(fmt(x) for x in r.values), fmt(r.min), fmt(r.mean), fmt(r.max), fmt_delta(r.delta)])
              for r in rows]
    return "\n".join(lines)


def ranking(s: Ranking) -> list[str]:
    head = ["bits", "rank", "config", f"{metric_title(s.metric)}, mean ± 95%", "n"]
    md = [_heading(s), "", RANKING, "", md_row(head), "|---|---|---|---|---|"]
    for bits, configs in s.widths:
        md += [md_row([bits, "—" if c.rank is None else c.rank, c.label, fmt_ci(c.estimate, with_n=False),
                       c.estimate.n]) for c in configs]
    return md + [""]


def front(s: Front) -> list[str]:
    head = ["config", "bits", "cache bits/coord", f"{metric_title(s.metric)}, mean ± 95%", "on the front",
            "dominated by"]
    md = [_heading(s), "", FRONT, "", md_row(head), "|---|---|---|---|---|---|"]
    for f in s.rows:
        on = {True: "yes", False: "no", None: "—"}[f.on]
        md.append(md_row([f.label, f.bits, fmt(f.cache_bits_per_coord, 3), fmt_ci(f.estimate, with_n=False), on,
                          ", ".join(f.dominated_by) or "—"]))
    return md + [""]


def _grid(title: str, codecs, bits, cells) -> list[str]:
    """codec x bits table of the cells' text ('—' where there is no such configuration)."""
    md = [md_row([title, *(f"{b} bits" for b in bits)]), "|" + "---|" * (len(bits) + 1)]
    md += [md_row([c, *row]) for c, row in zip(codecs, cells)]
    return md + [""]


def rate_grid(s: RateGrid) -> list[str]:
    return _grid(s.titles[0], s.codecs, s.bits, [["—" if r is None else f"{fmt(r.bits_per_coord, 3)} / "
                                                  f"{fmt_bytes(r.cache_bytes)}" for r in row] for row in s.cells])


def metric_grid(s: MetricGrid) -> list[str]:
    return _grid(s.titles[0], s.codecs, s.bits, [[fmt_ci(e, with_n=False) for e in row] for row in s.cells])


def configurations(s: Configurations) -> list[str]:
    md = ["All configurations (mean ± 95% interval (n cells) [min, max]; Δ: paired difference from the "
          "baseline ± 95% and its word):", ""]
    head = ["config", "key bits/coord", "value bits/coord", "cache bytes", "× native"]
    for m in s.metrics:
        head += [metric_title(m), "Δ"]
    md += [md_row(head), "|" + "---|" * len(head)]
    for g in s.rows:
        cells = [g.label, fmt(g.bits_per_coord, 3), fmt(g.value_bits_per_coord, 3), fmt_bytes(g.cache_bytes),
                 fmt(g.ratio, 3)]
        for c in g.cells:
            if c is None:
                cells += ["—", "—"]
                continue
            e = c.estimate
            rng = f" [{fmt(e.min)}, {fmt(e.max)}]" if (1 if e.n is None else e.n) > 1 else ""
            cells += [fmt_ci(e) + rng, "" if g.baseline else fmt_diff(c.delta)]
        md.append(md_row(cells))
    return md + [""]


def deployed(s: Deployed) -> list[str]:
    """Each cell: what the row's research codec is against the column's deployed cache, with row − column ± 95%."""
    def name(label):
        return with_rate(label, s.rate(label))

    md = [_heading(s), "",
          "Each cell says what the row's codec is against the column's cache (an engine's preset), paired on the "
          "same prompts and codec seeds: row − column ± 95%; a word only where the interval excludes 0 (a pass/fail "
          "metric: where McNemar's exact test rejects at 5%), † where it does not survive the Benjamini–Hochberg "
          "correction across the report's comparisons on this metric. (b) = cache bits per coordinate, so a cell also "
          "says whether the row stores less. One table per engine.", ""]
    for engine, cols, cells in s.by_engine():
        md += [f"**{md_text(engine)}**", ""] if engine else []
        md += [md_row(["research codec", *map(name, cols)]), "|---|" + "---|" * len(cols)]
        for r, row in zip(s.rows, cells):
            md.append(md_row([name(r), *(f"{verdict(d)} ({fmt_diff(d, with_word=False)})" for d in row)]))
        md.append("")
    return md


def pairs(s: Pairs) -> list[str]:
    md = [_heading(s), "", pairs_note(s.comparisons), ""]
    for bits, ps in s.widths:
        md += [f"**{md_text(bits)} bits**", "", "| A | B | A − B ± 95% | A is | q | n |", "|---|---|---|---|---|---|"]
        md += [md_row([p.a, p.b, fmt_diff(p.diff, with_word=False), verdict(p.diff) if p.diff.word else "—",
                       fmt(p.diff.q, 2), p.diff.n]) for p in ps]
        md.append("")
    return md


def detectable(s: Detectable) -> list[str]:
    cols = ["config", "Δ ± 95%", "test", "smallest detectable Δ"]
    cols += ["non-inferior"] if s.margin is not None else []
    md = [_heading(s), "", detectable_note(s.margin), "", md_row(cols), "|" + "---|" * len(cols)]
    for r in s.rows:
        cells = [r.label, fmt_diff(r.delta), fmt_test(r.delta.test), fmt(r.delta.mdd, 2)]
        md.append(md_row(cells + ([fmt_non_inferior(r.non_inferiority)] if s.margin is not None else [])))
    return md + [""]


def breakdown(s: Breakdown) -> list[str]:
    """The score per breakdown column, x 100 as RULER reports it, then its averages."""
    cols = [*s.columns, *(f"average @ {a}" for a in s.averages)]
    md = [_heading(s), "", breakdown_note(s), "", md_row(["config", *cols]), "|---|" + "---|" * len(cols)]
    md += [md_row([r.label, *(fmt_pct(e) for e in (*r.cells, *r.averages))]) for r in s.rows]
    return md + [""]


def effective(s: EffectiveLength) -> list[str]:
    """Each configuration's effective length, shown and possible, then its score ÷ baseline at every length."""
    md = [_heading(s), "", effective_note(s), "", md_row(["config", "effective", "shown", "possible", *s.contexts]),
          "|---|---|---|---|" + "---|" * len(s.contexts)]
    for c in s.configs:
        cells = ["—" if v is None else v for v in (c.effective, c.shown, c.possible)]
        md.append(md_row([c.label, *cells, *(fmt(p.ratio, 3) for p in c.points)]))
    return md + [""]


def speed(s: Speed) -> list[str]:
    """Between the speed markers: measured, so it differs between identical runs."""
    rows = list(s.rows)
    md = [BEGIN, "", _heading(s), "", *[line for n in notes(rows) for line in (n, "")],
          md_row(columns(rows)), "|" + "---|" * len(columns(rows))]
    md += [md_row(cells_text(e)) for e in rows]
    return md + ["", END, ""]


def per_prompt(s: PerPrompt) -> list[str]:
    md = ["<details><summary>Per-prompt values (mean over codec seeds)</summary>", ""]
    for m, rows in s.tables:
        md += [f"**{md_text(m.display)}**{arrow(m.higher_is_better)}", "", per_prompt_table(rows, s.prompts), ""]
    return md + ["</details>", ""]
