"""report.md for a run folder.

Everything is computed from config.json, model.json, summary.json and rows.jsonl, so a report
can be rebuilt at any time (``harness report RUN``) and is byte-identical for identical rows
(outside its speed sections, which speed.jsonl's measured figures fill).
Plots (matplotlib, Agg): each metric against the TRUE bits per key coordinate (counted from
the bytes each codec stored), one line per codec with 95% intervals as error bars, the
uncompressed baseline dashed. Each task's section opens with the ranking on its headline metric
and the rate-matched front, and ends with its speed and memory where the run measured them
(:mod:`harness.speed`: the one part that differs between identical runs). ``harness compare`` is
in :mod:`harness.compare`.
"""
from __future__ import annotations

import math
from pathlib import Path

from .compare import compare  # noqa: F401  (harness compare; importable from here as before)
from .input_files import InputError, read_run_json
from .rows import BASELINE_LABEL, atomic_write, num, read_rows, write_via
from .speed import markdown as speed_markdown
from .speed import problem_note, read_speed, summarize_speed
from .summary import SUMMARY_VERSION, summarize
from .tables import (arrow, breakdown_table, deployed_table, detectable_table, display, effective_table, fmt, fmt_ci,
                     fmt_diff, html_text, md_link, md_text, pair_tables, per_prompt_table, ranking_tables, values)

INTERVALS = (
    "**Intervals.** Each value is measured per prompt and per codec seed (the codec's random draws). "
    "*mean ± h* is the 95% interval of the mean over both: a t-interval whose variance comes from the "
    "two-way (prompt × seed) analysis of variance, so that a seed shared by every prompt counts once "
    "(Satterthwaite degrees of freedom; one seed: the t-interval over prompts; cells missing: over the "
    "prompts' means); *n* counts the cells. "
    "Comparisons are paired (the same prompts and seeds on both sides) and each word is one 95% test of the "
    "difference on its own: *better* / *worse* where its interval excludes 0, *indistinguishable* where it "
    "holds 0; a pass/fail metric (every value 0 or 1) is compared by McNemar's exact test on the discordant "
    "pairs instead. Multiplicity: k configurations make k(k−1)/2 pairs, and about 1 pair in 20 of truly equal "
    "configurations is called different by chance, so every comparison between configurations on the headline "
    "metric also gets *q*, its Benjamini–Hochberg adjusted p-value across all of them (false discovery rate 5%; "
    "the differences from the baseline are not in that family), and † marks a word "
    "that does not survive it. A configuration's *rank* is 1 + the number of configurations at its bit width "
    "that are significantly better (uncorrected), so ties share a rank."
)
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".webp", ".svg")


def _bytes(x) -> str:
    x = num(x)
    if x is None:
        return "—"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(x) < 1024 or unit == "GiB":
            return f"{x:.0f} {unit}" if unit == "B" else f"{x:.1f} {unit}"
        x /= 1024


def _safe(s: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in s)


# --- plots --------------------------------------------------------------------------------------
def _point(s: dict) -> tuple[float, float, float] | None:
    """(mean, error below, error above) of a summary metric entry: its 95% interval (0 without)."""
    mean = num(s.get("mean"))
    if mean is None or not math.isfinite(mean):
        return None
    ci = s.get("ci95")
    lo, hi = (num(ci[0]), num(ci[1])) if ci else (mean, mean)
    return mean, mean - lo, hi - mean


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
        pt = _point(s) if s is not None else None
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
    ax.set_title(f"{task}: {display(m)}, 95% intervals" + (" (baseline 0)" if log and base is not None and base <= 0 else ""))
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
def write_report(out: Path, notes: list[str] = ()) -> Path:
    """report.md and report.html of run folder ``out``; ``notes``: markdown lines shown under the title
    (what a run has not stored yet, :mod:`harness.merge`)."""
    out = Path(out)
    config = read_run_json(out / "config.json")
    model = read_run_json(out / "model.json", {})
    try:
        summary = read_run_json(out / "summary.json", None)
    except InputError:  # the report rebuilds it below
        summary = None
    if not summary or summary.get("version") != SUMMARY_VERSION:  # none yet, or an older layout
        summary = summarize(out)
    rows = read_rows(out / "rows.jsonl")
    speed_lines, speed_problem = read_speed(out)
    md = [f"# KV-cache codec report: {config['model']}", "", *notes]
    md += _header(config, model.get("model", {}), summary) + problem_note(speed_problem)
    order = [t for t in config.get("tasks", []) if t in summary["tasks"]]
    speed = {}
    for task in order + [t for t in summary["tasks"] if t not in order]:
        t = summary["tasks"][task]
        speed[task] = summarize_speed(speed_lines, task, [g["label"] for g in t["groups"]])
        md += _task_section(out, task, t, rows, speed[task])
    md += _unavailable(rows)
    md += _artifacts(out, rows)
    atomic_write(out / "report.md", "\n".join(md).rstrip() + "\n")
    from .html_report import write_run_page  # report.html beside it, from the same summary and rows

    write_run_page(out, config, model, summary, rows, speed, speed_problem)
    return out / "report.md"


def _header(config: dict, m: dict, summary: dict) -> list[str]:
    md = []
    if m:
        parts = [f"{m.get('model_type', '')}".strip(), f"{m['layers']} layers" if "layers" in m else "",
                 f"{m['q_heads']} query / {m['kv_heads']} KV heads" if "kv_heads" in m else "",
                 f"head dim {m['head_dim']}" if "head_dim" in m else "",
                 f"{m.get('dtype', '')} on {m.get('device', '')}" if "dtype" in m else ""]
        md.append(f"**Model**: `{config['model']}` ({', '.join(p for p in parts if p)})"
                  + (f", from {md_text(m['source'])}" if m.get("source") else "") + ".")
    vb = config.get("value_bits")
    # video and audio models keep their own native window (a frame, a scale) and say so
    window = m.get("window_note") or m.get("cache_window") or f"the last {config['residual']} tokens"
    engine = _engine_native_layers(config, m.get("layers"))
    md += [
        f"**Cache**: native window of {window}; protected layers: {config['protect']}{engine}; "
        f"values quantized per token in groups of {config['value_group']} at "
        f"{'the key bit width' if vb is None else f'{vb} bits'}; keys read through each codec's "
        f"{'score estimator' if config['attend'] == 'score' else 'reconstruction'}; prompt seed {config['seed']}, "
        f"codec seeds {', '.join(map(str, config.get('codec_seeds', [0])))}.",
        f"**Codecs**: {', '.join(config['codecs'])} at bits {', '.join(map(str, config['bits']))}; "
        f"baseline = the uncompressed cache (label `none`, run through the same cache path, so it must match the native model exactly).",
        "",
        "Rates are true: *key bits/coord* = 8 × bytes of the codec's key state / key coordinates committed; "
        "*cache bytes* = everything the cache held at the end (codec states, native window, native layers), "
        "*× native* = cache bytes / bytes of an uncompressed cache of the same tokens. "
        "Δ = mean of (codec − baseline) over the same prompts and codec seeds (— where either is not finite).",
        "",
        INTERVALS,
        "",
    ]
    if summary.get("skipped"):
        md.append("**Skipped** (the codec rejects this bit width or head dim):")
        md += [f"- `{s['label']}`: {s['reason']}" for s in summary["skipped"]]
        md.append("")
    return md


def _engine_native_layers(config: dict, layers) -> str:
    """'' or '; ... also kept native by their engines' for the codecs that keep layers uncompressed by
    themselves (vLLM's TurboQuant presets: the first and last two)."""
    from kernels import CODECS
    from kernels.config import parse_codec_options

    if not isinstance(layers, int):
        return ""
    kept = []
    for n in dict.fromkeys(str(c).partition("@")[0] for c in config.get("codecs", [])):
        if n in CODECS:
            options = parse_codec_options(n, config.get("codec_options", {}).get(n, {}))
            native = CODECS[n].engine_skipped_layers(layers, options)
            if native:
                kept.append(f"{n}: {sorted(native)}")
    return f" (and by their engines' rule, layers {'; '.join(kept)})" if kept else ""


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
    md += pivot(t["groups"], lambda g: f"{fmt(g.get('bits_per_coord'), 3)} / {_bytes(g.get('cache_bytes'))}",
                "true key bits/coord / cache bytes")
    for m in metrics:
        b = base["metrics"].get(m["name"]) if base else None
        title = f"{display(m)}{arrow(m['higher_is_better'])}, mean ± 95%" + (f" (baseline {fmt(b['mean'])})" if b else "")
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
                 _bytes(g.get("cache_bytes")), fmt(ratio, 3)]
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
        png = f"{_safe(task)}_{_safe(m['name'])}.png"
        if plot_metric(out / png, task, m, t["groups"]):
            md += [f"![{task} {display(m)} against true bits per coordinate]({png})", ""]
    if head is not None:
        md += deployed_table(t, head)
        md += pair_tables(t, head)
        md += detectable_table(t, head)
    if t.get("breakdown"):
        md += breakdown_table(t["breakdown"])
    if t.get("effective_length"):
        png = f"{_safe(task)}_effective_length.png"
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


def _unavailable(rows: list[dict]) -> list[str]:
    """What a task could not measure, and why (e.g. LPIPS without its backbone weights): a '—' in
    the tables is never silent."""
    reasons: dict[str, set[str]] = {}
    for r in rows:
        for what, why in (r.get("unavailable") or {}).items():
            reasons.setdefault(what, set()).add(str(why))
    if not reasons:
        return []
    md = ["## Not measured", ""]
    md += [f"- **{what}**: " + "; ".join(sorted(whys)) for what, whys in sorted(reasons.items())]
    return md + [""]


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
