"""The Markdown tables of report.md and ``harness compare``: the per-prompt table, and the ranking,
front, pairwise, detectable-difference, effective-length and breakdown tables of a summary task
(:mod:`harness.report.summary`); their cells are written by :mod:`harness.report.formatting`."""
from __future__ import annotations

from harness.report.formatting import fmt, fmt_ci, fmt_delta, fmt_diff, md_text, metric_title, per_prompt_row, verdict


def per_prompt_table(entries: list[tuple[str, dict, dict]], prompts: list[str], higher_is_better=None) -> str:
    """entries: (row name, {prompt: value}, {prompt: baseline value}) -> a markdown table with one
    column per prompt, then min / mean / max and the mean difference from the baseline."""
    head = ["config", *map(md_text, prompts), "min", "mean", "max", "Δ mean vs baseline"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, vals, base in entries:
        xs, stats, delta = per_prompt_row(vals, base, prompts)
        cells = [name, *(fmt(x) for x in xs), *(fmt(s) for s in stats), fmt_delta(delta)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# --- a summary task's ranking, front and pairwise comparisons --------------------------------------
def ranking_tables(t: dict, head: dict) -> list[str]:
    """The ranking per bit width on the headline metric ``head`` (ties share a rank), then the
    rate-matched front (:mod:`harness.stats.ranking`); [] where the task has no ranking."""
    md = []
    if t.get("ranking"):
        md += [f"### Ranking on {metric_title(head)}", "",
               "Per bit width, best mean first; rank = 1 + the configurations significantly better "
               "(paired, 95%), so configurations no comparison tells apart share a rank.", "",
               f"| bits | rank | config | {metric_title(head)}, mean ± 95% | n |", "|---|---|---|---|---|"]
        for b in t["ranking"]:
            md += [f"| {b['bits']} | {c['rank'] if c['rank'] is not None else '—'} | {c['label']} | "
                   f"{fmt_ci(c, with_n=False)} | {c['n']} |" for c in b["configs"]]
        md.append("")
    if t.get("front"):
        means = {c["label"]: c for b in t.get("ranking", []) for c in b["configs"]}
        md += [f"### Rate-matched front on {metric_title(head)}", "",
               "On the front unless a configuration storing no more cache bits per coordinate is "
               "significantly better (paired, 95%).", "",
               f"| config | bits | cache bits/coord | {metric_title(head)}, mean ± 95% | on the front | dominated by |",
               "|---|---|---|---|---|---|"]
        for f in t["front"]:
            on = {True: "yes", False: "no", None: "—"}[f["front"]]
            md.append(f"| {f['label']} | {f['bits']} | {fmt(f['cache_bits_per_coord'], 3)} | "
                      f"{fmt_ci(means.get(f['label']), with_n=False)} | {on} | {', '.join(f['dominated_by']) or '—'} |")
        md.append("")
    return md


def deployed_table(t: dict, head: dict) -> list[str]:
    """Each research codec (rows) against each engine's deployed cache (columns) on the headline metric,
    paired on the same prompts and seeds whatever the bit widths: what the research codec is, with A − B
    ± 95%, and each side's cache bits per coordinate ([] where the run has no deployed cache or no research codec)."""
    pairs = t.get("against_deployed") or []
    if not pairs:
        return []
    rows, cols = list(dict.fromkeys(p["a"] for p in pairs)), list(dict.fromkeys(p["b"] for p in pairs))
    cell = {(p["a"], p["b"]): p for p in pairs}
    rate = {p["a"]: p["a_rate"] for p in pairs} | {p["b"]: p["b_rate"] for p in pairs}

    def name(label):
        return f"{label} ({fmt(rate[label], 3)} b)" if rate.get(label) is not None else label

    md = [f"### Research codecs against deployed caches on {metric_title(head)}", "",
          "Each cell says what the row's codec is against the column's cache (an engine's preset), paired on the "
          "same prompts and codec seeds: row − column ± 95%; a word only where the interval excludes 0 (a pass/fail "
          "metric: where McNemar's exact test rejects at 5%), † where it does not survive the Benjamini–Hochberg "
          "correction across the report's comparisons on this metric. (b) = cache bits per coordinate, so a cell also "
          "says whether the row stores less.", "",
          "| research codec | " + " | ".join(name(c) for c in cols) + " |", "|---|" + "---|" * len(cols)]
    for r in rows:
        cells = [f"{verdict(cell[(r, c)])} ({fmt_diff(cell[(r, c)], with_word=False)})" for c in cols]
        md.append(f"| {name(r)} | " + " | ".join(cells) + " |")
    return md + [""]


def pair_tables(t: dict, head: dict) -> list[str]:
    """Per bit width, every pair of configurations on the headline metric: A − B ± 95% and the word
    for A ([] where no bit width has two configurations)."""
    widths = [b for b in t.get("ranking", []) if b["pairs"]]
    if not widths:
        return []
    made = t.get("comparisons")
    md = [f"### Paired comparisons on {metric_title(head)}", "",
          "A − B on the prompts and codec seeds both have, ± its 95% interval; the word says what A is (a pass/fail "
          "metric: McNemar's exact test on the discordant pairs, Newcombe's interval); *q*: its Benjamini–Hochberg "
          f"adjusted p-value across the {made or 'all'} comparisons this report makes on this metric, † where the "
          "word does not survive that correction.", ""]
    for b in widths:
        md += [f"**{b['bits']} bits**", "", "| A | B | A − B ± 95% | A is | q | n |", "|---|---|---|---|---|---|"]
        md += [f"| {p['a']} | {p['b']} | {fmt_diff(p, with_word=False)} | {verdict(p) if p.get('word') else '—'} | "
               f"{fmt(p.get('q'), 2)} | {p['n']} |" for p in b["pairs"]]
        md.append("")
    return md


def detectable_table(t: dict, head: dict) -> list[str]:
    """Per configuration, its difference from the baseline on the headline metric, the test, the smallest
    difference its prompts and seeds would detect (80% power, 5%), and with ``--margin`` whether it is shown
    non-inferior ([] without a baseline comparison)."""
    groups = [g for g in t["groups"] if (g["metrics"].get(head["name"]) or {}).get("delta")]
    if not groups:
        return []
    margin = t.get("margin")
    md = [f"### Detectable differences from the baseline on {metric_title(head)}", "",
          "*smallest detectable Δ*: the true difference these prompts and codec seeds would tell apart from the "
          "baseline with 80% power at 5% (paired t; McNemar's normal approximation for a pass/fail metric): an "
          "*indistinguishable* config may still differ by less."
          + (f" *non-inferior*: the one-sided 95% bound of Δ is within the margin δ = {fmt(margin)} (`--margin`)."
             if margin is not None else ""), ""]
    cols = ["config", "Δ ± 95%", "test", "smallest detectable Δ"] + (["non-inferior"] if margin is not None else [])
    md += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for g in groups:
        e = g["metrics"][head["name"]]
        d = e["delta"]
        test = {"mcnemar": "McNemar", "t": "t"}.get(d.get("test"), "—")
        cells = [g["label"], fmt_diff(d), test, fmt(d.get("mdd"), 2)]
        if margin is not None:
            ni = e.get("non_inferiority")
            cells.append("—" if ni is None else f"{ni['verdict']} (bound {fmt_delta(ni['bound'])})"
                         if ni.get("bound") is not None else ni["verdict"])
        md.append("| " + " | ".join(cells) + " |")
    return md + [""]


def effective_table(eff: dict) -> list[str]:
    """Each configuration's effective length (NoLiMa's: the longest context up to which it keeps the threshold's
    share of the baseline's score) with what the data shows and allows, then its ratio at every length."""
    configs = eff["configs"]
    contexts = [p["context"] for p in configs[0]["points"]]
    share = f"{eff['threshold']:.0%}"
    md = [f"### Effective length on {eff['metric']}", "",
          f"*effective*: the longest context up to which the configuration's mean {eff['metric']} stays at or above "
          f"{share} of the baseline's at the same length (NoLiMa's definition); *shown*: up to which the 95% interval "
          f"of score − {share} × baseline lies above 0 at every length (what the data establishes); "
          "*possible*: up to which it never lies below (what the data does not rule out). Per length: score ÷ "
          "baseline.", "",
          "| config | effective | shown | possible | " + " | ".join(f"{c}" for c in contexts) + " |",
          "|---|---|---|---|" + "---|" * len(contexts)]
    for c in configs:
        cells = ["—" if c[k] is None else str(c[k]) for k in ("effective", "shown", "possible")]
        cells += [fmt(p["ratio"], 3) for p in c["points"]]
        md.append(f"| {c['label']} | " + " | ".join(cells) + " |")
    return md + [""]


def breakdown_table(bd: dict) -> list[str]:
    """The task's score per breakdown column (RULER: task @ length), x 100 as RULER reports it, mean ± 95%, then
    its average over the first key at each value of the others."""
    def pct(e):
        if not e or e.get("mean") is None:
            return "—"
        ci = e.get("ci95")
        return f"{100 * e['mean']:.1f}" + (f" ± {100 * (ci[1] - ci[0]) / 2:.1f}" if ci else "")

    cols = bd["columns"] + [f"average @ {a}" for a in bd["averages"]]
    md = [f"### {bd['metric']} by {' and '.join(bd['keys'])}", "",
          f"Mean × 100 ± 95% over the prompts and codec seeds of each column; *average*: over {bd['keys'][0]}, as "
          "RULER averages its tasks (per repeat and seed, then the interval).", "",
          "| config | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    for c in bd["configs"]:
        cells = [pct(c["cells"].get(k)) for k in bd["columns"]] + [pct(c["average"].get(a)) for a in bd["averages"]]
        md.append(f"| {c['label']} | " + " | ".join(cells) + " |")
    return md + [""]
