"""Building blocks of the HTML pages: sortable tables of the report's cells, the report's Markdown
prose as HTML, the Jinja2 template, and plotly.js written once beside the page.

plotly.js (~4.8 MB) goes into ``plotly.min.js`` beside the page, referenced relatively, rather than
inline: the page stays small (it opens at once, diffs and greps as text), rewriting it does not
rewrite megabytes, and a page of a video or audio run needs the folder beside it anyway for its
media. A script loaded by ``<script src>`` works from file:// without a server or network.
"""
from __future__ import annotations

import html
import math
import re
from pathlib import Path

from harness.run.folder import RunFolder
from harness.run.rows import atomic_write, num
from harness.run.safe_text import printable
from harness.report.formatting import MD_SPECIAL, fmt, fmt_ci, fmt_delta, fmt_diff
from harness.report.sections import PerPromptRow
from harness.report.values import Difference, Estimate

HERE = Path(__file__).resolve().parent


# --- table cells --------------------------------------------------------------------------------------
def cell(text, sort=None, cls: str | None = None) -> dict:
    """A table cell: its text, the number it sorts by (None or NaN: sorts last; ±inf as JavaScript
    reads it) and a CSS class."""
    s = num(sort)
    key = None if s is None or math.isnan(s) else repr(s) if math.isfinite(s) else ("-" if s < 0 else "") + "Infinity"
    return {"t": str(text), "s": key, "c": cls}


def number(x, digits: int = 4) -> dict:
    return cell(fmt(x, digits), x)


def word_class(word) -> str | None:
    """better / worse / indistinguishable -> the CSS class that colours them."""
    return {"better": "better", "worse": "worse", "indistinguishable": "same"}.get(word)


def mean_cell(s: Estimate | dict | None) -> dict:
    """A mean with its interval (or a comparison side) as 'mean ± h', sorting by the mean."""
    e = Estimate.of(s)
    return cell(fmt_ci(e, with_n=False), e.mean if e else None)


def interval_cell(s: Estimate | None) -> dict:
    ci = s.ci95 if s else None
    return cell(f"[{fmt(ci[0])}, {fmt(ci[1])}]", ci[0]) if ci else cell("—")


def diff_cell(d: Difference | dict | None, with_word: bool = True) -> dict:
    """A paired difference '+0.012 ± 0.004 better', coloured by its word."""
    d = Difference.of(d)
    return cell(fmt_diff(d, with_word=with_word), d.mean if d else None, word_class(d.word if d else None))


def word_cell(word) -> dict:
    return cell(word or "—", None, word_class(word))


def table(head: list[str], rows: list[list[dict]], caption: str | None = None, cls: str | None = None) -> dict:
    return {"head": head, "rows": rows, "caption": caption, "cls": cls}


def per_prompt(rows: tuple[PerPromptRow, ...], prompts: list[str]) -> dict:
    """A per-prompt table (:func:`harness.report.model.per_prompt_rows`), sortable."""
    body = [[cell(r.label), *(number(x) for x in r.values), number(r.min), number(r.mean), number(r.max),
             cell(fmt_delta(r.delta), r.delta)] for r in rows]
    return table(["config", *prompts, "min", "mean", "max", "Δ mean vs baseline"], body, cls="per-prompt")


# --- the report's Markdown prose ----------------------------------------------------------------------
_EMPHASIS = ((re.compile(r"\*\*(.+?)\*\*"), r"<strong>\1</strong>"), (re.compile(r"\*(.+?)\*"), r"<em>\1</em>"))
#: what shows as written: a backslash-escaped character (md_text's), or a code span (md_code's fence of any length)
_LITERAL = re.compile(rf"\\([{re.escape(MD_SPECIAL)}])|(`+)(.+?)(?<!`)\2(?!`)")


def inline(text: str) -> str:
    """The inline Markdown that report.md's prose uses (**strong**, *em*, `code`, and the escapes of
    :func:`~harness.report.formatting.md_text` and ``md_code`` around input) as HTML, escaped: an input's
    characters show as written and never as markup."""
    literals = []

    def hold(m) -> str:  # set aside until the emphasis is done, as a private-use mark
        code = m.group(3)
        if code is not None and code[:1] == code[-1:] == " " and code.strip():
            code = code[1:-1]  # md_code's padding
        literals.append(html.escape(m.group(1)) if code is None else f"<code>{html.escape(code)}</code>")
        return f"\ue000{len(literals) - 1}\ue001"

    out = _LITERAL.sub(hold, printable(text).replace("\ue000", "\ufffd"))
    out = html.escape(html.unescape(out), quote=False)  # md_text's entities, escaped once
    for pattern, repl in _EMPHASIS:
        out = pattern.sub(repl, out)
    return re.sub("\ue000(\\d+)\ue001", lambda m: literals[int(m.group(1))], out)


def prose(lines: list[str]) -> str:
    """report.md's prose lines (paragraphs, '- ' items, '## ' headings) as HTML."""
    out, items = [], []
    for line in [*lines, ""]:
        if line.startswith("- "):
            items.append(f"<li>{inline(line[2:])}</li>")
            continue
        if items:
            out.append("<ul>" + "".join(items) + "</ul>")
            items = []
        if line.startswith("## "):
            out.append(f"<h2>{inline(line[3:])}</h2>")
        elif line.strip():
            out.append(f"<p>{inline(line)}</p>")
    return "\n".join(out)


def slug(*parts: str) -> str:
    """An HTML id from ``parts``: the same names give the same id (the page's bytes do not change)."""
    return "-".join(re.sub(r"[^A-Za-z0-9_-]+", "_", p) for p in parts)


# --- rendering ----------------------------------------------------------------------------------------
def _shown(value):
    """Every value a page shows, its control characters replaced: autoescape leaves an ESC or a bell in a label
    as it is. The page's own markup (``| safe``: style, script, plots, macros) stays markup, line breaks kept."""
    from markupsafe import Markup

    if not isinstance(value, str):
        return value
    text = printable(value, keep="\n\t")
    return Markup(text) if isinstance(value, Markup) else text


def render(template: str, path: Path, **context) -> Path:
    """Render ``template`` to ``path`` with the page's style and script inline and plotly.js beside it."""
    import jinja2
    import plotly

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE), autoescape=True, trim_blocks=True,
                             lstrip_blocks=True, keep_trailing_newline=True, undefined=jinja2.StrictUndefined,
                             finalize=_shown)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_plotly_js(path.parent)
    text = env.get_template(template).render(
        style=(HERE / "style.css").read_text(), script=(HERE / "page.js").read_text(), plotly_js=RunFolder.PLOTLY_JS,
        plotly_version=plotly.__version__, **context)
    atomic_write(path, text)
    return path


def write_plotly_js(folder: Path) -> Path:
    """plotly.min.js of the installed plotly in ``folder`` (rewritten only where it differs)."""
    from plotly.offline import get_plotlyjs

    path = RunFolder(folder).plotly_js
    js = get_plotlyjs().encode("utf-8")
    if path.is_symlink() or not path.is_file() or path.stat().st_size != len(js) or path.read_bytes() != js:
        atomic_write(path, js)
    return path
