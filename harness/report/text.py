"""The prose report.md and report.html both show, as Markdown lines (report.html turns them into HTML,
:func:`harness.report.html.page.prose`): the header (model, cache, codecs, rates, intervals), what a task could
not measure, a task's prompts, and what the tables of the sections (:mod:`harness.report.sections`) show. Text
from input (names, labels, reasons, model.json's entries) goes in through :func:`~harness.report.formatting.md_text`
or :func:`~harness.report.formatting.md_code`."""
from __future__ import annotations

from typing import TYPE_CHECKING

from harness.report.formatting import fmt, md_code, md_text

if TYPE_CHECKING:
    from harness.report.document import Header, NotMeasured, TaskReport
    from harness.report.sections import Breakdown, EffectiveLength

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


def header(h: Header) -> list[str]:
    """The lines under a report's title: the model, the cache, the codecs (and the layers an engine keeps
    native), the rates, :data:`INTERVALS`, and the skipped configurations."""
    md = []
    m = h.info
    if m:
        parts = [str(m.model_type or "").strip(), f"{m.layers} layers" if m.layers is not None else "",
                 f"{m.q_heads} query / {m.kv_heads} KV heads" if m.kv_heads is not None else "",
                 f"head dim {m.head_dim}" if m.head_dim is not None else "",
                 f"{m.dtype} on {m.device or ''}" if m.dtype is not None else ""]
        md.append(f"**Model**: {md_code(h.model)} ({md_text(', '.join(p for p in parts if p))})"
                  + (f", from {md_text(m.source)}" if m.source else "") + ".")
    kept = "; ".join(f"{md_text(n)}: {list(layers)}" for n, layers in h.engine_layers)
    engine = f" (and by their engines' rule, layers {kept})" if kept else ""
    md += [
        f"**Cache**: native window of {md_text(h.window)}; protected layers: {h.protect}{engine}; "
        f"values quantized per token in groups of {h.value_group} at "
        f"{'the key bit width' if h.value_bits is None else f'{h.value_bits} bits'}; keys read through each codec's "
        f"{'score estimator' if h.score_estimator else 'reconstruction'}; prompt seed {h.seed}, "
        f"codec seeds {', '.join(map(str, h.codec_seeds))}.",
        f"**Codecs**: {md_text(', '.join(h.codecs))} at bits {', '.join(map(str, h.bits))}; "
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
    if h.skipped:
        md.append("**Skipped** (the codec rejects this bit width or head dim):")
        md += [f"- {md_code(label)}: {md_text(reason)}" for label, reason in h.skipped]
        md.append("")
    return md


def speed_problem(h: Header) -> list[str]:
    """The line saying why no speed is shown ([] where none); each page puts it between the speed markers."""
    return [f"**Speed and memory** not shown: {md_text(h.speed_problem)}"] if h.speed_problem else []


def not_measured(n: NotMeasured) -> list[str]:
    """What a task could not measure, and why (e.g. LPIPS without its backbone weights): a '—' in
    the tables is never silent."""
    md = ["## Not measured", ""]
    md += [f"- **{md_text(what)}**: " + "; ".join(map(md_text, whys)) for what, whys in n.reasons]
    return md + [""]


def prompts_line(t: TaskReport) -> str:
    """A task's prompts and codec seeds, in Markdown (prompt ids escaped)."""
    return (f"{len(t.prompts)} prompt(s): " + ", ".join(md_text(p) for p in t.prompts)
            + f"; codec seed(s) {', '.join(map(str, t.seeds))} (a codec without random draws runs once).")


# --- what each section's table shows, in words -----------------------------------------------------------
RANKING = ("Per bit width, best mean first; rank = 1 + the configurations significantly better "
           "(paired, 95%), so configurations no comparison tells apart share a rank.")
FRONT = ("On the front unless a configuration storing no more cache bits per coordinate is "
         "significantly better (paired, 95%).")


def pairs_note(comparisons: int | None) -> str:
    return ("A − B on the prompts and codec seeds both have, ± its 95% interval; the word says what A is (a "
            "pass/fail metric: McNemar's exact test on the discordant pairs, Newcombe's interval); *q*: its "
            f"Benjamini–Hochberg adjusted p-value across the {comparisons or 'all'} comparisons this report makes on "
            "this metric, † where the word does not survive that correction.")


def detectable_note(margin: float | None) -> str:
    return ("*smallest detectable Δ*: the true difference these prompts and codec seeds would tell apart from the "
            "baseline with 80% power at 5% (paired t; McNemar's normal approximation for a pass/fail metric): an "
            "*indistinguishable* config may still differ by less."
            + (f" *non-inferior*: the one-sided 95% bound of Δ is within the margin δ = {fmt(margin)} (`--margin`)."
               if margin is not None else ""))


def breakdown_note(b: Breakdown) -> str:
    return (f"Mean × 100 ± 95% over the prompts and codec seeds of each column; *average*: over "
            f"{md_text(b.keys[0])}, as RULER averages its tasks (per repeat and seed, then the interval).")


def effective_note(e: EffectiveLength) -> str:
    share = f"{e.threshold:.0%}"
    return (f"*effective*: the longest context up to which the configuration's mean {md_text(e.metric)} stays at "
            f"or above {share} of the baseline's at the same length (NoLiMa's definition); *shown*: up to which the "
            f"95% interval of score − {share} × baseline lies above 0 at every length (what the data establishes); "
            "*possible*: up to which it never lies below (what the data does not rule out). Per length: score ÷ "
            "baseline.")
