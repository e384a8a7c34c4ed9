"""report.html read with the standard library's html.parser, for the page tests: its tags in order,
every element closed where it was opened, the tables' text, the plots, the media and what each
local reference points at."""
from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlparse

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}
MEDIA = ("video", "audio", "img", "source")


class Page(HTMLParser):
    def __init__(self, path: Path):
        super().__init__(convert_charrefs=True)
        self.path = Path(path)
        self.elements: list[tuple[str, dict]] = []
        self.tables: list[dict] = []  # {"class", "text", "rows"}
        self.problems: list[str] = []
        self._open: list[str] = []
        self._table: dict | None = None
        self.feed(self.path.read_text(encoding="utf-8"))
        self.close()
        self.problems += [f"<{t}> never closed" for t in self._open]

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.elements.append((tag, a))
        if tag == "table":
            self._table = {"class": a.get("class", ""), "text": "", "rows": 0}
            self.tables.append(self._table)
        elif tag == "tr" and self._table is not None:
            self._table["rows"] += 1
        if tag not in VOID:
            self._open.append(tag)

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        if not self._open or self._open[-1] != tag:
            self.problems.append(f"</{tag}> closes <{self._open[-1] if self._open else 'nothing'}>")
            return
        self._open.pop()
        if tag == "table":
            self._table = None
        elif tag in ("td", "th") and self._table is not None:
            self._table["text"] += " | "

    def handle_data(self, data):
        if self._table is not None:
            self._table["text"] += data

    # --- what the tests ask ---------------------------------------------------------------------------
    def find(self, tag: str, cls: str | None = None) -> list[dict]:
        return [a for t, a in self.elements if t == tag and (cls is None or cls in (a.get("class") or "").split())]

    def plot_ids(self) -> list[str]:
        return [a["id"] for a in self.find("div", "plotly-graph-div")]

    def references(self) -> list[str]:
        """Every src and href of the page but in-page anchors."""
        return [a[k] for _, a in self.elements for k in ("src", "href") if a.get(k) and not a[k].startswith("#")]

    def media_sources(self) -> list[str]:
        return [a["src"] for t, a in self.elements if t in MEDIA and a.get("src")]

    def local_file(self, ref: str) -> Path | None:
        """The file a relative reference points at (None for a URL with a scheme: network)."""
        u = urlparse(ref)
        return None if u.scheme or u.netloc else (self.path.parent / unquote(u.path))
