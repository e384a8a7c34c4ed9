"""RULER's scores, as its ``scripts/eval/synthetic/constants.py`` (NVIDIA/RULER, commit c3f5e3b) takes
them per task family: ``string_match_all`` (the share of the reference strings found in the output,
case-insensitive) for niah, vt, cwe and fwe, ``string_match_part`` (whether any is) for qa; the
strings and the prediction's cleaning are :mod:`metrics.kvpress_scores`'. RULER reports a task's
mean x 100; a row here is 0..1."""
from __future__ import annotations

from typing import Sequence

from metrics.kvpress_scores import SCORERS, scorer_for
from metrics.registry import register_metric


@register_metric("ruler_score", "text", higher_is_better=True, display="RULER score",
                 description="RULER's metric of the row's task, 0..1: string_match_all (share of the references "
                             "found in the output, case-insensitive) for niah, vt, cwe, fwe; string_match_part for qa")
def ruler_score(prediction: str, references: Sequence[str], task: str) -> float:
    """``task``: a RULER task name ('niah_multikey_2', 'vt', ...); its family picks the metric."""
    return SCORERS[scorer_for(task)](prediction, list(references))


@register_metric("ruler_pass", "text", higher_is_better=True, display="RULER pass",
                 description="1 if the output scored RULER's full mark (every reference found), else 0")
def ruler_pass(score: float) -> float:
    """``score``: the row's ruler_score."""
    return float(score >= 1.0)
