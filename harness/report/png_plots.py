"""report.md's plots (matplotlib, Agg), drawn from the report's sections (:mod:`harness.report.sections`), the
data report.html's plotly figures draw too: a :class:`~harness.report.sections.RateFigure` (a metric against
the TRUE bits per key coordinate, counted from the bytes each codec stored; one line per codec with 95%
intervals as error bars, the uncompressed baseline dashed) and an
:class:`~harness.report.sections.EffectiveLength` (the score against context length). Task, metric and
configuration names are drawn as written (:func:`~harness.run.safe_text.plot_text`)."""
from __future__ import annotations

from pathlib import Path

from harness.report.formatting import point
from harness.report.sections import EffectiveLength, RateFigure, log_axis
from harness.run.rows import write_via
from harness.run.safe_text import plot_text

MARKERS = "os^vD<>pXh*"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, ax, path: Path) -> None:
    """A report plot's grid and legend, then the PNG written (no software tag: the same bytes every time)."""
    plt = _pyplot()
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    write_via(path, lambda p: fig.savefig(p, dpi=100, metadata={"Software": None}))
    plt.close(fig)


def plot_rate(path: Path, f: RateFigure) -> None:
    """``f``'s metric against true key bits per coordinate with its 95% intervals as error bars, one line per codec."""
    plt = _pyplot()
    m = f.metric
    log = log_axis(m, [f])
    base = f.baseline.estimate.mean if f.baseline else None
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ax.set_xlabel("true bits per key coordinate (from stored bytes)")
    better = {True: " (higher is better)", False: " (lower is better)"}.get(m.higher_is_better, "")
    ax.set_ylabel(plot_text(m.display) + better)
    off_axis = log and base is not None and base <= 0
    ax.set_title(plot_text(f"{f.task}: {m.display}, 95% intervals") + (" (baseline 0)" if off_axis else ""))
    for i, (codec, points) in enumerate(f.codecs):
        pts = sorted((p.x, *point(p.estimate)) for p in points)
        ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[[p[2] for p in pts], [p[3] for p in pts]],
                    marker=MARKERS[i % len(MARKERS)], capsize=3, label=plot_text(codec))
    if base is not None and not off_axis:  # a KL baseline is 0: off a log axis
        ax.axhline(base, color="black", linestyle="--", linewidth=1, label="baseline (uncompressed)")
    if log:
        ax.set_yscale("log")
    _save(fig, ax, path)


def plot_effective(path: Path, e: EffectiveLength) -> None:
    """The task's score against context length, one line per configuration, the baseline dashed; the
    threshold's share of the baseline dotted (``e.baseline`` must hold the baseline's points)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for i, c in enumerate(e.configs):
        pts = [(p.context, p.score) for p in c.points if p.score is not None]
        ax.plot([x for x, _ in pts], [y for _, y in pts], marker=MARKERS[i % len(MARKERS)], label=plot_text(c.label))
    xs, ys = [x for x, _ in e.baseline], [y for _, y in e.baseline]
    ax.plot(xs, ys, color="black", linestyle="--", label="baseline (uncompressed)")
    ax.plot(xs, [e.threshold * y for y in ys], color="black", linestyle=":", label=f"{e.threshold:.0%} of the baseline")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel(plot_text(e.metric))
    ax.set_title(plot_text(f"{e.task}: {e.metric} against context length"))
    _save(fig, ax, path)
