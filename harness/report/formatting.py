"""How report.md, report.html and ``harness compare`` write a value: numbers, a mean with its 95% interval,
a paired difference with its word, bytes, a metric's name and direction, text from input made safe for
Markdown or HTML (for a terminal or a plot: :mod:`harness.run.safe_text`), and a plot's file name. Every renderer
formats through these, so the two reports never disagree on a digit."""
from __future__ import annotations

import html
import math
import re
from pathlib import Path
from urllib.parse import quote

from harness.report.values import Difference, Estimate, Metric, NonInferiority
from harness.run.rows import num, safe_name, within
from harness.run.safe_text import printable


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


def with_rate(label: str, rate: float | None) -> str:
    """A configuration's label with its cache bits per coordinate: 'kivi@2 (2.25 b)' (the label alone without)."""
    return label if rate is None else f"{label} ({fmt(rate, 3)} b)"


def fmt_delta(x) -> str:
    """A difference with its sign ('+0.012'); '—' where there is none or it is not finite."""
    x = num(x) if not isinstance(x, float) else x
    if x is None or math.isnan(x) or math.isinf(x):  # e.g. SNR against itself is inf: no difference to show
        return "—"
    s = fmt(x, 3)
    return s if s.startswith("-") or s in ("0", "nan") else "+" + s


def fmt_ci(s: Estimate | dict | None, with_n: bool = True) -> str:
    """A mean with its 95% interval (an :class:`~harness.report.values.Estimate`, or a summary entry or
    comparison as a dict) as 'mean ± half-width', with n; 'mean (n = 1)' where there is no interval."""
    e = Estimate.of(s)
    if e is None or e.mean is None:
        return "—"
    text = fmt(e.mean)
    if e.ci95 is not None and None not in e.ci95:
        text += " ± " + fmt((e.ci95[1] - e.ci95[0]) / 2, 2)
    elif e.n == 1:
        return text + " (n = 1)"
    return text + (f" (n={e.n})" if with_n and e.n is not None else "")


def fmt_diff(d: Difference | dict | None, with_word: bool = True) -> str:
    """A paired difference (a :class:`~harness.report.values.Difference` or its dict {mean, ci95, word, n}):
    '+0.012 ± 0.004 better' ('—' without one)."""
    d = Difference.of(d)
    if d is None or d.mean is None or math.isnan(d.mean):
        return "—"
    text = fmt_delta(d.mean)
    if d.ci95 is not None:
        text += " ± " + fmt((d.ci95[1] - d.ci95[0]) / 2, 2)
    if not with_word:
        return text
    return text + (f" {d.word}" if d.word else " (n = 1)" if d.n == 1 else "")


def fmt_pct(e: Estimate | dict | None) -> str:
    """A score in [0, 1] × 100 as RULER reports it, with its 95% interval's half-width: '93.5 ± 2.1'."""
    e = Estimate.of(e)
    if e is None or e.mean is None:
        return "—"
    return f"{100 * e.mean:.1f}" + (f" ± {100 * (e.ci95[1] - e.ci95[0]) / 2:.1f}" if e.ci95 else "")


TESTS = {"mcnemar": "McNemar", "t": "t"}


def fmt_test(test: str | None) -> str:
    """The name of a comparison's test ('—' where none)."""
    return TESTS.get(test, "—")


def fmt_non_inferior(ni: NonInferiority | None) -> str:
    """A non-inferiority verdict with its bound ('—' where none was tested)."""
    if ni is None:
        return "—"
    return f"{ni.verdict} (bound {fmt_delta(ni.bound)})" if ni.bound is not None else ni.verdict


def fmt_bytes(x) -> str:
    """A byte count in B, KiB, MiB or GiB ('—' for none)."""
    x = num(x)
    if x is None:
        return "—"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(x) < 1024 or unit == "GiB":
            return f"{x:.0f} {unit}" if unit == "B" else f"{x:.1f} {unit}"
        x /= 1024


def point(s: Estimate | dict) -> tuple[float, float, float] | None:
    """(mean, error below, error above) of a mean with its interval, as a plot draws it: its 95% interval
    (0 without); None where the mean is missing or not finite."""
    e = Estimate.of(s)
    mean = e.mean
    if mean is None or not math.isfinite(mean):
        return None
    lo, hi = e.ci95 if e.ci95 else (mean, mean)
    return mean, mean - lo, hi - mean


# --- words --------------------------------------------------------------------------------------
def arrow(higher_is_better) -> str:
    return {True: " ↑", False: " ↓"}.get(higher_is_better, "")


def display(m: Metric | dict) -> str:
    """A metric's display name (summaries written before display names: the name)."""
    return Metric.of(m).display


def metric_title(m: Metric | dict) -> str:
    """A metric's display name with the arrow of its direction: 'KL (nats) ↓'."""
    m = Metric.of(m)
    return f"{m.display}{arrow(m.higher_is_better)}"


def verdict(p: Difference | dict) -> str:
    """The word (with †: it does not survive the Benjamini-Hochberg correction, ``word_bh``); without one,
    why: nothing paired or not finite, one cell, or an interval that holds 0."""
    p = Difference.of(p)
    if p.word:
        return p.word + ("†" if p.word_bh not in (None, p.word) else "")
    if not p.n or p.mean is None or not math.isfinite(p.mean):
        return "not comparable"
    return "one cell (n = 1)" if p.n == 1 else "indistinguishable"


# --- text from input ----------------------------------------------------------------------------
#: the characters md_text may backslash-escape (Markdown's own), which the HTML page's inline reader unescapes
MD_SPECIAL = "\\`*_[]|#!~"
#: where one of them acts, md_text escapes it: a backslash, a table cell's '|', a code span's backtick, emphasis
#: ('*', '~', a '_' at a word's edge: inside a word it is text), a link's '](' '][' or ']:'; elsewhere ('[' of an
#: interval, '_' of an id) it shows as written, so report.md stays readable as text
_MD_ACTIVE = re.compile(r"[\\`*|~]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])|\](?=[(\[:])")


def md_text(s) -> str:
    """Text from input (prompt ids, labels, names, paths) as Markdown that shows it as written and nothing more:
    control characters (NUL, line breaks, ESC) become U+FFFD, HTML's & < > become entities (so no raw HTML
    reaches a renderer), and Markdown's own characters are backslash-escaped where they would act (no emphasis,
    links, code spans or table cells made from an id: :data:`_MD_ACTIVE`)."""
    text = printable(s).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _MD_ACTIVE.sub(lambda m: "\\" + m.group(0), text)


def md_code(s) -> str:
    """Text from input as a Markdown code span that shows it as written (not in a table cell, where a '|'
    would still split it). Inside a code span neither backslash escapes nor entities work, and none are
    needed but for backticks: the fence is one backtick longer than the text's longest run of them, and a
    space pads text that begins or ends with one (or with a space: a renderer strips one each side)."""
    text = printable(s)
    fence = "`" * (1 + max(map(len, re.findall("`+", text)), default=0))
    pad = " " if text[:1] == "`" or text[-1:] == "`" or (text[:1] == text[-1:] == " " and text.strip()) else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def md_row(cells) -> str:
    """A Markdown table row, each cell's text shown as written (:func:`md_text`): every table of report.md
    and ``harness compare`` is written through this, so no label, name or id adds a cell or a link."""
    return "| " + " | ".join(md_text(c) for c in cells) + " |"


def html_text(s) -> str:
    """Text from input inside raw HTML in Markdown (a ``<summary>``): control characters become U+FFFD
    and HTML's specials entities; Markdown's escapes would show there as backslashes."""
    return html.escape(printable(s))


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
    each part one file-name component (:func:`harness.run.rows.safe_name`: names read from registry.json are data)."""
    return f"{safe_name(task)}_{safe_name(name)}.png"
