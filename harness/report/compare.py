"""``harness compare RUN_A RUN_B [...]``: every later run against the first, paired.

For each task and configuration label both runs have, per metric: the difference B − A over the
(prompt, codec seed) cells both have (seeds matched by value: the same seed is the same codec
draw), with its 95% interval and word (:mod:`harness.stats.intervals`). Pairing is refused
(:class:`CompareError`, one line) where it would pair different things:

- other models: config.json's model name, and model.json's model entry but for ``device`` and
  ``dtype`` (where it ran, and a run setting that a comparison may well be about: a dtype that
  differs is a note);
- one prompt id with other content: its ``prompt_meta`` (but for where it was read from:
  ``PROMPT_LOCATION``) or its token counts (``PROMPT_FIELDS``) differ.

Prompts that only one run has are left out, and counted. Runs whose recorded environments
(model.json's ``environment``, :mod:`harness.run.environment`) differ get a warning line naming the
fields. One run alone gets only the per-prompt tables, as do all runs after the paired sections.
Run, task, metric and configuration names are shown as written (:func:`~harness.report.formatting.md_text`).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness.run.claim import refuse_not_regular
from harness.run.folder import RunFolder
from harness.run.environment import environment_diff
from harness.report.formatting import arrow, display, fmt, fmt_ci, fmt_diff, md_row, md_text
from harness.report.model import per_prompt_rows, values
from harness.run.rows import BASELINE_LABEL
from harness.report.run_data import RunData, read_run
from harness.stats.intervals import interval, paired
from harness.report.summary import cells, summarize_run
from harness.report.tables import per_prompt_table

#: row fields that count a prompt's tokens: equal ids with other counts are other prompts
PROMPT_FIELDS = ("tokens", "scored_tokens")
#: prompt_meta keys that say where a prompt was read from, not what it holds (paths differ by machine)
PROMPT_LOCATION = ("file", "source", "license")
#: model.json model keys that do not identify the model
NOT_MODEL = ("device", "dtype")


class CompareError(ValueError):
    """Two runs whose rows must not be paired; the message names what differs."""


@dataclass
class Run:
    """A run folder as read once (:func:`harness.report.run_data.read_run`) and its summary, made again from its rows."""
    data: RunData
    summary: dict

    @property
    def name(self) -> str:
        return self.data.name

    @property
    def rows(self) -> list[dict]:
        return self.data.rows

    @property
    def config(self) -> dict:
        return self.data.config

    @property
    def model(self) -> dict:  # model.json ({} where absent)
        return self.data.model


def load_run(d: Path) -> Run:
    d = Path(d)
    if not RunFolder(d).rows.exists():
        raise FileNotFoundError(f"{d} is not a run folder (no {RunFolder(d).rows.name}); runs are under reports/")
    refuse_not_regular(d)
    data = read_run(d)
    return Run(data, summarize_run(data))


# --- what must match ------------------------------------------------------------------------------
def _differing(a: dict, b: dict, skip=()) -> list[str]:
    return sorted(k for k in set(a) | set(b) if k not in skip and a.get(k) != b.get(k))


def check_models(a: Run, b: Run) -> None:
    """CompareError unless ``a`` and ``b`` ran one model (names and model.json, device and dtype aside)."""
    if a.config.get("model") != b.config.get("model"):
        raise CompareError(f"{a.name} and {b.name} ran different models ({a.config.get('model')} vs "
                           f"{b.config.get('model')}); compare runs of one model")
    ma, mb = a.model.get("model"), b.model.get("model")
    fields = _differing(ma, mb, NOT_MODEL) if ma and mb else []
    if fields:
        raise CompareError(f"{a.name} and {b.name} ran different models ({RunFolder.MODEL} differs in "
                           f"{', '.join(fields)}); compare runs of one model")


def prompt_identity(rows: list[dict]) -> dict[tuple[str, str], dict]:
    """{(task, prompt): what identifies its content}: prompt_meta but for its location, and the
    token counts (``PROMPT_FIELDS``), from the first row that has each."""
    out: dict[tuple[str, str], dict] = {}
    for r in rows:
        ident = out.setdefault((r["task"], r["prompt"]), {})
        for k, v in (r.get("prompt_meta") or {}).items():
            if k not in PROMPT_LOCATION:
                ident.setdefault(f"prompt_meta.{k}", v)
        for k in PROMPT_FIELDS:
            if k in r:
                ident.setdefault(k, r[k])
    return out


def check_prompts(a: Run, b: Run) -> None:
    """CompareError where one (task, prompt id) has other content in ``a`` and ``b`` (fields both record)."""
    ia, ib = prompt_identity(a.rows), prompt_identity(b.rows)
    for key in ia.keys() & ib.keys():
        common = ia[key].keys() & ib[key].keys()
        bad = [f for f in sorted(common) if ia[key][f] != ib[key][f]]
        if bad:
            task, prompt = key
            raise CompareError(f"prompt '{prompt}' of task '{task}' differs between {a.name} and {b.name} "
                               f"({', '.join(f'{f}: {ia[key][f]!r} vs {ib[key][f]!r}' for f in bad)}); "
                               f"they scored other text or tokens under one id, so their rows cannot be paired")


def notes(a: Run, b: Run) -> list[str]:
    """Warning lines: environments that differ or are not recorded, a dtype that differs."""
    ea, eb = a.model.get("environment"), b.model.get("environment")
    missing = [r.name for r, e in ((a, ea), (b, eb)) if not e]
    if missing:
        out = [f"Environment not recorded ({md_text(', '.join(missing))}): it cannot be checked."]
    else:
        diff = environment_diff(ea, eb)
        out = [f"**Warning**: the runs' environments differ in {md_text(', '.join(diff))}."] if diff else []
    da, db = (a.model.get("model") or {}).get("dtype"), (b.model.get("model") or {}).get("dtype")
    if da and db and da != db:
        out.append(f"Note: the model ran in {md_text(da)} in {md_text(a.name)} and in {md_text(db)} in "
                   f"{md_text(b.name)}.")
    return out


# --- the paired differences -------------------------------------------------------------------------
def pair_runs(a: Run, b: Run, task: str) -> list[dict]:
    """[{label, metric, a, b, diff}] for every configuration label and metric ``task`` has in both
    runs: ``a`` and ``b`` each run's mean on the paired cells {mean, ci95, n}, ``diff`` the paired
    B − A {mean, ci95, word, n}."""
    ta, tb = a.summary["tasks"][task], b.summary["tasks"][task]
    labels = [g["label"] for g in ta["groups"] if g["label"] in {h["label"] for h in tb["groups"]}]
    names = {m["name"] for m in tb["metrics"]}
    out = []
    for m in (m for m in ta["metrics"] if m["name"] in names):
        for label in labels:
            ca = cells([r for r in a.rows if r["task"] == task and r["label"] == label], m["name"])
            cb = cells([r for r in b.rows if r["task"] == task and r["label"] == label], m["name"])
            # the same label in two runs: seed s is the same codec draw in both, so seeds pair by value;
            # each side's mean is shown on the paired cells too, so that b − a reads off the row
            common = ca.keys() & cb.keys()
            out.append({"label": label, "metric": m["name"], "a": interval({k: ca[k] for k in common}).to_json(),
                        "b": interval({k: cb[k] for k in common}).to_json(),
                        "diff": paired(cb, ca, m["higher_is_better"], broadcast=False).to_json()})
    return out


def _task_pairs(a: Run, b: Run, task: str) -> list[str]:
    ta, tb = a.summary["tasks"][task], b.summary["tasks"][task]
    pa, pb = set(ta["prompts"]), set(tb["prompts"])
    md = [f"### {md_text(task)}", "", f"Paired {len(pa & pb)} prompt(s) ({len(pa - pb)} only in {md_text(a.name)}, "
          f"{len(pb - pa)} only in {md_text(b.name)}).", ""]
    pairs = pair_runs(a, b, task)
    for m in ta["metrics"]:
        rows = [p for p in pairs if p["metric"] == m["name"]]
        if not rows:
            continue
        md += [f"**{md_text(display(m))}**{arrow(m['higher_is_better'])}", "",
               md_row(["config", a.name, b.name, f"{b.name} − {a.name} ± 95%", f"{b.name} is", "n"]),
               "|---|---|---|---|---|---|"]
        md += [md_row([p["label"], fmt_ci(p["a"], with_n=False), fmt_ci(p["b"], with_n=False),
                       fmt_diff(p["diff"], with_word=False), p["diff"]["word"] or "—", p["diff"]["n"]]) for p in rows]
        md.append("")
    return md


def paired_section(a: Run, b: Run) -> list[str]:
    an, bn = md_text(a.name), md_text(b.name)
    md = [f"## {bn} against {an}", "",
          f"{bn} − {an} per configuration on the (prompt, codec seed) cells both runs have, ± its "
          f"95% interval (paired); the columns {an} and {bn} are each run's mean on those cells; "
          f"the word says what {bn} is.", ""]
    warnings = notes(a, b)
    md += [*warnings, ""] if warnings else []
    for task in (t for t in a.summary["tasks"] if t in b.summary["tasks"]):
        md += _task_pairs(a, b, task)
    return md


def per_prompt_section(runs: list[Run]) -> list[str]:
    """Per task and metric, one per-prompt table over every (run, configuration)."""
    md = []
    tasks = list(dict.fromkeys(task for r in runs for task in r.summary["tasks"]))
    for task in tasks:
        md += [f"## {md_text(task)}" + (": per-prompt values" if len(runs) > 1 else ""), ""]
        prompts = task_prompts(runs, task)
        for m in task_metrics(runs, task):
            md += [f"**{md_text(display(m))}**{arrow(m['higher_is_better'])}", "",
                   per_prompt_table(per_prompt_rows(per_prompt_entries(runs, task, m["name"]), prompts), prompts), ""]
    return md


def task_metrics(runs: list[Run], task: str) -> list[dict]:
    """The summary metric entries of ``task`` over ``runs``, each name once, in first-seen order."""
    return list({m["name"]: m for r in runs for m in r.summary["tasks"].get(task, {}).get("metrics", [])}.values())


def task_prompts(runs: list[Run], task: str) -> list[str]:
    """The prompts of ``task`` over ``runs``, in first-seen order."""
    return list(dict.fromkeys(p for r in runs if task in r.summary["tasks"]
                              for p in r.summary["tasks"][task]["prompts"]))


def per_prompt_entries(runs: list[Run], task: str, metric: str) -> list[tuple[str, dict, dict]]:
    """(row name, {prompt: value}, {prompt: baseline value}) per (run, configuration) of ``task``:
    a per-prompt table's, as :func:`harness.report.model.per_prompt_rows` takes them."""
    entries = []
    for r in (r for r in runs if task in r.summary["tasks"]):
        base = values(r.rows, task, BASELINE_LABEL, metric)
        for g in r.summary["tasks"][task]["groups"]:
            label = f"{g['label']} ({fmt(g.get('bits_per_coord'), 3)} b/coord)"
            name = f"{r.name}: {label}" if len(runs) > 1 else label
            entries.append((name, values(r.rows, task, g["label"], metric), base))
    return entries


def load_checked(run_dirs: list[Path]) -> list[Run]:
    """The runs, each later one checked against the first (:func:`check_models`, :func:`check_prompts`)."""
    runs = [load_run(d) for d in run_dirs]
    for other in runs[1:]:
        check_models(runs[0], other)
        check_prompts(runs[0], other)
    return runs


def compare(run_dirs: list[Path]) -> str:
    """Markdown: each later run paired against the first (after the checks above), then the
    per-prompt tables of all. Raises CompareError / FileNotFoundError."""
    runs = load_checked(run_dirs)
    first = runs[0]
    md = [f"# Comparison of {len(runs)} run(s)", ""]
    for other in runs[1:]:
        md += paired_section(first, other)
    md += per_prompt_section(runs)
    return "\n".join(md).rstrip() + "\n"
