"""report.md of a run, with its plots: :func:`write_markdown`, from the run as
:func:`harness.report.run_data.read_run` read it and its summary (:mod:`harness.report.summary`); :func:`harness.scale.merge.finish`
writes it and report.html (:mod:`harness.report.html`) from the same two, so a report can be rebuilt at any time
(``harness report RUN``) and is byte-identical for identical rows (outside its speed sections, which speed.jsonl's
measured figures fill). Its cells are written by :mod:`harness.report.formatting`, its prose shared with report.html
by :mod:`harness.report.text`.
Plots (matplotlib, Agg): each metric against the TRUE bits per key coordinate (counted from
the bytes each codec stored), one line per codec with 95% intervals as error bars, the
uncompressed baseline dashed. Each task's section opens with the ranking on its headline metric
and the rate-matched front, and ends with its speed and memory where the run measured them
(:mod:`harness.report.speed`: the one part that differs between identical runs).
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from harness.run.folder import RunFolder
from harness.report.formatting import (arrow, display, fmt, fmt_bytes, fmt_ci, fmt_diff, html_text, md_link, md_text, plot_file,
                         point, values)
from harness.report.text import header, task_order, unavailable
from harness.run.rows import BASELINE_LABEL, atomic_write, num, write_via
from harness.report.speed import markdown as speed_markdown
from harness.report.speed import problem_note
from harness.report.tables import (breakdown_table, deployed_table, detectable_table, effective_table, pair_tables, per_prompt_table,
                     ranking_tables)

if TYPE_CHECKING:
    from harness.report.run_data import RunData

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".webp", ".svg")


# --- plots --------------------------------------------------------------------------------------
def _save(fig, ax, path: Path) -> None:
    """A report plot's grid and legend, then the PNG written (no software tag: the same bytes every time)."""
    import matplotlib.pyplot as plt

    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    write_via(path, lambda p: fig.savefig(p, dpi=100, metadata={"Software": None}))
    plt.close(fig)


def plot_metric(path: Path, task: str, m: dict, groups: list[dict]) -> bool:
    """Mean of metric ``m`` (a summary metric entry: name, display, higher_is_better, scale) against
    true key bits per coordinate with its 95% interval as error bars, one line per codec. False if
    nothing to draw."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metric, higher_is_better = m["name"], m["higher_is_better"]
    by_codec: dict[str, list[tuple[float, float, float, float]]] = {}
    base = None
    for g in groups:
        s = g["metrics"].get(metric)
        pt = point(s) if s is not None else None
        if pt is None:
            continue
        if g["label"] == BASELINE_LABEL:
            base = pt[0]
            continue
        x = num(g.get("bits_per_coord"))
        if x is not None:
            by_codec.setdefault(g["codec"], []).append((x, *pt))
    if not by_codec:
        return False
    # a log axis where the registry says so and every point, error bar included, can go on it
    log = m.get("scale") == "log" and all(p[1] - p[2] > 0 for pts in by_codec.values() for p in pts)
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ax.set_xlabel("true bits per key coordinate (from stored bytes)")
    ax.set_ylabel(display(m) + {True: " (higher is better)", False: " (lower is better)"}.get(higher_is_better, ""))
    off_axis = log and base is not None and base <= 0
    ax.set_title(f"{task}: {display(m)}, 95% intervals" + (" (baseline 0)" if off_axis else ""))
    for i, (codec, pts) in enumerate(by_codec.items()):
        pts.sort()
        ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[[p[2] for p in pts], [p[3] for p in pts]],
                    marker="os^vD<>pXh*"[i % 11], capsize=3, label=codec)
    if base is not None and not (log and base <= 0):  # a KL baseline is 0: off a log axis
        ax.axhline(base, color="black", linestyle="--", linewidth=1, label="baseline (uncompressed)")
    if log:
        ax.set_yscale("log")
    _save(fig, ax, path)
    return True


def plot_effective(path: Path, task: str, eff: dict) -> bool:
    """The task's score against context length, one line per configuration, the baseline dashed; the
    threshold's share of the baseline dotted. False if nothing to draw."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    base = None
    for i, c in enumerate(eff["configs"]):
        pts = [(p["context"], p["score"]) for p in c["points"] if p["score"] is not None]
        ax.plot([x for x, _ in pts], [y for _, y in pts], marker="os^vD<>pXh*"[i % 11], label=c["label"])
        base = base or [(p["context"], p["baseline"]) for p in c["points"] if p["baseline"] is not None]
    if not base:
        plt.close(fig)
        return False
    ax.plot([x for x, _ in base], [y for _, y in base], color="black", linestyle="--", label="baseline (uncompressed)")
    ax.plot([x for x, _ in base], [eff["threshold"] * y for _, y in base], color="black", linestyle=":",
            label=f"{eff['threshold']:.0%} of the baseline")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel(eff["metric"])
    ax.set_title(f"{task}: {eff['metric']} against context length")
    _save(fig, ax, path)
    return True


# --- the report ---------------------------------------------------------------------------------
def write_markdown(run: RunData, summary: dict, speed: dict[str, list[dict]], notes: list[str] = ()) -> Path:
    """report.md and its plots in ``run``'s folder from its ``summary`` (as summary.json holds it); ``speed``:
    per task the entries of :func:`harness.report.speed.summarize_speed`; ``notes``: Markdown lines shown under the
    title (what a run has not stored yet, :mod:`harness.scale.merge`)."""
    out, config = run.path, run.config
    md = [f"# KV-cache codec report: {config['model']}", "", *notes]
    md += header(config, run.model.get("model", {}), summary, run.registry["codecs"]) + problem_note(run.speed_problem)
    for task in task_order(config, summary):
        md += _task_section(out, task, summary["tasks"][task], run.rows, speed.get(task, []))
    md += unavailable(run.rows)
    md += _artifacts(out, run.rows)
    path = RunFolder(out).report_md
    atomic_write(path, "\n".join(md).rstrip() + "\n")
    return path


def pivot(groups: list[dict], value, title: str) -> list[str]:
    """codec x bits table of ``value(group)`` (the baseline is left out)."""
    codecs = list(dict.fromkeys(g["codec"] for g in groups if g["label"] != BASELINE_LABEL))
    bits = sorted({g["bits"] for g in groups if g["label"] != BASELINE_LABEL})
    if not codecs:
        return []
    cell = {(g["codec"], g["bits"]): value(g) for g in groups}
    md = [f"| {title} | " + " | ".join(f"{b} bits" for b in bits) + " |", "|" + "---|" * (len(bits) + 1)]
    md += ["| " + " | ".join([c, *(cell.get((c, b), "—") for b in bits)]) + " |" for c in codecs]
    return md + [""]


def _task_section(out: Path, task: str, t: dict, rows: list[dict], speed: list[dict] = ()) -> list[str]:
    metrics = t["metrics"]
    seeds = t.get("codec_seeds") or [0]
    md = [f"## {task}", "", f"{len(t['prompts'])} prompt(s): " + ", ".join(md_text(p) for p in t["prompts"])
          + f"; codec seed(s) {', '.join(map(str, seeds))} (a codec without random draws runs once).", ""]
    head = next((m for m in metrics if m["name"] == t.get("headline")), None)
    if head is not None:
        md += ranking_tables(t, head)
    base = next((g for g in t["groups"] if g["label"] == BASELINE_LABEL), None)
    md += pivot(t["groups"], lambda g: f"{fmt(g.get('bits_per_coord'), 3)} / {fmt_bytes(g.get('cache_bytes'))}",
                "true key bits/coord / cache bytes")
    for m in metrics:
        b = base["metrics"].get(m["name"]) if base else None
        title = (f"{display(m)}{arrow(m['higher_is_better'])}, mean ± 95%"
                 + (f" (baseline {fmt(b['mean'])})" if b else ""))
        md += pivot(t["groups"], lambda g, n=m["name"]: fmt_ci(g["metrics"].get(n), with_n=False), title)
    md += ["All configurations (mean ± 95% interval (n cells) [min, max]; Δ: paired difference from the "
           "baseline ± 95% and its word):", ""]
    head_row = ["config", "key bits/coord", "value bits/coord", "cache bytes", "× native"]
    for m in metrics:
        head_row += [display(m) + arrow(m["higher_is_better"]), "Δ"]
    md += ["| " + " | ".join(head_row) + " |", "|" + "---|" * len(head_row)]
    for g in t["groups"]:
        ratio = (num(g.get("cache_bytes")) / num(g["uncompressed_bytes"])
                 if num(g.get("cache_bytes")) is not None and num(g.get("uncompressed_bytes")) else None)
        cells = [g["label"], fmt(g.get("bits_per_coord"), 3), fmt(g.get("value_bits_per_coord"), 3),
                 fmt_bytes(g.get("cache_bytes")), fmt(ratio, 3)]
        for m in metrics:
            s = g["metrics"].get(m["name"])
            if s is None:
                cells += ["—", "—"]
                continue
            rng = f" [{fmt(s['min'])}, {fmt(s['max'])}]" if s.get("n", 1) > 1 else ""
            cells += [fmt_ci(s) + rng, "" if g["label"] == BASELINE_LABEL else fmt_diff(s.get("delta"))]
        md.append("| " + " | ".join(cells) + " |")
    md.append("")
    for m in metrics:
        png = plot_file(task, m["name"])
        if plot_metric(out / png, task, m, t["groups"]):
            md += [f"![{task} {display(m)} against true bits per coordinate]({png})", ""]
    if head is not None:
        md += deployed_table(t, head)
        md += pair_tables(t, head)
        md += detectable_table(t, head)
    if t.get("breakdown"):
        md += breakdown_table(t["breakdown"])
    if t.get("effective_length"):
        png = plot_file(task, "effective_length")
        md += effective_table(t["effective_length"])
        if plot_effective(out / png, task, t["effective_length"]):
            md += [f"![{task} score against context length]({png})", ""]
    md += speed_markdown(speed)  # before the per-prompt values: never the report's last lines
    md += ["<details><summary>Per-prompt values (mean over codec seeds)</summary>", ""]
    for m in metrics:
        base = values(rows, task, BASELINE_LABEL, m["name"])
        entries = [(g["label"], values(rows, task, g["label"], m["name"]), base) for g in t["groups"]]
        md += [f"**{display(m)}**{arrow(m['higher_is_better'])}", "", per_prompt_table(entries, t["prompts"]), ""]
    md += ["</details>", ""]
    return md


def _artifacts(out: Path, rows: list[dict]) -> list[str]:
    with_art = [r for r in rows if isinstance(r.get("artifacts"), dict) and r["artifacts"]]
    if not with_art:
        return []
    md = ["## Artifacts", ""]
    for task in dict.fromkeys(r["task"] for r in with_art):
        for prompt in dict.fromkeys(r["prompt"] for r in with_art if r["task"] == task):
            md += [f"<details><summary>{html_text(task)} / {html_text(prompt)}</summary>", ""]
            for r in (r for r in with_art if r["task"] == task and r["prompt"] == prompt):
                links = []
                for name, rel in r["artifacts"].items():
                    target = md_link(rel, out)  # None: not a path inside the run folder (never linked)
                    if target is None:
                        links.append(f"{md_text(name)} (outside the run folder)")
                    elif str(rel).lower().endswith(IMAGE_SUFFIXES):
                        md.append(f"![{md_text(r['label'])} {md_text(name)}]({target})")
                    else:
                        links.append(f"[{md_text(name)}]({target})")
                md.append(f"- {md_text(r['label'])}" + (": " + ", ".join(links) if links else ""))
            md += ["", "</details>", ""]
    return md
