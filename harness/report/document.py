"""The report as a whole (:func:`harness.report.model.build_report` makes it): the :class:`Header`, per task a
:class:`TaskReport` holding its sections in order (:mod:`harness.report.sections`), and :class:`NotMeasured`;
:data:`SECTION_KINDS`, every kind of part, which both pages render (tests/harness/report/test_report_model.py)."""
from __future__ import annotations

from dataclasses import dataclass

from harness.report.sections import (Breakdown, Configurations, Deployed, Detectable, EffectiveLength, Front,
                                     MetricGrid, Outputs, Pairs, PerPrompt, RateGrid, RatePlots, Ranking, Section,
                                     Speed)
from harness.report.values import Metric


# --- around the tasks -----------------------------------------------------------------------
@dataclass(frozen=True)
class ModelInfo:
    """model.json's model entry as the header names it (None: the entry does not say)."""
    model_type: str | None = None
    layers: int | None = None
    q_heads: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    dtype: str | None = None
    device: str | None = None
    source: str | None = None


@dataclass(frozen=True)
class Header(Section):
    """What the run is (model, cache, codecs), its ``notes`` (Markdown lines: what a run has not stored yet),
    the configurations it ``skipped`` (label, reason) and why no speed is shown (``speed_problem``)."""
    model: str
    info: ModelInfo | None
    window: str  # the native window, in words
    protect: str
    engine_layers: tuple[tuple[str, tuple[int, ...]], ...]  # (codec, layers its engine keeps native)
    value_group: int
    value_bits: int | None  # None: the key bit width
    score_estimator: bool  # keys read through the codec's score estimator (else its reconstruction)
    seed: int
    codec_seeds: tuple[int, ...]
    codecs: tuple[str, ...]
    bits: tuple[int, ...]
    skipped: tuple[tuple[str, str], ...] = ()
    notes: tuple[str, ...] = ()
    speed_problem: str | None = None

    @property
    def title(self) -> str:
        return f"KV-cache codec report: {self.model}"

    @property
    def titles(self) -> tuple[str, ...]:
        return (self.title,)


@dataclass(frozen=True)
class NotMeasured(Section):
    """What the run could not measure, and why (e.g. LPIPS without its weights): a '—' is never silent."""
    reasons: tuple[tuple[str, tuple[str, ...]], ...]

    @property
    def titles(self) -> tuple[str, ...]:
        return ("Not measured",)


# --- the tasks and the whole -------------------------------------------------------------------------
@dataclass(frozen=True)
class TaskReport(Section):
    """A task: its prompts and codec seeds, the ``headline`` metric (None: none) and its sections in order."""
    name: str
    prompts: tuple[str, ...]
    seeds: tuple[int, ...]
    headline: Metric | None
    sections: tuple[Section, ...]

    @property
    def titles(self) -> tuple[str, ...]:
        return (self.name,)


@dataclass(frozen=True)
class Report:
    header: Header
    tasks: tuple[TaskReport, ...]
    not_measured: NotMeasured | None

    def parts(self) -> list[Section]:
        """Every section of the report, in order: the header, each task and its sections, what was not measured."""
        inner = [s for t in self.tasks for s in (t, *t.sections)]
        return [self.header, *inner, *([self.not_measured] if self.not_measured else [])]


#: every kind of section, in report.md's order
SECTION_KINDS = (Header, TaskReport, Ranking, Front, RateGrid, MetricGrid, Configurations, RatePlots, Deployed, Pairs,
                 Detectable, Breakdown, EffectiveLength, Speed, PerPrompt, Outputs, NotMeasured)
