"""report.md's text of each table section (:mod:`harness.report.sections`), and the per-prompt table
``harness compare`` shares; cells written by :mod:`harness.report.formatting`, prose by :mod:`harness.report.text`."""
from __future__ import annotations

from harness.report.formatting import (arrow, fmt, fmt_bytes, fmt_ci, fmt_delta, fmt_diff, fmt_non_inferior, fmt_pct,
                                       fmt_test, md_text, metric_title, verdict)
from harness.report.sections import (Breakdown, Configurations, Deployed, Detectable, EffectiveLength, Front,
                                     MetricGrid, Pairs, PerPrompt, PerPromptRow, RateGrid, Ranking, Speed)
from harness.report.speed import BEGIN, END, cells_text, columns, notes
from harness.report.text import FRONT, RANKING, breakdown_note, detectable_note, effective_note, pairs_note


def _row(cells) -> str:
    return "| " + " | ".join(cells) + " |"


def per_prompt_table(rows: tuple[PerPromptRow, ...], prompts: list[str]) -> str:
    """One column per prompt, then min / mean / max and the mean difference from the baseline."""
    head = ["config", *map(md_text, prompts), "min", "mean", "max", "Δ mean vs baseline"]
    lines = [_row(head), "|" + "---|" * len(head)]
    lines += [_row([r.label, *(fmt(x) for x in r.values), fmt(r.min), fmt(r.mean), fmt(r.max), fmt_delta(r.delta)])
              for r in rows]
    return "\n".join(lines)


def ranking(s: Ranking) -> list[str]:
    title = metric_title(s.metric)
    md = [f"### {s.titles[0]}", "", RANKING, "", f"| bits | rank | config | {title}, mean ± 95% | n |",
          "|---|---|---|---|---|"]
    for bits, configs in s.widths:
        md += [f"| {bits} | {c.rank if c.rank is not None else '—'} | {c.label} | "
               f"{fmt_ci(c.estimate, with_n=False)} | {c.estimate.n} |" for c in configs]
    return md + [""]


def front(s: Front) -> list[str]:
    md = [f"### {s.titles[0]}", "", FRONT, "",
          f"| config | bits | cache bits/coord | {metric_title(s.metric)}, mean ± 95% | on the front | dominated by |",
          "|---|---|---|---|---|---|"]
    for f in s.rows:
        on = {True: "yes", False: "no", None: "—"}[f.on]
        md.append(f"| {f.label} | {f.bits} | {fmt(f.cache_bits_per_coord, 3)} | {fmt_ci(f.estimate, with_n=False)} | "
                  f"{on} | {', '.join(f.dominated_by) or '—'} |")
    return md + [""]


def _grid(title: str, codecs, bits, cells) -> list[str]:
    """codec x bits table of the cells' text ('—' where there is no such configuration)."""
    md = [f"| {title} | " + " | ".join(f"{b} bits" for b in bits) + " |", "|" + "---|" * (len(bits) + 1)]
    md += [_row([c, *row]) for c, row in zip(codecs, cells)]
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
    md += [_row(head), "|" + "---|" * len(head)]
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
        md.append(_row(cells))
    return md + [""]


def deployed(s: Deployed) -> list[str]:
    """Each cell: what the row's research codec is against the column's deployed cache, with row − column ± 95%."""
    def name(label):
        return f"{label} ({fmt(s.rate(label), 3)} b)" if s.rate(label) is not None else label

    md = [f"### {s.titles[0]}", "",
          "Each cell says what the row's codec is against the column's cache (an engine's preset), paired on the "
          "same prompts and codec seeds: row − column ± 95%; a word only where the interval excludes 0 (a pass/fail "
          "metric: where McNemar's exact test rejects at 5%), † where it does not survive the Benjamini–Hochberg "
          "correction across the report's comparisons on this metric. (b) = cache bits per coordinate, so a cell also "
          "says whether the row stores less. One table per engine.", ""]
    for engine, cols, cells in s.by_engine():
        md += [f"**{engine}**", ""] if engine else []
        md += ["| research codec | " + " | ".join(name(c) for c in cols) + " |", "|---|" + "---|" * len(cols)]
        for r, row in zip(s.rows, cells):
            md.append(f"| {name(r)} | " + " | ".join(f"{verdict(d)} ({fmt_diff(d, with_word=False)})" for d in row)
                      + " |")
        md.append("")
    return md


def pairs(s: Pairs) -> list[str]:
    md = [f"### {s.titles[0]}", "", pairs_note(s.comparisons), ""]
    for bits, ps in s.widths:
        md += [f"**{bits} bits**", "", "| A | B | A − B ± 95% | A is | q | n |", "|---|---|---|---|---|---|"]
        md += [f"| {p.a} | {p.b} | {fmt_diff(p.diff, with_word=False)} | {verdict(p.diff) if p.diff.word else '—'} | "
               f"{fmt(p.diff.q, 2)} | {p.diff.n} |" for p in ps]
        md.append("")
    return md


def detectable(s: Detectable) -> list[str]:
    cols = ["config", "Δ ± 95%", "test", "smallest detectable Δ"]
    cols += ["non-inferior"] if s.margin is not None else []
    md = [f"### {s.titles[0]}", "", detectable_note(s.margin), "", _row(cols), "|" + "---|" * len(cols)]
    for r in s.rows:
        cells = [r.label, fmt_diff(r.delta), fmt_test(r.delta.test), fmt(r.delta.mdd, 2)]
        md.append(_row(cells + ([fmt_non_inferior(r.non_inferiority)] if s.margin is not None else [])))
    return md + [""]


def breakdown(s: Breakdown) -> list[str]:
    """The score per breakdown column, x 100 as RULER reports it, then its averages."""
    cols = [*s.columns, *(f"average @ {a}" for a in s.averages)]
    md = [f"### {s.titles[0]}", "", breakdown_note(s), "", "| config | " + " | ".join(cols) + " |",
          "|---|" + "---|" * len(cols)]
    md += [f"| {r.label} | " + " | ".join(fmt_pct(e) for e in (*r.cells, *r.averages)) + " |" for r in s.rows]
    return md + [""]


def effective(s: EffectiveLength) -> list[str]:
    """Each configuration's effective length, shown and possible, then its score ÷ baseline at every length."""
    md = [f"### {s.titles[0]}", "", effective_note(s), "",
          "| config | effective | shown | possible | " + " | ".join(f"{c}" for c in s.contexts) + " |",
          "|---|---|---|---|" + "---|" * len(s.contexts)]
    for c in s.configs:
        cells = ["—" if v is None else str(v) for v in (c.effective, c.shown, c.possible)]
        md.append(f"| {c.label} | " + " | ".join(cells + [fmt(p.ratio, 3) for p in c.points]) + " |")
    return md + [""]


def speed(s: Speed) -> list[str]:
    """Between the speed markers: measured, so it differs between identical runs."""
    rows = list(s.rows)
    md = [BEGIN, "", f"### {s.titles[0]}", "", *[line for n in notes(rows) for line in (n, "")],
          _row(columns(rows)), "|" + "---|" * len(columns(rows))]
    md += [_row(cells_text(e)) for e in rows]
    return md + ["", END, ""]


def per_prompt(s: PerPrompt) -> list[str]:
    md = ["<details><summary>Per-prompt values (mean over codec seeds)</summary>", ""]
    for m, rows in s.tables:
        md += [f"**{m.display}**{arrow(m.higher_is_better)}", "", per_prompt_table(rows, s.prompts), ""]
    return md + ["</details>", ""]
