"""The prose report.md and report.html both show, as Markdown lines (report.html turns them into HTML):
the header (model, cache, codecs, rates, intervals), what a task could not measure, and the order of
the tasks' sections."""
from __future__ import annotations

from harness.report.formatting import md_text

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


def task_order(config: dict, summary: dict) -> list[str]:
    """The summary's tasks in the order the run names them (config.json), then any other."""
    order = [t for t in config.get("tasks", []) if t in summary["tasks"]]
    return order + [t for t in summary["tasks"] if t not in order]


def header(config: dict, m: dict, summary: dict, codecs: dict) -> list[str]:
    """The lines under a report's title: the model (``m``: model.json's model entry), the cache, the codecs
    (``codecs``: registry.json's, for the layers an engine keeps native), the rates, :data:`INTERVALS`, and
    the skipped configurations."""
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
    engine = _engine_native_layers(config, codecs)
    md += [
        f"**Cache**: native window of {window}; protected layers: {config['protect']}{engine}; "
        f"values quantized per token in groups of {config['value_group']} at "
        f"{'the key bit width' if vb is None else f'{vb} bits'}; keys read through each codec's "
        f"{'score estimator' if config['attend'] == 'score' else 'reconstruction'}; prompt seed {config['seed']}, "
        f"codec seeds {', '.join(map(str, config.get('codec_seeds', [0])))}.",
        f"**Codecs**: {', '.join(config['codecs'])} at bits {', '.join(map(str, config['bits']))}; "
        "baseline = the uncompressed cache (label `none`, run through the same cache path, so it must match the native "
        "model exactly).",
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


def _engine_native_layers(config: dict, codecs: dict) -> str:
    """'' or ' (and by their engines' rule, layers ...)' for the codecs that keep layers uncompressed by
    themselves (vLLM's TurboQuant presets: the first and last two)."""
    kept = []
    for n in dict.fromkeys(str(c).partition("@")[0] for c in config.get("codecs", [])):
        native = (codecs.get(n) or {}).get("native_layers")
        if native:
            kept.append(f"{n}: {sorted(native)}")
    return f" (and by their engines' rule, layers {'; '.join(kept)})" if kept else ""


def unavailable(rows: list[dict]) -> list[str]:
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
