"""Text from input made safe to show on a terminal and in a plot (harness/run/safe_text.py)."""
from __future__ import annotations

import unicodedata

from harness.run.safe_text import plot_text, printable


def test_printable_replaces_what_drives_a_terminal_or_hides_itself():
    hostile = "id\x1b]0;T\x07\r\x9b31m\u202eevil\u200b\u2028end"
    shown = printable(hostile)
    assert all(unicodedata.category(c) not in ("Cc", "Cf", "Zl", "Zp") for c in shown)
    assert shown.replace("\ufffd", "") == "id]0;T31mevilend"  # only those characters replaced, one each
    assert printable("a\nb", keep="\n") == "a\nb" and printable("a\nb") == "a\ufffdb"
    assert printable("naïve 中文 ok") == "naïve 中文 ok"


def test_plot_text_is_literal_for_matplotlib():
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig = plt.figure()
    fig.suptitle(plot_text("cost $x^^$ now"))
    fig.canvas.draw()  # mathtext would raise on '^^'
    plt.close(fig)
