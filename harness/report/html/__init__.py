"""report.html: the run's report as one page to look at, beside report.md.

Written from the same report as report.md (:func:`harness.report.model.build_report`: every section of the one
is in the other), byte-identical for identical runs outside its speed sections, and
self-contained: no network; the page's style and script inline, plotly.js in ``plotly.min.js``
beside it, media (MP4s, WAVs, PNGs) referenced by their paths in the run folder.

- :func:`write_run_page` (``run_page.py``): report.html of a run's report; ``harness run`` and
  ``harness report`` write it beside report.md (:func:`harness.report.build.write_reports`).
- :func:`write_compare_page` (``compare_page.py``): ``harness compare ... --html PAGE``.
- ``plots.py``: the plotly figures; ``media.py``: the synchronized video players and the audio
  players per prompt, as each task declares its media; ``page.py``: tables, prose and rendering; the
  template ``*.html.j2`` with ``style.css`` and ``page.js`` (table sorting, player synchronization).
"""
from __future__ import annotations

try:
    import plotly  # noqa: F401
except ModuleNotFoundError as e:  # pragma: no cover - plotly is a dependency; an older .venv may lack it
    raise ModuleNotFoundError("report.html needs plotly (pip install plotly, or rerun scripts/setup); "
                              "`harness report RUN` rebuilds the report once it is installed", name=e.name) from None

from harness.report.html.compare_page import write_compare_page
from harness.report.html.run_page import write_run_page

__all__ = ["write_compare_page", "write_run_page"]
