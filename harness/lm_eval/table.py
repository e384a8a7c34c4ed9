"""The lm-eval results table (``harness lm-eval-sweep``): task metrics, agreement with ``--model hf``
and 95% intervals, from lm-eval result dicts run with ``log_samples=True``.

Input: ``simple_evaluate``'s dict, of which this reads ``results[task]`` ("acc,none": 0.875, ...),
``higher_is_better[task]`` and ``samples[task]``: one entry per document and filter with
``doc_id``, ``filter``, ``resps`` (one list per request: ``[[(loglik, is_greedy)], ...]`` for
log-likelihood requests, ``[["text"]]`` for a generation) and each metric's value for that
document (``"acc": 1.0``).

Every figure is computed per document and gets its interval from :mod:`harness.stats.intervals`: a document
is a prompt (keyed "task/doc_id"), the codec seed is the seed, so a configuration run under several
codec seeds has the cells (doc, seed) and the crossed interval. The reference (``--model hf``) has
no codec and one run; :func:`harness.stats.intervals.paired` broadcasts it across a codec's seeds. Per document:

- a task metric: the document's value (0/1 for acc and exact_match);
- mean |Δ loglik|: the mean over the document's log-likelihood requests (its choices) of
  |loglik - loglik of hf|; is_greedy agree: the share of those requests whose is_greedy equals
  hf's; generations equal: the share of its generations identical to hf's (0 or 1 for one request).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from harness.stats.intervals import Cells, interval, paired
from harness.report.formatting import fmt_ci, fmt_diff

#: the agreement columns: (name, header)
AGREEMENT = (("abs_dloglik", "mean abs Δ loglik"), ("greedy_agree", "is_greedy agree"),
             ("gen_equal", "generations equal"))


@dataclass(frozen=True)
class Run:
    """One lm-eval run of a configuration: its codec seed, ``simple_evaluate``'s dict and wall seconds."""
    seed: int
    result: dict
    seconds: float = 0.0


@dataclass(frozen=True)
class Row:
    """A table row: its label and its runs (one per codec seed; one for a deterministic codec)."""
    label: str
    runs: tuple[Run, ...]


def task_metrics(result: dict, task: str) -> list[tuple[str, str]]:
    """(metric, filter) of each aggregated metric of ``task``, e.g. [("acc", "none")]."""
    out = []
    for key, v in result["results"][task].items():
        name, _, filt = key.partition(",")
        if isinstance(v, (int, float)) and not isinstance(v, bool) and filt and "stderr" not in name:
            out.append((name, filt))
    return out


def metric_label(task: str, metric: str, filt: str) -> str:
    return f"{task} {metric}" + ("" if filt == "none" else f" ({filt})")


def _doc(task: str, doc_id) -> str:
    return f"{task}/{doc_id}"


def _samples(result: dict, task: str, filt: str | None = None) -> dict:
    """{doc_id: sample} of ``task`` (the first filter's samples where ``filt`` is None)."""
    samples = result["samples"][task]
    filt = filt if filt is not None else (samples[0].get("filter", "none") if samples else "none")
    return {s["doc_id"]: s for s in samples if s.get("filter", "none") == filt}


def metric_cells(run: Run, task: str, metric: str, filt: str) -> Cells:
    """{(task/doc_id, seed): the document's value of ``metric``}."""
    return {(_doc(task, d), run.seed): float(s[metric]) for d, s in _samples(run.result, task, filt).items()}


def agreement_cells(run: Run, ref: dict, tasks: list[str]) -> dict[str, Cells]:
    """{column in AGREEMENT: cells} of ``run`` against the reference result ``ref`` (module docstring);
    a column without any request of its kind has no cells."""
    out: dict[str, dict] = {name: {} for name, _ in AGREEMENT}
    for task in tasks:
        theirs = _samples(ref, task)
        for d, s in _samples(run.result, task).items():
            if d not in theirs:
                continue
            pairs = [(x[0], y[0]) for x, y in zip(s["resps"], theirs[d]["resps"], strict=True)]
            ll = [(x, y) for x, y in pairs if not isinstance(x, str)]
            gen = [(x, y) for x, y in pairs if isinstance(x, str)]
            key = (_doc(task, d), run.seed)
            if ll:
                out["abs_dloglik"][key] = sum(abs(x[0] - y[0]) for x, y in ll) / len(ll)
                out["greedy_agree"][key] = sum(bool(x[1]) == bool(y[1]) for x, y in ll) / len(ll)
            if gen:
                out["gen_equal"][key] = sum(x == y for x, y in gen) / len(gen)
    return out


def _union(parts) -> dict:
    out = {}
    for p in parts:
        out.update(p)
    return out


def row_figures(row: Row, ref: Run, tasks: list[str]) -> dict:
    """{"metrics": {label: (Interval, Comparison vs ref)}, "agreement": {column: Interval},
    "bits": (key, value) mean bits per coordinate or None, "seconds": total} of ``row``."""
    figures: dict = {"metrics": {}, "agreement": {}}
    hib = ref.result.get("higher_is_better", {})
    for task in tasks:
        for metric, filt in task_metrics(ref.result, task):
            cells = _union(metric_cells(r, task, metric, filt) for r in row.runs)
            base = metric_cells(ref, task, metric, filt)
            figures["metrics"][metric_label(task, metric, filt)] = (
                interval(cells), paired(cells, base, hib.get(task, {}).get(metric)))
    per_run = [agreement_cells(r, ref.result, tasks) for r in row.runs]
    for name, _ in AGREEMENT:
        figures["agreement"][name] = interval(_union(a[name] for a in per_run))
    kv = [r.result.get("config", {}).get("kvcodec", {}).get("mean") for r in row.runs]
    figures["bits"] = None if not all(kv) else tuple(
        sum(m[f] for m in kv) / len(kv) for f in ("bits_per_coord", "value_bits_per_coord"))
    figures["seconds"] = sum(r.seconds for r in row.runs)
    return figures


def table(ref: Run, rows: list[Row], tasks: list[str]) -> list[str]:
    """Markdown lines: the ``--model hf`` row, then one per row, each cell 'mean ± h' (95%) and each
    task metric's paired difference from hf with its word."""
    labels = _labels(ref, tasks)
    head = ["model_args", "codec seeds"]
    for label in labels:
        head += [label, f"Δ {label.split(' ', 1)[1]} vs hf"]
    head += [h for _, h in AGREEMENT] + ["key bits", "value bits", "s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    hf = row_figures(Row("hf", (ref,)), ref, tasks)
    cells = ["`--model hf`", "—"]
    for label in labels:
        cells += [fmt_ci(hf["metrics"][label][0].to_json(), with_n=False), "—"]
    lines.append("| " + " | ".join(cells + ["0", "1", "1", "32", "32", f"{ref.seconds:.0f}"]) + " |")
    for row in rows:
        lines.append(table_row(row, ref, tasks))
    return lines


def _labels(ref: Run, tasks: list[str]) -> list[str]:
    return [metric_label(t, m, f) for t in tasks for m, f in task_metrics(ref.result, t)]


def table_row(row: Row, ref: Run, tasks: list[str]) -> str:
    """The markdown line of ``row`` in :func:`table`."""
    f = row_figures(row, ref, tasks)
    cells = [row.label, " ".join(str(r.seed) for r in row.runs)]
    for label in _labels(ref, tasks):
        iv, cmp = f["metrics"][label]
        cells += [fmt_ci(iv.to_json(), with_n=False), fmt_diff(cmp.to_json())]
    cells += [fmt_ci(f["agreement"][name].to_json(), with_n=False) for name, _ in AGREEMENT]
    bits = f["bits"]
    cells += [f"{b:.2f}" for b in bits] if bits and all(math.isfinite(b) for b in bits) else ["—", "—"]
    return "| " + " | ".join(cells + [f"{f['seconds']:.0f}"]) + " |"
