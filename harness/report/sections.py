"""A task's sections of the report, typed and frozen, in report.md's order (:func:`harness.report.model.build_report`
makes them; the report around them: :mod:`harness.report.document`). report.md (:mod:`harness.report.markdown`)
and report.html (:mod:`harness.report.html`) render these and nothing else, each dispatching on a section's
type, so a kind added to :data:`harness.report.document.SECTION_KINDS` must be rendered by both
(tests/harness/report/test_report_model.py).

Every section names what a reader finds it by: ``titles``, the headings both pages show for it, and
``figures``, the (task, plot name) of each plot both pages draw of it (report.md a PNG, report.html a
plotly figure). Cells are numbers, :mod:`harness.report.values` and words, never formatted text."""
from __future__ import annotations

from dataclasses import dataclass

from harness.report.formatting import fmt, metric_title, point
from harness.report.values import Difference, Estimate, Metric, NonInferiority


class Section:
    """A part of the report; ``titles`` and ``figures`` as the module says."""

    @property
    def titles(self) -> tuple[str, ...]:
        return ()

    @property
    def figures(self) -> tuple[tuple[str, str], ...]:
        return ()


# --- a task's sections, in report.md's order -------------------------------------------------------------
@dataclass(frozen=True)
class Ranked:
    label: str
    rank: int | None  # 1 + the configurations significantly better; None: not ranked
    estimate: Estimate
    rate: float | None  # key bits per coordinate


@dataclass(frozen=True)
class Ranking(Section):
    """Per bit width, best mean first, on the headline ``metric``."""
    metric: Metric
    widths: tuple[tuple[int, tuple[Ranked, ...]], ...]  # (bits, its configurations)

    @property
    def titles(self) -> tuple[str, ...]:
        return (f"Ranking on {metric_title(self.metric)}",)


@dataclass(frozen=True)
class FrontRow:
    label: str
    bits: int
    cache_bits_per_coord: float | None
    estimate: Estimate | None  # its ranking entry
    on: bool | None  # on the front; None: not comparable
    dominated_by: tuple[str, ...]


@dataclass(frozen=True)
class Front(Section):
    """The rate-matched front on the headline ``metric``."""
    metric: Metric
    rows: tuple[FrontRow, ...]

    @property
    def titles(self) -> tuple[str, ...]:
        return (f"Rate-matched front on {metric_title(self.metric)}",)


@dataclass(frozen=True)
class Rates:
    bits_per_coord: float | None
    cache_bytes: float | None


@dataclass(frozen=True)
class RateGrid(Section):
    """Codec (rows) x bit width (columns): key bits per coordinate and cache bytes (None: no such configuration)."""
    codecs: tuple[str, ...]
    bits: tuple[int, ...]
    cells: tuple[tuple[Rates | None, ...], ...]

    @property
    def titles(self) -> tuple[str, ...]:
        return ("true key bits/coord / cache bytes",)


@dataclass(frozen=True)
class MetricGrid(Section):
    """Codec (rows) x bit width (columns): ``metric``'s mean ± 95% (None: no configuration or no value)."""
    metric: Metric
    baseline: Estimate | None
    codecs: tuple[str, ...]
    bits: tuple[int, ...]
    cells: tuple[tuple[Estimate | None, ...], ...]

    @property
    def titles(self) -> tuple[str, ...]:
        base = f" (baseline {fmt(self.baseline.mean)})" if self.baseline else ""
        return (f"{metric_title(self.metric)}, mean ± 95%{base}",)


@dataclass(frozen=True)
class MetricCell:
    estimate: Estimate  # with min and max
    delta: Difference | None  # from the baseline


@dataclass(frozen=True)
class ConfigRow:
    label: str
    baseline: bool
    bits_per_coord: float | None
    value_bits_per_coord: float | None
    cache_bytes: float | None
    ratio: float | None  # cache bytes / an uncompressed cache's
    cells: tuple[MetricCell | None, ...]  # per metric of the section


@dataclass(frozen=True)
class Configurations(Section):
    metrics: tuple[Metric, ...]
    rows: tuple[ConfigRow, ...]

    @property
    def titles(self) -> tuple[str, ...]:
        return ("All configurations",)


@dataclass(frozen=True)
class RatePoint:
    label: str
    x: float | None  # true key bits per coordinate
    estimate: Estimate
    cache_bytes: float | None
    delta: Difference | None


@dataclass(frozen=True)
class RateFigure:
    """``metric`` against true key bits per coordinate: per codec its points (in the summary's order; each
    with a finite mean and rate), the baseline's level."""
    task: str
    metric: Metric
    codecs: tuple[tuple[str, tuple[RatePoint, ...]], ...]
    baseline: RatePoint | None


def log_axis(metric: Metric, figures: list[RateFigure]) -> bool:
    """Whether ``figures`` of ``metric`` go on a log y axis: where the registry says so and every codec's point,
    error bar included, can go on it (the baseline need not: a KL baseline is 0, drawn off the axis)."""
    return metric.scale == "log" and all(
        pt[0] - pt[1] > 0 for f in figures for _, pts in f.codecs for p in pts for pt in [point(p.estimate)])


@dataclass(frozen=True)
class RatePlots(Section):
    """A :class:`RateFigure` per metric that has a codec's point to draw (none: report.html says so)."""
    plots: tuple[RateFigure, ...]

    @property
    def figures(self) -> tuple[tuple[str, str], ...]:
        return tuple((f.task, f.metric.name) for f in self.plots)


@dataclass(frozen=True)
class Deployed(Section):
    """Each research codec (``rows``) against each engine's deployed cache (``cols``), paired on the headline
    ``metric``: ``cells[i][j]`` = row i − column j; ``rates``: each side's cache bits per coordinate;
    ``engines``: (engine, its columns) in column order (engine None: a run folder that does not name them)."""
    metric: Metric
    rows: tuple[str, ...]
    cols: tuple[str, ...]
    rates: tuple[tuple[str, float | None], ...]
    cells: tuple[tuple[Difference, ...], ...]
    engines: tuple[tuple[str | None, tuple[str, ...]], ...] = ()

    def rate(self, label: str) -> float | None:
        return dict(self.rates).get(label)

    def by_engine(self) -> list[tuple[str | None, tuple[str, ...], list[tuple[Difference, ...]]]]:
        """[(engine, its columns, each row's cells under them)]: the table each renderer shows per engine."""
        groups = self.engines or ((None, self.cols),)
        at = {c: j for j, c in enumerate(self.cols)}
        return [(e, cols, [tuple(row[at[c]] for c in cols) for row in self.cells]) for e, cols in groups]

    @property
    def titles(self) -> tuple[str, ...]:
        return (f"Research codecs against deployed caches on {metric_title(self.metric)}",)


@dataclass(frozen=True)
class Pair:
    a: str
    b: str
    diff: Difference  # A − B, its word for A, q


@dataclass(frozen=True)
class Pairs(Section):
    """Per bit width, every pair of configurations on the headline ``metric``; ``comparisons``: how many
    the Benjamini-Hochberg correction counts (None: not stored)."""
    metric: Metric
    comparisons: int | None
    widths: tuple[tuple[int, tuple[Pair, ...]], ...]

    @property
    def titles(self) -> tuple[str, ...]:
        return (f"Paired comparisons on {metric_title(self.metric)}",)


@dataclass(frozen=True)
class DetectableRow:
    label: str
    delta: Difference  # from the baseline, with its test and smallest detectable difference
    non_inferiority: NonInferiority | None


@dataclass(frozen=True)
class Detectable(Section):
    """Per configuration compared with the baseline on the headline ``metric``: the smallest difference its
    cells would detect, and with ``margin`` (``--margin``) whether it is shown non-inferior."""
    metric: Metric
    margin: float | None
    rows: tuple[DetectableRow, ...]

    @property
    def titles(self) -> tuple[str, ...]:
        return (f"Detectable differences from the baseline on {metric_title(self.metric)}",)


@dataclass(frozen=True)
class BreakdownRow:
    label: str
    cells: tuple[Estimate | None, ...]  # per column
    averages: tuple[Estimate | None, ...]  # per average


@dataclass(frozen=True)
class Breakdown(Section):
    """The task's score ``metric`` per ``columns`` (values of ``keys``: RULER's task @ length), and its
    average over the first key at each value of the others (``averages``)."""
    metric: str
    keys: tuple[str, ...]
    columns: tuple[str, ...]
    averages: tuple[str, ...]
    rows: tuple[BreakdownRow, ...]

    @property
    def titles(self) -> tuple[str, ...]:
        return (f"{self.metric} by {' and '.join(self.keys)}",)


@dataclass(frozen=True)
class EffectivePoint:
    context: int
    score: float | None
    baseline: float | None
    ratio: float | None


@dataclass(frozen=True)
class EffectiveConfig:
    label: str
    effective: int | None  # NoLiMa's effective length
    shown: int | None  # up to which the data establishes it
    possible: int | None  # up to which the data does not rule it out
    points: tuple[EffectivePoint, ...]


@dataclass(frozen=True)
class EffectiveLength(Section):
    """Each configuration's effective length on the score ``metric`` (``threshold``: the baseline's share it
    keeps), its score per context length, and the baseline's (``baseline``: (context, score); none: no plot)."""
    task: str
    metric: str
    threshold: float
    contexts: tuple[int, ...]
    configs: tuple[EffectiveConfig, ...]
    baseline: tuple[tuple[int, float], ...]

    @property
    def titles(self) -> tuple[str, ...]:
        return (f"Effective length on {self.metric}",)

    @property
    def figures(self) -> tuple[tuple[str, str], ...]:
        return ((self.task, "effective_length"),) if self.baseline else ()


@dataclass(frozen=True)
class SpeedRow:
    """A configuration's measured speed (:func:`harness.report.speed.summarize_speed`): prefill seconds (the
    shared forward apart), capture seconds, decode ``unit``s per second, peak MiB (None: not measured)."""
    label: str
    rollouts: int
    sequences: tuple[int, ...]
    devices: tuple[str, ...]
    unit: str
    prefill_shared: bool
    prefill: Estimate | None  # its own part: the replay and encode of a shared forward, or its whole first step
    decode: Estimate | None
    peak: Estimate | None
    shared_forward: Estimate | None = None  # the prompt batch's shared native forward (once per batch)
    capture: Estimate | None = None  # graphed decode steps' warm-up and capture


@dataclass(frozen=True)
class Speed(Section):
    """Measured, so different between identical runs: both pages put it between the markers of
    :mod:`harness.report.speed`."""
    rows: tuple[SpeedRow, ...]

    @property
    def titles(self) -> tuple[str, ...]:
        return ("Speed and memory",)


@dataclass(frozen=True)
class PerPromptRow:
    label: str
    values: tuple[float | None, ...]  # per prompt (mean over codec seeds)
    min: float | None
    mean: float | None
    max: float | None
    delta: float | None  # mean difference from the baseline over the prompts both have


@dataclass(frozen=True)
class PerPrompt(Section):
    """Per metric, each configuration's value per prompt."""
    prompts: tuple[str, ...]
    tables: tuple[tuple[Metric, tuple[PerPromptRow, ...]], ...]

    @property
    def titles(self) -> tuple[str, ...]:
        return ("Per-prompt values",)


@dataclass(frozen=True)
class OutputRow:
    """One row's artifacts: (name, path relative to the run folder, as the row gives it), and the values of
    the task's metrics it has."""
    label: str
    seed: int
    artifacts: tuple[tuple[str, object], ...]
    values: tuple[tuple[Metric, float], ...]

    @property
    def files(self) -> dict:
        """{artifact name: path as the row gives it}."""
        return dict(self.artifacts)


@dataclass(frozen=True)
class PromptOutputs:
    """A prompt's rows that have artifacts, in row order (``first_row``: the first one's index among the run's
    rows); ``media``: what the task declares of them, (kind, ((role, artifact key), ...))."""
    prompt: str
    first_row: int
    media: tuple[tuple[str, tuple[tuple[str, str], ...]], ...]
    rows: tuple[OutputRow, ...]

    @property
    def declared(self) -> dict[str, dict[str, str]]:
        """{kind: {role: artifact key}}, as the task declares its media."""
        return {kind: dict(roles) for kind, roles in self.media}


@dataclass(frozen=True)
class Outputs(Section):
    """``task``'s artifacts per prompt (media files, curves)."""
    task: str
    prompts: tuple[PromptOutputs, ...]

    @property
    def titles(self) -> tuple[str, ...]:
        return tuple(str(p.prompt) for p in self.prompts)
