"""Which configurations are better, from paired comparisons on the headline metric.

- :func:`rank`: per bit width, a configuration's rank is 1 + the number of configurations that
  are significantly better than it (:func:`harness.stats.pass_fail.compare`, 95%: McNemar's exact test
  for pass/fail cells, the interval of the paired differences otherwise), so configurations no
  comparison can tell apart share a rank (1, 1, 3); listed best mean first.
- :func:`front`: the rate-matched view across bit widths: a configuration is on the front
  unless another one storing no more (``cache_bits_per_coord``) is significantly better.
- :meth:`Comparisons.q_values`: Benjamini-Hochberg adjusted p-values over every comparison made.

A metric without a direction ranks nothing (ranks and front are None); its comparisons still
say "higher" / "lower".
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from harness.stats.pass_fail import Paired, benjamini_hochberg, compare
from harness.stats.intervals import Cells, interval


@dataclass(frozen=True)
class Config:
    """One cache configuration of a task: its headline-metric cells and mean true rate."""
    label: str
    bits: int
    cells: Cells
    rate: float | None = None  # mean cache_bits_per_coord; None: not recorded


class Comparisons:
    """Paired comparisons among ``configs``, each computed once (A - B and B - A share one)."""

    def __init__(self, configs: list[Config], higher_is_better: bool | None):
        self.higher_is_better = higher_is_better
        self.cells = {c.label: c.cells for c in configs}
        self._done: dict[tuple[str, str], Paired] = {}

    def __call__(self, a: str, b: str) -> Paired:
        """``a`` - ``b``."""
        if (a, b) not in self._done:
            self._done[(a, b)] = compare(self.cells[a], self.cells[b], self.higher_is_better)
        return self._done[(a, b)]

    def q_values(self) -> dict[tuple[str, str], float | None]:
        """{(a, b): q} for every comparison made so far: Benjamini-Hochberg adjusted p-values across them
        (a pair compared both ways counts once)."""
        keys = list(dict.fromkeys(tuple(sorted(k)) for k in self._done))
        qs = benjamini_hochberg([self._done[k if k in self._done else k[::-1]].p for k in keys])
        by_pair = dict(zip(keys, qs))
        return {k: by_pair[tuple(sorted(k))] for k in self._done}

    def better(self, a: str, b: str) -> bool:
        """``a`` significantly better than ``b``."""
        return self(a, b).word == "better"


def _best_first(configs: list[Config], higher_is_better: bool | None) -> list[tuple[Config, object]]:
    """(config, its interval) ordered by mean, the better end first (higher first without a
    direction); configs without a mean (none, or NaN) last; ties by label."""
    sign = -1 if higher_is_better is False else 1

    def key(ci):
        mean = ci[1].mean
        missing = mean is None or math.isnan(mean)  # NaN would leave the order to chance
        return missing, 0.0 if missing else -sign * mean, ci[0].label

    return sorted(((c, interval(c.cells)) for c in configs), key=key)


def rank(configs: list[Config], cmp: Comparisons) -> dict:
    """{"configs": [{label, rank, mean, ci95, n}], "pairs": [{a, b, mean, ci95, word}]} for the
    configs of one bit width; each pair is a - b with a listed before b."""
    ordered = _best_first(configs, cmp.higher_is_better)
    labels = [c.label for c, _ in ordered]
    entries = []
    for c, iv in ordered:
        r = None if cmp.higher_is_better is None else 1 + sum(cmp.better(o, c.label) for o in labels if o != c.label)
        entries.append({"label": c.label, "rank": r, "mean": iv.mean, "ci95": iv.ci95, "n": iv.n})
    pairs = [{"a": a, "b": b, **cmp(a, b).to_json()} for i, a in enumerate(labels) for b in labels[i + 1:]]
    return {"configs": entries, "pairs": pairs}


def against(research: list[Config], deployed: list[Config], cmp: Comparisons) -> list[dict]:
    """[{a, b, a_rate, b_rate, mean, ci95, word, n}]: every ``research`` config against every ``deployed``
    one (an engine's cache), paired on the same prompts and seeds, whatever their bit widths."""
    return [{"a": r.label, "b": d.label, "a_rate": r.rate, "b_rate": d.rate, **cmp(r.label, d.label).to_json()}
            for r in sorted(research, key=lambda c: (c.rate is None, c.rate or 0.0, c.label))
            for d in sorted(deployed, key=lambda c: (c.rate is None, c.rate or 0.0, c.label))]


def front(configs: list[Config], cmp: Comparisons) -> list[dict]:
    """[{label, bits, cache_bits_per_coord, front, dominated_by}] ordered by rate: ``front`` is
    False where a config with no more cache bits per coordinate is significantly better (those
    are ``dominated_by``, cheapest first); None without a direction or a recorded rate."""
    out = []
    for c in sorted(configs, key=lambda c: (c.rate is None, c.rate or 0.0, c.label)):
        if c.rate is None or cmp.higher_is_better is None:
            out.append({"label": c.label, "bits": c.bits, "cache_bits_per_coord": c.rate, "front": None,
                        "dominated_by": []})
            continue
        cheaper = sorted((o for o in configs if o is not c and o.rate is not None and o.rate <= c.rate),
                         key=lambda o: (o.rate, o.label))
        by = [o.label for o in cheaper if cmp.better(o.label, c.label)]
        out.append({"label": c.label, "bits": c.bits, "cache_bits_per_coord": c.rate, "front": not by,
                    "dominated_by": by})
    return out
