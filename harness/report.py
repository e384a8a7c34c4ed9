"""report.md for a run folder, and ``harness compare`` across runs.

Everything is computed from config.json, model.json, summary.json and rows.jsonl, so a report
can be rebuilt at any time (``harness report RUN``) and is byte-identical for identical rows.
Plots (matplotlib, Agg): each metric against the TRUE bits per key coordinate (counted from
the bytes each codec stored), one line per codec, the uncompressed baseline dashed.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from .rows import BASELINE_LABEL, num, read_rows
from .summary import summarize

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".webp", ".svg")


def fmt(x, digits: int = 4) -> str:
    x = num(x) if not isinstance(x, float) else x
    if x is None:
        return "—"
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x == 0:
        return "0"
    if abs(x) >= 1e5 or abs(x) < 1e-3:
        return f"{x:.{digits - 1}e}"
    return f"{x:.{digits}g}"


def fmt_delta(x) -> str:
    x = num(x) if not isinstance(x, float) else x
    if x is None or math.isnan(x) or math.isinf(x):  # e.g. SNR against itself is inf: no difference to show
        return "—"
    s = fmt(x, 3)
    return s if s.startswith("-") or s in ("0", "nan") else "+" + s


def arrow(higher_is_better) -> str:
    return {True: " ↑", False: " ↓"}.get(higher_is_better, "")


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


# --- tables -------------------------------------------------------------------------------------
def per_prompt_table(entries: list[tuple[str, dict, dict]], prompts: list[str], higher_is_better=None) -> str:
    """entries: (row name, {prompt: value}, {prompt: baseline value}) -> a markdown table with one
    column per prompt, then min / mean / max and the mean difference from the baseline."""
    head = ["config", *prompts, "min", "mean", "max", "Δ mean vs baseline"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, vals, base in entries:
        xs = [num(vals.get(p)) for p in prompts]
        finite = [x for x in xs if x is not None and not math.isnan(x)]
        deltas = [num(vals[p]) - num(base[p]) for p in prompts
                  if num(vals.get(p)) is not None and num(base.get(p)) is not None]
        deltas = [d for d in deltas if not math.isnan(d)]
        stats = [min(finite), sum(finite) / len(finite), max(finite)] if finite else [None] * 3
        delta = sum(deltas) / len(deltas) if deltas else None
        lines.append("| " + " | ".join([name, *(fmt(x) for x in xs), *(fmt(s) for s in stats), fmt_delta(delta)]) + " |")
    return "\n".join(lines)


def _values(rows: list[dict], task: str, label: str, metric: str) -> dict:
    return {r["prompt"]: r.get(metric) for r in rows if r["task"] == task and r["label"] == label}


# --- plots --------------------------------------------------------------------------------------
def _display(m: dict) -> str:
    """A summary metric entry's display name (summaries written before display names: the name)."""
    return m.get("display", m["name"])


def plot_metric(path: Path, task: str, m: dict, groups: list[dict]) -> bool:
    """Mean of metric ``m`` (a summary metric entry: name, display, higher_is_better, scale) against
    true key bits per coordinate, one line per codec. False if nothing to draw."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metric, higher_is_better = m["name"], m["higher_is_better"]
    by_codec: dict[str, list[tuple[float, float, int]]] = {}
    base = None
    for g in groups:
        s = g["metrics"].get(metric)
        if s is None or num(s["mean"]) is None or math.isnan(num(s["mean"])):
            continue
        if g["label"] == BASELINE_LABEL:
            base = num(s["mean"])
            continue
        x = num(g.get("bits_per_coord"))
        if x is not None:
            by_codec.setdefault(g["codec"], []).append((x, num(s["mean"]), g["bits"]))
    if not by_codec:
        return False
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for i, (codec, pts) in enumerate(by_codec.items()):
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="os^vD<>pXh*"[i % 11], label=codec)
    # a log axis where the registry says so and every point can go on it
    log = m.get("scale") == "log" and all(p[1] > 0 for pts in by_codec.values() for p in pts)
    if base is not None and not (log and base <= 0):  # a KL baseline is 0: off a log axis
        ax.axhline(base, color="black", linestyle="--", linewidth=1, label="baseline (uncompressed)")
    ax.set_xlabel("true bits per key coordinate (from stored bytes)")
    ax.set_ylabel(_display(m) + {True: " (higher is better)", False: " (lower is better)"}.get(higher_is_better, ""))
    ax.set_title(f"{task}: {_display(m)}" + (" (baseline 0)" if log and base is not None and base <= 0 else ""))
    if log:
        ax.set_yscale("log")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)
    return True


# --- the report ---------------------------------------------------------------------------------
def write_report(out: Path) -> Path:
    out = Path(out)
    config = json.loads((out / "config.json").read_text())
    model = json.loads((out / "model.json").read_text()) if (out / "model.json").exists() else {}
    summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() else summarize(out)
    rows = read_rows(out / "rows.jsonl")
    md = [f"# KV-cache codec report: {config['model']}", ""]
    md += _header(config, model.get("model", {}), summary)
    order = [t for t in config.get("tasks", []) if t in summary["tasks"]]
    for task in order + [t for t in summary["tasks"] if t not in order]:
        md += _task_section(out, task, summary["tasks"][task], rows)
    md += _unavailable(rows)
    md += _artifacts(rows)
    (out / "report.md").write_text("\n".join(md).rstrip() + "\n", encoding="utf-8")
    return out / "report.md"


def _header(config: dict, m: dict, summary: dict) -> list[str]:
    md = []
    if m:
        parts = [f"{m.get('model_type', '')}".strip(), f"{m['layers']} layers" if "layers" in m else "",
                 f"{m['q_heads']} query / {m['kv_heads']} KV heads" if "kv_heads" in m else "",
                 f"head dim {m['head_dim']}" if "head_dim" in m else "",
                 f"{m.get('dtype', '')} on {m.get('device', '')}" if "dtype" in m else ""]
        md.append(f"**Model**: `{config['model']}` ({', '.join(p for p in parts if p)})"
                  + (f", from `{m['source']}`" if m.get("source") else "") + ".")
    vb = config.get("value_bits")
    # video and audio models keep their own native window (a frame, a scale) and say so
    window = m.get("window_note") or m.get("cache_window") or f"the last {config['residual']} tokens"
    md += [
        f"**Cache**: native window of {window}; protected layers: {config['protect']}; "
        f"values quantized per token in groups of {config['value_group']} at "
        f"{'the key bit width' if vb is None else f'{vb} bits'}; keys read through each codec's "
        f"{'score estimator' if config['attend'] == 'score' else 'reconstruction'}; seed {config['seed']}.",
        f"**Codecs**: {', '.join(config['codecs'])} at bits {', '.join(map(str, config['bits']))}; "
        f"baseline = the uncompressed cache (label `none`, run through the same cache path, so it must match the native model exactly).",
        "",
        "Rates are true: *key bits/coord* = 8 × bytes of the codec's key state / key coordinates committed; "
        "*cache bytes* = everything the cache held at the end (codec states, native window, native layers), "
        "*× native* = cache bytes / bytes of an uncompressed cache of the same tokens. "
        "Δ = mean over prompts of (codec − baseline) on the same prompt (— where either is not finite).",
        "",
    ]
    if summary.get("skipped"):
        md.append("**Skipped** (the codec rejects this bit width or head dim):")
        md += [f"- `{s['label']}`: {s['reason']}" for s in summary["skipped"]]
        md.append("")
    return md


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


def _task_section(out: Path, task: str, t: dict, rows: list[dict]) -> list[str]:
    metrics = t["metrics"]
    md = [f"## {task}", "", f"{len(t['prompts'])} prompt(s): " + ", ".join(f"`{p}`" for p in t["prompts"]) + ".", ""]
    base = next((g for g in t["groups"] if g["label"] == BASELINE_LABEL), None)
    md += pivot(t["groups"], lambda g: f"{fmt(g.get('bits_per_coord'), 3)} / {_bytes(g.get('cache_bytes'))}",
                "true key bits/coord / cache bytes")
    for m in metrics:
        b = base["metrics"].get(m["name"]) if base else None
        title = f"{_display(m)}{arrow(m['higher_is_better'])}" + (f" (baseline {fmt(b['mean'])})" if b else "")
        md += pivot(t["groups"], lambda g, n=m["name"]: fmt(g["metrics"][n]["mean"]) if n in g["metrics"] else "—", title)
    md += ["All configurations (mean over prompts [min, max]; Δ against the baseline):", ""]
    head = ["config", "key bits/coord", "value bits/coord", "cache bytes", "× native"]
    for m in metrics:
        head += [_display(m) + arrow(m["higher_is_better"]), "Δ"]
    md += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
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
            rng = f" [{fmt(s['min'])}, {fmt(s['max'])}]" if g["n"] > 1 else ""
            cells += [fmt(s["mean"]) + rng, "" if g["label"] == BASELINE_LABEL else fmt_delta(s.get("delta"))]
        md.append("| " + " | ".join(cells) + " |")
    md.append("")
    for m in metrics:
        png = f"{_safe(task)}_{_safe(m['name'])}.png"
        if plot_metric(out / png, task, m, t["groups"]):
            md += [f"![{task} {_display(m)} against true bits per coordinate]({png})", ""]
    md += ["<details><summary>Per-prompt values</summary>", ""]
    for m in metrics:
        base = _values(rows, task, BASELINE_LABEL, m["name"])
        entries = [(g["label"], _values(rows, task, g["label"], m["name"]), base) for g in t["groups"]]
        md += [f"**{_display(m)}**{arrow(m['higher_is_better'])}", "", per_prompt_table(entries, t["prompts"]), ""]
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


def _artifacts(rows: list[dict]) -> list[str]:
    with_art = [r for r in rows if isinstance(r.get("artifacts"), dict) and r["artifacts"]]
    if not with_art:
        return []
    md = ["## Artifacts", ""]
    for task in dict.fromkeys(r["task"] for r in with_art):
        for prompt in dict.fromkeys(r["prompt"] for r in with_art if r["task"] == task):
            md += [f"<details><summary>{task} / {prompt}</summary>", ""]
            for r in (r for r in with_art if r["task"] == task and r["prompt"] == prompt):
                links = []
                for name, rel in r["artifacts"].items():
                    if str(rel).lower().endswith(IMAGE_SUFFIXES):
                        md.append(f"![{r['label']} {name}]({rel})")
                    else:
                        links.append(f"[{name}]({rel})")
                md.append(f"- `{r['label']}`" + (": " + ", ".join(links) if links else ""))
            md += ["", "</details>", ""]
    return md


# --- compare ------------------------------------------------------------------------------------
def compare(run_dirs: list[Path]) -> str:
    """Markdown: per task and metric, one per-prompt table over every (run, codec@bits)."""
    runs = []
    for d in run_dirs:
        d = Path(d)
        if not (d / "rows.jsonl").exists():
            raise FileNotFoundError(f"{d} is not a run folder (no rows.jsonl); runs are under reports/")
        runs.append((d.name, read_rows(d / "rows.jsonl"), summarize(d)))
    md = [f"# Comparison of {len(runs)} run(s)", ""]
    tasks = list(dict.fromkeys(task for _, _, s in runs for task in s["tasks"]))
    for task in tasks:
        md += [f"## {task}", ""]
        metrics = list({m["name"]: m for _, _, s in runs if task in s["tasks"] for m in s["tasks"][task]["metrics"]}.values())
        prompts = list(dict.fromkeys(p for _, _, s in runs if task in s["tasks"] for p in s["tasks"][task]["prompts"]))
        for m in metrics:
            entries = []
            for name, rows, s in runs:
                if task not in s["tasks"]:
                    continue
                base = _values(rows, task, BASELINE_LABEL, m["name"])
                for g in s["tasks"][task]["groups"]:
                    label = f"{name}: {g['label']} ({fmt(g.get('bits_per_coord'), 3)} b/coord)" if len(runs) > 1 \
                        else f"{g['label']} ({fmt(g.get('bits_per_coord'), 3)} b/coord)"
                    entries.append((label, _values(rows, task, g["label"], m["name"]), base))
            md += [f"**{_display(m)}**{arrow(m['higher_is_better'])}", "", per_prompt_table(entries, prompts), ""]
    return "\n".join(md).rstrip() + "\n"
