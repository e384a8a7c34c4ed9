"""Text from input (prompt ids, labels, names, messages that quote them) made safe to show where it is not
Markdown or HTML (those: :mod:`harness.report.formatting`): on a terminal, and in a matplotlib plot."""
from __future__ import annotations

import re
import unicodedata

_CONTROL = "".join(map(chr, (*range(0x20), *range(0x7f, 0xa0))))  # C0, DEL and C1
_INVISIBLE = ("Cf", "Zl", "Zp")


def printable(s, keep: str = "") -> str:
    """Any string as text to show: every control character but those in ``keep`` becomes U+FFFD, so that
    an id or label shown on a terminal or a page cannot drive it (an ESC sequence that retitles the window
    or recolours the line, a bell, a carriage return that overwrites what came before), and so does every
    invisible format or separator character (Unicode Cf, Zl, Zp: a bidi override that shows an id reordered,
    a zero-width character that makes two ids look one)."""
    text = re.sub(f"[{re.escape(''.join(c for c in _CONTROL if c not in keep))}]", "\ufffd", str(s))
    return "".join("\ufffd" if unicodedata.category(c) in _INVISIBLE else c for c in text)


def plot_text(s) -> str:
    """Text from input as matplotlib draws it literally: an even count of '$' would make it mathtext (and
    an id like 'cost $x^^$' would fail the run once its rollout is done), so each '$' is escaped (matplotlib
    shows '\\$' as '$' outside math); control characters but line breaks become U+FFFD."""
    return printable(s, keep="\n").replace("$", r"\$")
