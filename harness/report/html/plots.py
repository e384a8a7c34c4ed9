"""The interactive plots of report.html (plotly, offline): each figure becomes an HTML snippet with
a fixed div id and no template of plotly's own, so that identical runs give identical bytes. The
page loads plotly.js once (``plotly.min.js`` beside it, :mod:`harness.report.html.page`).

- :func:`rate_quality`: a metric's mean against the true key bits per coordinate, one trace per
  codec (and run, in ``harness compare``), the 95% intervals as error bars, the baseline dashed;
  hovering a point shows the configuration, its value ± interval, the interval, its bytes and its
  paired difference from the baseline (a :class:`~harness.report.sections.RateFigure`, which report.md
  draws as a PNG).
- :func:`effective_length`: the score against context length of an
  :class:`~harness.report.sections.EffectiveLength` section, as report.md's PNG.
- :func:`curves`: small multiples of per-step series, one trace per configuration: the video
  task's per-frame drift and the audio task's per-scale teacher-forced curves.
"""
from __future__ import annotations

import math

import plotly.graph_objects as go
import plotly.io as pio
from plotly.subplots import make_subplots

from harness.report.formatting import display, fmt, fmt_bytes, fmt_ci, fmt_diff, metric_title, point
from harness.report.sections import EffectiveLength, RateFigure, RatePoint, log_axis
from harness.report.values import Metric
from harness.run.rows import num

CONFIG = {"displaylogo": False, "responsive": True, "modeBarButtonsToRemove": ["select2d", "lasso2d"]}
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
SYMBOLS = ("circle", "square", "diamond", "triangle-up", "x", "star")
DASHES = ("solid", "dot", "dash", "dashdot", "longdash")
AXIS = {"showgrid": True, "gridcolor": "#e6e6e6", "zeroline": False, "showline": True, "linecolor": "#999",
        "ticks": "outside", "tickcolor": "#999", "automargin": True}


def _layout(**kw) -> dict:
    """A plain layout (no plotly template: it would add kilobytes of defaults to every figure)."""
    return {"template": "none", "font": {"family": "system-ui, sans-serif", "size": 12},
            "margin": {"l": 60, "r": 20, "t": 50, "b": 50}, "hoverlabel": {"align": "left"},
            "legend": {"font": {"size": 11}}, "paper_bgcolor": "white", "plot_bgcolor": "white", **kw}


def snippet(fig: go.Figure, div_id: str, height: int) -> str:
    """The figure as a <div> and the script that draws it (plotly.js loaded by the page)."""
    return pio.to_html(fig, include_plotlyjs=False, full_html=False, div_id=div_id, config=CONFIG,
                       default_height=f"{height}px", default_width="100%", validate=True)


def _finite(x) -> float | None:
    x = num(x)
    return x if x is not None and math.isfinite(x) else None


# --- rate against quality ---------------------------------------------------------------------------
def _hover(p: RatePoint, baseline: bool) -> list[str]:
    """customdata of one point: config, mean ± h (n), [lo, hi], key bits/coord, cache bytes, Δ."""
    ci = p.estimate.ci95
    interval = f"[{fmt(ci[0])}, {fmt(ci[1])}]" if ci else "— (n = 1)"
    return [p.label, fmt_ci(p.estimate), interval, fmt(p.x, 4), fmt_bytes(p.cache_bytes),
            "(the baseline)" if baseline else fmt_diff(p.delta)]


HOVER = ("<b>%{customdata[0]}</b><br>%{meta}: %{customdata[1]}<br>95% interval: %{customdata[2]}"
         "<br>key bits/coord: %{customdata[3]}<br>cache bytes: %{customdata[4]}<br>Δ vs baseline: %{customdata[5]}"
         "<extra>%{fullData.name}</extra>")


def rate_quality(m: Metric, series: list[tuple[str, RateFigure]], div_id: str, title: str) -> str | None:
    """Metric ``m`` against true key bits per coordinate, one :class:`~harness.report.sections.RateFigure` per
    (name, figure) of ``series`` (one run: name ""; compare: one per run). None if no codec has a point."""
    traces, baselines, colors = [], [], {}
    for k, (name, f) in enumerate(series):
        if f.baseline is not None:
            baselines.append((name, f.baseline.estimate.mean, _hover(f.baseline, True)))
        for codec, points in f.codecs:
            pts = [(p.x, point(p.estimate), _hover(p, False)) for p in points]
            color = colors.setdefault(codec, COLORS[len(colors) % len(COLORS)])
            traces.append(dict(
                x=[p[0] for p in pts], y=[p[1][0] for p in pts], customdata=[p[2] for p in pts],
                error_y={"type": "data", "symmetric": False, "array": [p[1][2] for p in pts],
                         "arrayminus": [p[1][1] for p in pts], "thickness": 1.2, "width": 4},
                name=f"{name}: {codec}" if name else codec, mode="lines+markers", meta=display(m),
                line={"color": color, "dash": DASHES[k % len(DASHES)], "width": 1.5},
                marker={"symbol": SYMBOLS[k % len(SYMBOLS)], "size": 8, "color": color}, hovertemplate=HOVER))
    if not traces:
        return None
    log = log_axis(m, [f for _, f in series])
    xs = [x for t in traces for x in t["x"]]
    fig = go.Figure([go.Scatter(t) for t in traces])
    for k, (name, base, hover) in enumerate(baselines):
        if log and base <= 0:  # a KL baseline is 0: off a log axis
            continue
        fig.add_trace(go.Scatter(
            x=[min(xs), max(xs)], y=[base, base], customdata=[hover, hover], mode="lines", meta=display(m),
            name=f"{name}: baseline" if name else "baseline (uncompressed)", hovertemplate=HOVER,
            line={"color": "black", "dash": DASHES[(k + 2) % len(DASHES)], "width": 1}))
    direction = {True: " (higher is better)", False: " (lower is better)"}.get(m.higher_is_better, "")
    # the title on the left, clear of the mode bar on the right
    fig.update_layout(_layout(title={"text": title, "font": {"size": 14}, "x": 0.01, "xanchor": "left"},
                              hovermode="closest",
                              xaxis={**AXIS, "title": {"text": "true bits per key coordinate (from stored bytes)"}},
                              yaxis={**AXIS, "title": {"text": metric_title(m) + direction},
                                     "type": "log" if log else "linear"}))
    return snippet(fig, div_id, 430)


# --- score against context length ---------------------------------------------------------------------
def effective_length(e: EffectiveLength, div_id: str) -> str | None:
    """The task's score against context length, one line per configuration, the baseline dashed and the
    threshold's share of it dotted (report.md's PNG of the same section). None without the baseline's points."""
    if not e.baseline:
        return None
    fig = go.Figure()
    for i, c in enumerate(e.configs):
        pts = [(p.context, p.score, fmt(p.ratio, 3)) for p in c.points if p.score is not None]
        fig.add_trace(go.Scatter(
            x=[p[0] for p in pts], y=[p[1] for p in pts], customdata=[p[2] for p in pts], mode="lines+markers",
            name=c.label, line={"color": COLORS[i % len(COLORS)], "width": 1.5},
            marker={"symbol": SYMBOLS[i % len(SYMBOLS)], "size": 8},
            hovertemplate=f"<b>{c.label}</b><br>context %{{x}}: %{{y}}<br>score ÷ baseline: %{{customdata}}"
                          "<extra></extra>"))
    xs, ys = [x for x, _ in e.baseline], [y for _, y in e.baseline]
    fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name="baseline (uncompressed)",
                             line={"color": "black", "dash": "dash", "width": 1}))
    fig.add_trace(go.Scatter(x=xs, y=[e.threshold * y for y in ys], mode="lines",
                             name=f"{e.threshold:.0%} of the baseline", line={"color": "black", "dash": "dot",
                                                                               "width": 1}))
    fig.update_layout(_layout(title={"text": f"{e.task}: {e.metric} against context length", "font": {"size": 14},
                                     "x": 0.01, "xanchor": "left"}, hovermode="closest",
                              xaxis={**AXIS, "title": {"text": "context length (tokens)"}, "type": "log",
                                     "tickvals": list(e.contexts), "ticktext": [str(c) for c in e.contexts]},
                              yaxis={**AXIS, "title": {"text": e.metric}}))
    return snippet(fig, div_id, 430)


# --- per-step curves ---------------------------------------------------------------------------------
def curves(panels: list[tuple[str, str]], series: dict[str, dict], div_id: str, xlabel: str,
           inf_note: str = "identical (inf)") -> str | None:
    """One panel per (key, title) of ``panels``, one line per label of ``series`` ({label: {key:
    [values]}}), x the step index. A None value is +inf (an identical frame's PSNR): drawn on a line
    5 above every finite value of its panel and labelled ``inf_note``. Each panel carries a
    vertical cursor (a shape) that the page's script moves with the players. None if empty."""
    panels = [(k, t) for k, t in panels if any(c.get(k) for c in series.values())]
    if not panels:
        return None
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=[t for _, t in panels], horizontal_spacing=0.07)
    colors = {label: COLORS[i % len(COLORS)] for i, label in enumerate(series)}
    shapes = []
    for col, (key, _) in enumerate(panels, start=1):
        finite = [y for c in series.values() for y in (c.get(key) or []) if _finite(y) is not None]
        cap = (max(finite) + 5) if finite else 100.0
        for label, c in series.items():
            ys = c.get(key) or []
            if not ys:
                continue
            fig.add_trace(go.Scatter(
                x=list(range(len(ys))), y=[cap if _finite(y) is None else y for y in ys], mode="lines+markers",
                text=[inf_note if _finite(y) is None else fmt(y) for y in ys], name=label, legendgroup=label,
                showlegend=col == 1, line={"color": colors[label], "width": 1.5}, marker={"size": 4},
                hovertemplate=f"<b>{label}</b><br>{xlabel} %{{x}}: %{{text}}<extra></extra>"), row=1, col=col)
        axis = "" if col == 1 else str(col)
        shapes.append({"type": "line", "xref": f"x{axis}", "yref": f"y{axis} domain", "x0": 0, "x1": 0, "y0": 0,
                       "y1": 1, "line": {"color": "#555", "width": 1, "dash": "dot"}})
    fig.update_xaxes(**AXIS, title={"text": xlabel})
    fig.update_yaxes(**AXIS)
    fig.update_layout(_layout(shapes=shapes, hovermode="closest", margin={"l": 50, "r": 20, "t": 60, "b": 45},
                              legend={"orientation": "h", "y": -0.25}))
    return snippet(fig, div_id, 330)
