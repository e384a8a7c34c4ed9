"""The typed values a report shows, read from the summary's entries (:mod:`harness.report.summary`, as
summary.json holds them): a metric's description, a mean with its 95% interval, a paired difference with its
test, word and Benjamini-Hochberg q, a non-inferiority verdict. Numbers are floats (summary.json's 'inf' and
'nan' strings read back, :func:`harness.run.rows.num`) or None where the summary has none; counts, bit widths
and ranks stay integers. :mod:`harness.report.formatting` writes them as text."""
from __future__ import annotations

from dataclasses import dataclass

from harness.run.rows import num


def _pair(ci) -> tuple[float | None, float | None] | None:
    return None if ci is None else (num(ci[0]), num(ci[1]))


@dataclass(frozen=True)
class Metric:
    """A metric as the reports label, sort and plot it: ``higher_is_better`` None where it has no direction;
    ``scale``: the registry's ('linear', 'log', 'dB')."""
    name: str
    display: str
    higher_is_better: bool | None
    scale: str = "linear"

    @classmethod
    def of(cls, m: "Metric | dict") -> "Metric":
        """From a summary metric entry {name, display, higher_is_better, scale} (an older one: no display)."""
        if isinstance(m, Metric):
            return m
        return cls(m["name"], m.get("display", m["name"]), m.get("higher_is_better"), m.get("scale", "linear"))


@dataclass(frozen=True)
class Estimate:
    """A mean over ``n`` cells with its 95% interval (None: one cell, or not finite), and where the summary
    gives them the smallest and largest cell."""
    mean: float | None
    ci95: tuple[float | None, float | None] | None = None
    n: int | None = None
    min: float | None = None
    max: float | None = None

    @classmethod
    def of(cls, s: "Estimate | dict | None") -> "Estimate | None":
        """From a summary entry {mean, ci95, n[, min, max]} (None stays None; a difference: its mean, interval, n)."""
        if s is None or isinstance(s, Estimate):
            return s
        if isinstance(s, Difference):
            return cls(s.mean, s.ci95, s.n)
        return cls(num(s.get("mean")), _pair(s.get("ci95")), s.get("n"), num(s.get("min")), num(s.get("max")))


@dataclass(frozen=True)
class Difference:
    """A paired difference A − B (or codec − baseline) over the ``n`` cells both have, ± its 95% interval;
    ``word``: what A is where the test rejects (better / worse / indistinguishable; None: not compared),
    ``word_bh`` after the Benjamini-Hochberg correction whose adjusted p-value is ``q``; ``test``: 't' or
    'mcnemar'; ``mdd``: the smallest difference the cells would detect (80% power at 5%)."""
    mean: float | None
    ci95: tuple[float | None, float | None] | None = None
    n: int | None = None
    word: str | None = None
    word_bh: str | None = None
    q: float | None = None
    test: str | None = None
    mdd: float | None = None

    @classmethod
    def of(cls, d: "Difference | dict | None") -> "Difference | None":
        """From a summary comparison {mean, ci95, n, word[, word_bh, q, test, mdd]} (None stays None)."""
        if d is None or isinstance(d, Difference):
            return d
        return cls(num(d.get("mean")), _pair(d.get("ci95")), d.get("n"), d.get("word"), d.get("word_bh"),
                   num(d.get("q")), d.get("test"), num(d.get("mdd")))


@dataclass(frozen=True)
class NonInferiority:
    """With ``--margin``: whether the one-sided 95% ``bound`` of the difference from the baseline lies within it."""
    verdict: str
    bound: float | None

    @classmethod
    def of(cls, d: dict | None) -> "NonInferiority | None":
        return None if d is None else cls(d["verdict"], num(d.get("bound")))
