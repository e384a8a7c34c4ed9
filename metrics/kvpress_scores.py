"""kvpress's long-context scorers, written from their definitions: RULER and LongBench as
kvpress's ``evaluation/benchmarks/*/calculate_metrics.py`` score them. Pure functions of strings.

Every scorer gives one row's score in [0, 1]; kvpress reports a task's mean x 100 (2 decimals).
Signature: ``scorer(prediction, answers, all_classes=())`` with ``answers`` the row's reference
strings.

RULER: the prediction is cleaned as kvpress does (ends stripped, control characters U+0000-U+001F
removed), then each reference is looked for as a case-insensitive substring:
``string_match_all`` is the share found (niah, vt, cwe, fwe), ``string_match_part`` whether any
is (qa_1, qa_2).

LongBench: the prediction's leading whitespace is dropped (and for trec, triviaqa, samsum and lsht
everything after its first line), then the dataset's metric is taken against each reference and
the best kept: ``qa_f1`` (bag-of-words F1 after SQuAD normalisation), ``rouge_l`` (the ``rouge``
package's summary-level ROUGE-L F), ``classification``, ``retrieval``, ``count``, ``code_sim``.
The Chinese datasets that need jieba's word segmentation (multifieldqa_zh, dureader, vcsum) are
not scored.
"""
from __future__ import annotations

import re
import string
from collections import Counter
from difflib import SequenceMatcher
from typing import Callable, Sequence

from metrics.text import MODALITY as TEXT  # noqa: F401  (the text modality: declared before its metrics here register)
from metrics.registry import register_metric

_CONTROL = re.compile(r"[\x00-\x1f]")


def ruler_clean(prediction: str) -> str:
    """The prediction as kvpress's RULER scorer reads it: stripped, control characters removed."""
    return _CONTROL.sub("", prediction.strip()).strip()


def _found(prediction: str, answers: Sequence[str]) -> list[bool]:
    text = ruler_clean(prediction).lower()
    return [a.lower() in text for a in answers]


@register_metric("string_match_all", "text", higher_is_better=True, display="string match (all)",
                 description="RULER: share of the reference strings found in the output (case-insensitive)")
def string_match_all(prediction: str, answers: Sequence[str], all_classes: Sequence[str] = ()) -> float:
    hits = _found(prediction, answers)
    return sum(hits) / len(hits) if hits else 0.0


@register_metric("string_match_part", "text", higher_is_better=True, display="string match (any)",
                 description="RULER qa: 1 if any reference string is found in the output (case-insensitive)")
def string_match_part(prediction: str, answers: Sequence[str], all_classes: Sequence[str] = ()) -> float:
    return float(any(_found(prediction, answers)))


# --- LongBench ------------------------------------------------------------------------------------
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_NO_PUNCT = str.maketrans("", "", string.punctuation)


def squad_normalize(text: str) -> str:
    """Lower-cased, ASCII punctuation deleted (not replaced), the articles a/an/the dropped,
    whitespace collapsed: the SQuAD normalisation LongBench's qa_f1 uses."""
    return " ".join(_ARTICLES.sub(" ", text.lower().translate(_NO_PUNCT)).split())


def _token_f1(pred: list[str], ref: list[str]) -> float:
    common = sum((Counter(pred) & Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def _qa_f1(prediction: str, reference: str, all_classes: Sequence[str]) -> float:
    return _token_f1(squad_normalize(prediction).split(), squad_normalize(reference).split())


def _sentences(text: str) -> list[list[str]]:
    """The ``rouge`` package's reading of a text: pieces between '.', each whitespace-collapsed and
    split on single spaces (so a blank piece is one empty word)."""
    return [" ".join(piece.split()).split(" ") for piece in text.split(".") if piece]


def _lcs_words(ref: list[str], hyp: list[str]) -> set[str]:
    """The words of one longest common subsequence of ``ref`` and ``hyp``: the one the ``rouge``
    package reconstructs (walking back from the end, a tie moves along ``hyp``)."""
    n, m = len(ref), len(hyp)
    table = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(1, n + 1):
        row, above = table[i], table[i - 1]
        for j in range(1, m + 1):
            row[j] = above[j - 1] + 1 if ref[i - 1] == hyp[j - 1] else max(above[j], row[j - 1])
    words, i, j = set(), n, m
    while i and j:
        if ref[i - 1] == hyp[j - 1]:
            words.add(ref[i - 1])
            i, j = i - 1, j - 1
        elif table[i - 1][j] > table[i][j - 1]:
            i -= 1
        else:
            j -= 1
    return words


def _rouge_l(prediction: str, reference: str, all_classes: Sequence[str]) -> float:
    """Summary-level ROUGE-L F as ``rouge`` 1.0.1 computes it by default: distinct words, the
    overlap is the union of the words of each (reference sentence, predicted sentence) LCS."""
    hyp, ref = _sentences(prediction), _sentences(reference)
    if not hyp or not ref:  # the package raises on an empty text; LongBench scores that 0
        return 0.0
    union: set[str] = set()
    for r in ref:
        for h in hyp:
            union |= _lcs_words(r, h)
    precision = len(union) / len({w for s in hyp for w in s})
    recall = len(union) / len({w for s in ref for w in s})
    return 2 * precision * recall / (precision + recall + 1e-8)


def _classification(prediction: str, reference: str, all_classes: Sequence[str]) -> float:
    """1/k when the reference is among the k class names found in the prediction. Names that are
    part of the reference without being it are dropped first, by LongBench's loop that deletes from
    the list it walks, so the name right after a dropped one is never looked at (kept as is)."""
    found = [c for c in all_classes if c in prediction]
    i = 0
    while i < len(found):
        if found[i] in reference and found[i] != reference:
            del found[i]
        i += 1
    return 1.0 / len(found) if reference in found else 0.0


_PARAGRAPH = re.compile(r"(?:Paragraph |段落)(\d+)")


def paragraph_id(reference: str) -> str | None:
    """The paragraph number a passage_retrieval reference names ("Paragraph 7", "段落7")."""
    m = _PARAGRAPH.search(reference)
    return m.group(1) if m else None


def _share_of_numbers(prediction: str, target: str) -> float:
    numbers = re.findall(r"\d+", prediction)
    return numbers.count(target) / len(numbers) if numbers else 0.0


def _retrieval(prediction: str, reference: str, all_classes: Sequence[str]) -> float:
    target = paragraph_id(reference)
    return _share_of_numbers(prediction, target) if target is not None else 0.0


def _count(prediction: str, reference: str, all_classes: Sequence[str]) -> float:
    return _share_of_numbers(prediction, str(reference))


def _code_sim(prediction: str, reference: str, all_classes: Sequence[str]) -> float:
    """The prediction's first line holding no '`', '#' or '//', against the reference by
    fuzzywuzzy's ratio (difflib's, in whole percent; equal strings 1, an empty one 0)."""
    line = next((s for s in prediction.lstrip("\n").split("\n") if not any(t in s for t in ("`", "#", "//"))), "")
    if line == reference:
        return 1.0
    if not line or not reference:
        return 0.0
    return round(100 * SequenceMatcher(None, line, reference).ratio()) / 100


def _best(fn: Callable[[str, str, Sequence[str]], float]) -> Callable[..., float]:
    def score(prediction: str, answers: Sequence[str], all_classes: Sequence[str] = ()) -> float:
        return max([0.0] + [float(fn(prediction, a, all_classes)) for a in answers])

    score.__doc__ = f"best over the answers of {fn.__name__.lstrip('_')}: {fn.__doc__ or ''}".strip()
    return score


_LONGBENCH_METRICS = {
    "qa_f1": (_qa_f1, "qa F1", "LongBench: bag-of-words F1 after SQuAD normalisation, best over references"),
    "rouge_l": (_rouge_l, "ROUGE-L", "LongBench: summary-level ROUGE-L F (the rouge package's), best over references"),
    "classification": (_classification, "classification",
                       "LongBench: 1/k if the reference is among the k class names in the output"),
    "retrieval": (_retrieval, "retrieval",
                  "LongBench: share of the numbers in the output that are the reference paragraph's"),
    "count": (_count, "count", "LongBench: share of the numbers in the output equal to the reference count"),
    "code_sim": (_code_sim, "code similarity", "LongBench: fuzzy ratio of the first code line to the reference"),
}
SCORERS: dict[str, Callable[..., float]] = {"string_match_all": string_match_all,
                                            "string_match_part": string_match_part}
for _name, (_fn, _display, _description) in _LONGBENCH_METRICS.items():
    SCORERS[_name] = register_metric(_name, "text", higher_is_better=True, display=_display,
                                     description=_description)(_best(_fn))

#: LongBench dataset -> its metric (LongBench's own table); '_e' / '-e' names are LongBench-E's
LONGBENCH = {
    "narrativeqa": "qa_f1", "qasper": "qa_f1", "multifieldqa_en": "qa_f1", "hotpotqa": "qa_f1",
    "2wikimqa": "qa_f1", "musique": "qa_f1", "triviaqa": "qa_f1",
    "gov_report": "rouge_l", "qmsum": "rouge_l", "multi_news": "rouge_l", "samsum": "rouge_l",
    "trec": "classification", "lsht": "classification",
    "passage_retrieval_en": "retrieval", "passage_retrieval_zh": "retrieval", "passage_count": "count",
    "lcc": "code_sim", "repobench-p": "code_sim",
}
FIRST_LINE = ("trec", "triviaqa", "samsum", "lsht")  # few-shot datasets: only the first line is the answer
NEEDS_JIEBA = ("multifieldqa_zh", "dureader", "vcsum")
#: RULER task family (the task name up to its first '_') -> scorer
RULER = {"niah": "string_match_all", "vt": "string_match_all", "cwe": "string_match_all",
         "fwe": "string_match_all", "qa": "string_match_part"}


def longbench_name(task: str) -> str:
    """A LongBench(-E) task name without its '-e' / '_e' suffix."""
    for suffix in ("_e", "-e"):
        if task.endswith(suffix) and task[: -len(suffix)] in LONGBENCH:
            return task[: -len(suffix)]
    return task


def scorer_for(task: str) -> str:
    """The scorer kvpress uses for a row of ``task`` (its dataset's ``task`` column)."""
    name = longbench_name(task)
    if name in LONGBENCH:
        return LONGBENCH[name]
    if name in NEEDS_JIEBA:
        raise ValueError(f"task '{task}' is scored on jieba's Chinese word segmentation, which is not implemented "
                         f"here; leave its rows out or pick a scorer ({', '.join(SCORERS)})")
    family = task.split("_")[0]
    if family in RULER:
        return RULER[family]
    raise ValueError(f"task '{task}' is neither a RULER task ({', '.join(f'{k}_*' for k in RULER)}) nor a "
                     f"LongBench one ({', '.join(sorted(LONGBENCH))}); pick a scorer ({', '.join(SCORERS)})")


@register_metric("kvpress_score", "text", higher_is_better=True, display="kvpress score",
                 description="the row's kvpress scorer, by its task: RULER string match or LongBench's metric for "
                             "the dataset, 0..1 (kvpress reports a task's mean x 100)")
def kvpress_score(prediction: str, answers: Sequence[str], task: str = "", all_classes: Sequence[str] = (),
                  scorer: str = "auto") -> float:
    """``scorer`` 'auto': by ``task`` as kvpress does (:func:`scorer_for`); else a name in SCORERS.
    LongBench's metrics read the prediction as LongBench does (leading whitespace dropped; only its
    first line for the few-shot datasets)."""
    name = scorer_for(task) if scorer == "auto" else scorer
    if name not in SCORERS:
        raise ValueError(f"unknown kvpress scorer '{name}'. Available: auto, {', '.join(SCORERS)}")
    if name in _LONGBENCH_METRICS:
        prediction = prediction.lstrip()
        if longbench_name(task) in FIRST_LINE:
            prediction = prediction.split("\n")[0].lstrip()
    return SCORERS[name](prediction, list(answers), list(all_classes or ()))
