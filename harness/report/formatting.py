"""How report.md, report.html and ``harness compare`` write a value: numbers, a mean with its 95% interval,
a paired difference with its word, bytes, a metric's name and direction, text from input made safe for
Markdown or HTML, and the numbers of a per-prompt table. Every renderer formats through these, so the two
reports never disagree on a digit."""
from __future__ import annotations

import html
import math
import re
from pathlib import Path
from urllib.parse import quote

from harness.run.rows import num, within


# --- numbers ------------------------------------------------------------------------------------
def fmt(x, digits: int = 4) -> str:
    """A number with ``digits`` significant digits (scientific outside [1e-3, 1e5)); '—' for none."""
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
    """A difference with its sign ('+0.012'); '—' where there is none or it is not finite."""
    x = num(x) if not isinstance(x, float) else x
    if x is None or math.isnan(x) or math.isinf(x):  # e.g. SNR against itself is inf: no difference to show
        return "—"
    s = fmt(x, 3)
    return s if s.startswith("-") or s in ("0", "nan") else "+" + s


def fmt_ci(s: dict | None, with_n: bool = True) -> str:
    """A summary metric entry (or comparison) as 'mean ± half-width' of its 95% interval, with n;
    'mean (n = 1)' where there is no interval."""
    if not s or num(s.get("mean")) is None:
        return "—"
    ci, n = s.get("ci95"), s.get("n")
    text = fmt(s["mean"])
    if ci is not None and num(ci[0]) is not None and num(ci[1]) is not None:
        text += " ± " + fmt((num(ci[1]) - num(ci[0])) / 2, 2)
    elif n == 1:
        return text + " (n = 1)"
    return text + (f" (n={n})" if with_n and n is not None else "")


def fmt_diff(d: dict | None, with_word: bool = True) -> str:
    """A paired difference {mean, ci95, word, n}: '+0.012 ± 0.004 better' ('—' without one)."""
    if not d or num(d.get("mean")) is None or math.isnan(num(d["mean"])):
        return "—"
    ci = d.get("ci95")
    text = fmt_delta(d["mean"])
    if ci is not None:
        text += " ± " + fmt((num(ci[1]) - num(ci[0])) / 2, 2)
    if not with_word:
        return text
    return text + (f" {d['word']}" if d.get("word") else " (n = 1)" if d.get("n") == 1 else "")


def fmt_bytes(x) -> str:
    """A byte count in B, KiB, MiB or GiB ('—' for none)."""
    x = num(x)
    if x is None:
        return "—"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(x) < 1024 or unit == "GiB":
            return f"{x:.0f} {unit}" if unit == "B" else f"{x:.1f} {unit}"
        x /= 1024


def point(s: dict) -> tuple[float, float, float] | None:
    """(mean, error below, error above) of a summary metric entry, as a plot draws it: its 95% interval
    (0 without); None where the mean is missing or not finite."""
    mean = num(s.get("mean"))
    if mean is None or not math.isfinite(mean):
        return None
    ci = s.get("ci95")
    lo, hi = (num(ci[0]), num(ci[1])) if ci else (mean, mean)
    return mean, mean - lo, hi - mean


# --- words --------------------------------------------------------------------------------------
def arrow(higher_is_better) -> str:
    return {True: " ↑", False: " ↓"}.get(higher_is_better, "")


def display(m: dict) -> str:
    """A summary metric entry's display name (summaries written before display names: the name)."""
    return m.get("display", m["name"])


def metric_title(m: dict) -> str:
    """A summary metric entry's display name with the arrow of its direction: 'KL (nats) ↓'."""
    return f"{display(m)}{arrow(m['higher_is_better'])}"


def verdict(p: dict) -> str:
    """The word (with †: it does not survive the Benjamini-Hochberg correction, ``word_bh``); without one,
    why: nothing paired or not finite, one cell, or an interval that holds 0."""
    if p.get("word"):
        return p["word"] + ("†" if p.get("word_bh") not in (None, p["word"]) else "")
    mean = num(p.get("mean"))
    if not p.get("n") or mean is None or not math.isfinite(mean):
        return "not comparable"
    return "one cell (n = 1)" if p.get("n") == 1 else "indistinguishable"


# --- text from input ----------------------------------------------------------------------------
_MD_SPECIAL = re.compile(r"[\\`*_\[\]|#!~]")


def _printable(s) -> str:
    return "".join("\ufffd" if ord(c) < 0x20 or 0x7f <= ord(c) < 0xa0 else c for c in str(s))


def md_text(s) -> str:
    """Text from input (prompt ids, paths) as Markdown that shows it as written and nothing more:
    control characters (NUL, line breaks) become U+FFFD, HTML's & < > become entities (so no raw HTML
    reaches a renderer), and Markdown's own characters are backslash-escaped (no emphasis, links,
    code spans or table cells made from an id)."""
    text = _printable(s).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _MD_SPECIAL.sub(lambda m: "\\" + m.group(0), text)


def html_text(s) -> str:
    """Text from input inside raw HTML in Markdown (a ``<summary>``): control characters become U+FFFD
    and HTML's specials entities; Markdown's escapes would show there as backslashes."""
    return html.escape(_printable(s))


def md_link(rel, root: Path) -> str | None:
    """A run-folder-relative artifact path from a row as a Markdown link target (percent-encoded), or
    None where it is not one: absolute, naming a scheme, or resolving outside ``root`` (by '..' or a
    symbolic link), as the HTML page decides (:class:`harness.report.html.media.Media`)."""
    rel = str(rel)
    if ":" in rel or any(ord(c) < 0x20 for c in rel) or within(root, rel) is None:  # ':' would name a scheme
        return None
    return quote(Path(rel).as_posix())


def plot_file(task: str, name: str) -> str:
    """report.md's PNG of ``task``'s plot ``name`` (a metric, or 'effective_length'): '<task>_<name>.png',
    every character but letters, digits, '-', '_' and '.' as '_'."""
    def safe(s: str) -> str:
        return "".join(c if c.isalnum() or c in "-_." else "_" for c in s)

    return f"{safe(task)}_{safe(name)}.png"


# --- the numbers of a per-prompt table ----------------------------------------------------------
def values(rows: list[dict], task: str, label: str, metric: str) -> dict:
    """{prompt: value}; a configuration with several codec seeds gets the mean over its seeds."""
    by_prompt: dict[str, list[float]] = {}
    for r in rows:
        if r["task"] == task and r["label"] == label and num(r.get(metric)) is not None:
            by_prompt.setdefault(r["prompt"], []).append(num(r[metric]))
    return {p: sum(v) / len(v) for p, v in by_prompt.items()}


def per_prompt_row(vals: dict, base: dict, prompts: list[str]) -> tuple[list, list, float | None]:
    """(value per prompt, [min, mean, max] of the finite ones, mean difference from ``base`` over
    the prompts both have) of one per-prompt table row; None where there is nothing."""
    xs = [num(vals.get(p)) for p in prompts]
    finite = [x for x in xs if x is not None and not math.isnan(x)]
    deltas = [num(vals[p]) - num(base[p]) for p in prompts
              if num(vals.get(p)) is not None and num(base.get(p)) is not None]
    deltas = [d for d in deltas if not math.isnan(d)]
    stats = [min(finite), sum(finite) / len(finite), max(finite)] if finite else [None] * 3
    return xs, stats, sum(deltas) / len(deltas) if deltas else None
