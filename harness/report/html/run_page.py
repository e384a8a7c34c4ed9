"""report.html of one run, from the same loaded run (:func:`harness.report.run_data.read_run`) and summary as
report.md (:mod:`harness.report.markdown`): per task the ranking on the headline metric with its 95%
intervals, the rate-matched front, an interactive rate–quality plot per metric, every
configuration, the paired comparisons, sortable per-prompt tables, the media per prompt
(:mod:`harness.report.html.media`), and the measured speed and memory per configuration
(:mod:`harness.report.speed`, between its markers: the page is byte-identical for identical rows outside them)."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from harness.run.folder import RunFolder
from harness.report import speed as speed_mod
from harness.report.formatting import display, fmt, fmt_bytes, fmt_ci, fmt_diff, metric_title, values, verdict
from harness.report.text import INTERVALS, header, task_order, unavailable
from harness.run.rows import BASELINE_LABEL, num
from harness.report.html import media as media_mod
from harness.report.html import plots
from harness.report.html.page import (cell, diff_cell, interval_cell, mean_cell, number, per_prompt, prose, render, slug, table, word_cell,
                   word_class)

if TYPE_CHECKING:
    from harness.report.run_data import RunData



def ranking(t: dict, head: dict) -> dict | None:
    """Per bit width, best mean first: rank (ties share one), mean ± 95%, the interval, n."""
    if not t.get("ranking"):
        return None
    rate = {g["label"]: g.get("bits_per_coord") for g in t["groups"]}
    rows = [[number(b["bits"]),
             cell("—" if c["rank"] is None else c["rank"], c["rank"], "best" if c["rank"] == 1 else None),
             cell(c["label"]), mean_cell(c), interval_cell(c), number(c["n"]), number(rate.get(c["label"]), 3)]
            for b in t["ranking"] for c in b["configs"]]
    return table(["bits", "rank", "config", f"{metric_title(head)}, mean ± 95%", "95% interval", "n", "key bits/coord"],
                 rows, cls="ranking")


def rate_front(t: dict, head: dict) -> dict | None:
    if not t.get("front"):
        return None
    means = {c["label"]: c for b in t.get("ranking", []) for c in b["configs"]}
    on = {True: "yes", False: "no", None: "—"}
    rows = [[cell(f["label"]), number(f["bits"]), number(f["cache_bits_per_coord"], 3),
             mean_cell(means.get(f["label"])),
             cell(on[f["front"]], None, "better" if f["front"] else None), cell(", ".join(f["dominated_by"]) or "—")]
            for f in t["front"]]
    return table(["config", "bits", "cache bits/coord", f"{metric_title(head)}, mean ± 95%", "on the front",
                  "dominated by"],
                 rows, cls="front")


def against_deployed(t: dict) -> dict | None:
    """Each research codec (rows) against each engine's deployed cache (columns): the verdict with row −
    column ± 95%, coloured by it (report.md's table, :func:`harness.report.tables.deployed_table`)."""
    pairs = t.get("against_deployed") or []
    if not pairs:
        return None
    rows, cols = list(dict.fromkeys(p["a"] for p in pairs)), list(dict.fromkeys(p["b"] for p in pairs))
    cell_of = {(p["a"], p["b"]): p for p in pairs}
    rate = {p["a"]: p["a_rate"] for p in pairs} | {p["b"]: p["b_rate"] for p in pairs}

    def name(label):
        return f"{label} ({fmt(rate[label], 3)} b)" if rate.get(label) is not None else label

    def verdict_cell(p):
        return cell(f"{verdict(p)} ({fmt_diff(p, with_word=False)})", p.get("mean"), word_class(p.get("word")))

    body = [[cell(name(r), rate.get(r)), *(verdict_cell(cell_of[(r, c)]) for c in cols)] for r in rows]
    return table(["research codec (cache bits/coord)", *map(name, cols)], body, cls="deployed")


def configurations(t: dict) -> dict:
    """Every configuration: rates, then per metric mean ± 95% (n) [min, max] and the paired Δ."""
    head = ["config", "key bits/coord", "value bits/coord", "cache bytes", "× native"]
    for m in t["metrics"]:
        head += [metric_title(m), "Δ vs baseline"]
    rows = []
    for g in t["groups"]:
        cb, ub = num(g.get("cache_bytes")), num(g.get("uncompressed_bytes"))
        ratio = cb / ub if cb is not None and ub else None
        r = [cell(g["label"]), number(g.get("bits_per_coord"), 3), number(g.get("value_bits_per_coord"), 3),
             cell(fmt_bytes(cb), cb), number(ratio, 3)]
        for m in t["metrics"]:
            s = g["metrics"].get(m["name"])
            if s is None:
                r += [cell("—"), cell("—")]
                continue
            rng = f" [{fmt(s['min'])}, {fmt(s['max'])}]" if s.get("n", 1) > 1 else ""
            r += [cell(fmt_ci(s) + rng, s.get("mean")),
                  cell("") if g["label"] == BASELINE_LABEL else diff_cell(s.get("delta"))]
        rows.append(r)
    return table(head, rows, cls="configs")


def pairs(t: dict) -> list[tuple[str, dict]]:
    """Per bit width with two or more configurations: A − B ± 95% and what A is."""
    return [(f"{b['bits']} bits", table(["A", "B", "A − B ± 95%", "A is", "n"], [
        [cell(p["a"]), cell(p["b"]), diff_cell(p, with_word=False), word_cell(p["word"]),
         number(p["n"])] for p in b["pairs"]])) for b in t.get("ranking", []) if b["pairs"]]


def speed_table(entries: list[dict]) -> dict | None:
    """Per configuration: rollouts, sequences, prefill s, decode rate, peak MiB (each mean ± 95%), device."""
    if not entries:
        return None
    rows = []
    for e in entries:
        text = speed_mod.cells_text(e)
        means = ((e[k] or {}).get("mean") for k in ("prefill", "decode", "peak"))
        sort = [None, e["rollouts"], e["sequences"][-1], *means, None]
        rows.append([cell(x, s) for x, s in zip(text, sort)])
    return {"table": table(speed_mod.columns(entries), rows, cls="speed"), "notes": prose(speed_mod.notes(entries))}


def task_section(out: Path, task: str, t: dict, rows: list[dict], media: dict, speed: list[dict] = ()) -> dict:
    """The page's section of ``task`` (``t``: its summary entry; ``media``: the media its class declares,
    registry.json's)."""
    metrics = t["metrics"]
    head = next((m for m in metrics if m["name"] == t.get("headline")), None)
    seeds = t.get("codec_seeds") or [0]
    plot_list = [plots.rate_quality(m, [("", t["groups"])], slug("plot", task, m["name"]),
                                    f"{task}: {display(m)}, mean and 95% interval") for m in metrics]
    base = {m["name"]: values(rows, task, BASELINE_LABEL, m["name"]) for m in metrics}
    files = media_mod.Media(out, out)
    tables = [(metric_title(m), per_prompt([(g["label"], values(rows, task, g["label"], m["name"]), base[m["name"]])
                                     for g in t["groups"]], t["prompts"])) for m in metrics]
    return {
        "name": task, "id": slug("task", task), "prompts": t["prompts"], "seeds": seeds,
        "headline": metric_title(head) if head else None,
        "ranking": ranking(t, head) if head else None, "front": rate_front(t, head) if head else None,
        "deployed": against_deployed(t) if head else None,
        "plots": [p for p in plot_list if p], "configs": configurations(t), "pairs": pairs(t), "per_prompt": tables,
        "media": media_mod.sections(files, task, rows, metrics, slug(task), media), "missing": files.missing,
        "speed": speed_table(speed),
    }


def write_run_page(run: RunData, summary: dict, speed: dict[str, list[dict]] | None = None) -> Path:
    """report.html (and plotly.min.js) in ``run``'s folder from its ``summary`` (as summary.json holds it);
    ``speed``: per task the entries of :func:`harness.report.speed.summarize_speed` (none: no speed section)."""
    out, config = run.path, run.config
    declared = run.registry["tasks"]
    tasks = [task_section(out, task, summary["tasks"][task], run.rows, (declared.get(task) or {}).get("media", {}),
                          (speed or {}).get(task, ())) for task in task_order(config, summary)]
    lines = header(config, run.model.get("model", {}), summary, run.registry["codecs"])
    html_header = prose([line for line in lines if line != INTERVALS])
    if run.speed_problem:  # between the markers, as in report.md: the one part that differs between identical runs
        html_header += ("\n" + speed_mod.BEGIN + prose([f"**Speed and memory** not shown: {run.speed_problem}"])
                        + speed_mod.END)
    files = [name for name in (RunFolder.REPORT_MD, RunFolder.CONFIG, RunFolder.MODEL, RunFolder.SUMMARY,
                               RunFolder.lines_name(RunFolder.ROWS))
             if (out / name).is_file()]
    return render("report.html.j2", RunFolder(out).report_html, title=f"KV-cache codec report: {config['model']}",
                  files=files, header=html_header, intervals=prose([INTERVALS]), tasks=tasks,
                  unavailable=prose(unavailable(run.rows)), speed_markers=(speed_mod.BEGIN, speed_mod.END))
