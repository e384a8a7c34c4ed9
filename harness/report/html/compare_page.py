"""The HTML page of ``harness compare``: each later run against the first, paired per configuration
with 95% intervals (:func:`harness.report.compare.pair_runs`), the runs' rate–quality curves on one plot
per task and metric, the per-prompt tables (sortable) and links to each run's report.html."""
from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import quote

from harness.report.compare import Run, load_checked, notes, pair_runs, per_prompt_entries, task_metrics, task_prompts
from harness.report.formatting import display, metric_title
from harness.report.html import plots
from harness.report.model import per_prompt_rows, rate_figure
from harness.report.values import Metric
from harness.report.html.page import cell, diff_cell, inline, mean_cell, number, per_prompt, render, slug, table, word_cell
from harness.run.folder import RunFolder


def _pair_tables(a: Run, b: Run, task: str) -> list[tuple[str, dict]]:
    pairs = pair_runs(a, b, task)
    out = []
    for m in a.summary["tasks"][task]["metrics"]:
        rows = [[cell(p["label"]), mean_cell(p["a"]), mean_cell(p["b"]), diff_cell(p["diff"], with_word=False),
                 word_cell(p["diff"]["word"]), number(p["diff"]["n"])]
                for p in pairs if p["metric"] == m["name"]]
        if rows:
            out.append((metric_title(m), table(
                ["config", a.name, b.name, f"{b.name} − {a.name} ± 95%", f"{b.name} is", "n"], rows)))
    return out


def _paired(a: Run, b: Run) -> dict:
    tasks = []
    for task in (t for t in a.summary["tasks"] if t in b.summary["tasks"]):
        pa, pb = set(a.summary["tasks"][task]["prompts"]), set(b.summary["tasks"][task]["prompts"])
        tasks.append({"name": task, "note": f"Paired {len(pa & pb)} prompt(s) ({len(pa - pb)} only in {a.name}, "
                                            f"{len(pb - pa)} only in {b.name}).", "tables": _pair_tables(a, b, task)})
    return {"a": a.name, "b": b.name, "notes": [inline(n) for n in notes(a, b)], "tasks": tasks}


def _task(runs: list[Run], task: str) -> dict:
    metrics = [Metric.of(m) for m in task_metrics(runs, task)]
    plot_list = [plots.rate_quality(m, [(r.name, rate_figure(task, m, r.summary["tasks"][task]["groups"]))
                                        for r in runs if task in r.summary["tasks"]],
                                    slug("plot", task, m.name), f"{task}: {display(m)}, mean and 95% interval per run")
                 for m in metrics]
    prompts = task_prompts(runs, task)
    return {"name": task, "id": slug("task", task), "plots": [p for p in plot_list if p],
            "per_prompt": [(metric_title(m),
                            per_prompt(per_prompt_rows(per_prompt_entries(runs, task, m.name), prompts), prompts))
                           for m in metrics]}


def write_compare_page(run_dirs: list[Path], path: Path) -> Path:
    """The comparison of ``run_dirs`` (each later one against the first) as an HTML page at ``path``,
    plotly.min.js beside it. Raises CompareError / FileNotFoundError as ``harness compare`` does."""
    runs = load_checked(run_dirs)
    path = Path(path)
    links = []
    for d, r in zip(run_dirs, runs):
        page = RunFolder(d).report_html
        href = quote(Path(os.path.relpath(page, path.parent)).as_posix()) if page.is_file() else None
        links.append({"name": r.name, "href": href, "model": r.config.get("model")})
    tasks = list(dict.fromkeys(t for r in runs for t in r.summary["tasks"]))
    return render("compare.html.j2", path, title=f"Comparison of {len(runs)} run(s)", runs=links,
                  paired=[_paired(runs[0], other) for other in runs[1:]], tasks=[_task(runs, t) for t in tasks])
