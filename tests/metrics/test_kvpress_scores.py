"""metrics/kvpress_scores.py: RULER's and LongBench's scorers (as kvpress scores them), each against
values worked out by hand from the definitions, and the choice of scorer by a row's task."""
from __future__ import annotations

import pytest
from helpers.tolerances import U64, gamma

from metrics import get_metric
from metrics.kvpress_scores import kvpress_score, scorer_for, squad_normalize

F64 = gamma(6, U64)  # a float64 F-score (precision, recall, their harmonic mean) of small counts, each side
ROUGE = 0.5e-8 + F64  # the rouge package adds 1e-8 to P + R: F moves by F 1e-8 / (P + R) <= 0.5e-8


def score(name: str, prediction: str, answers, all_classes=()) -> float:
    return get_metric(name).impl("text")(prediction, answers, all_classes)


def test_ruler_string_match():
    assert score("string_match_all", "a ... ", ["a", "b"]) == 0.5
    assert score("string_match_all", "The values: 1234567, 7654321", ["7654321", "1234567", "1111111"]) == 2 / 3
    assert score("string_match_all", "ANSWER: Blue-Sky", ["blue-sky"]) == 1.0  # case-insensitive
    # kvpress deletes control characters before looking: "12\x0034" reads "1234"
    assert score("string_match_all", "12\x0034\n", ["1234"]) == 1.0
    assert score("string_match_part", "Paris, I think", ["London", "paris"]) == 1.0
    assert score("string_match_part", "Rome", ["London", "Paris"]) == 0.0


def test_qa_f1_normalises_as_squad():
    # punctuation is deleted, not spaced ("don't" -> "dont"); articles and case go
    assert squad_normalize("The  Don't, a CAT!") == "dont cat"
    # "cat sat on mat" vs "cat on mat": 3 common tokens, precision 3/4, recall 1
    # float64 F-scores of small counts: a few roundings each side (gamma(6) relative)
    assert score("qa_f1", "The cat sat on the mat.", ["A cat on a mat"]) == pytest.approx(2 * 0.75 / 1.75, rel=F64)
    assert score("qa_f1", "nothing alike", ["cat"]) == 0.0
    # the best reference counts; a repeated token counts as often as both hold it
    assert score("qa_f1", "cat cat", ["dog", "cat"]) == pytest.approx(2 * 0.5 * 1 / 1.5, rel=F64)


def test_rouge_l_is_the_rouge_package_summary_level_f():
    # sentences split at '.': LCS(ref, "the cat sat") = {the, cat}, LCS(ref, "on the mat") = {on, the, mat};
    # union {the, cat, on, mat} = 4 of 5 distinct words on each side
    assert score("rouge_l", "the cat sat. on the mat", ["the cat was on the mat"]) == pytest.approx(0.8, abs=ROUGE)
    # of the two LCS of "x y x" and "x x y" the package keeps "x x" (a tie moves along the prediction): 1 distinct
    # word of 2 each side, not 2 of 2
    assert score("rouge_l", "x x y", ["x y x"]) == pytest.approx(0.5, abs=ROUGE)
    assert score("rouge_l", "...", ["anything"]) == 0.0  # the package raises on an empty text; LongBench gives 0
    assert score("rouge_l", "Same words here", ["same words here"]) == pytest.approx(2 / 3, abs=ROUGE)  # case counts


def test_classification_keeps_longbench_loop():
    classes = ["entity", "other entity", "animal"]
    # "entity" is part of the reference without being it: dropped, so the answer names one class
    assert score("classification", "other entity", ["other entity"], classes) == 1.0
    assert score("classification", "animal or other entity", ["other entity"], classes) == 0.5
    assert score("classification", "animal", ["other entity"], classes) == 0.0
    # LongBench deletes from the list it walks: after dropping "ab" it never looks at "a", so "a" stays: 1/2
    assert score("classification", "abc", ["abc"], ["ab", "a", "b", "abc"]) == 0.5


def test_retrieval_count_code_sim():
    assert score("retrieval", "Paragraph 3, not paragraph 5", ["Paragraph 3"]) == 0.5
    assert score("retrieval", "段落12", ["段落12"]) == 1.0
    assert score("retrieval", "no idea", ["Paragraph 3"]) == 0.0
    assert score("count", "There are 4 unique paragraphs of 12 (4).", ["4"]) == pytest.approx(2 / 3, rel=F64)
    # the first line without '`', '#' or '//' is the prediction
    assert score("code_sim", "\n# comment\n    return x + 1\nmore", ["    return x + 1"]) == 1.0
    assert score("code_sim", "abcd", ["abce"]) == 0.75  # 3 matching characters of 8: 2*3/8
    assert score("code_sim", "abc", ["abd"]) == 0.67  # 2*2/6 = 66.7%, in whole percent
    assert score("code_sim", "```", ["x"]) == 0.0


def test_kvpress_score_picks_the_scorer_by_task():
    assert scorer_for("niah_multikey_1") == "string_match_all" and scorer_for("cwe") == "string_match_all"
    assert scorer_for("qa_2") == "string_match_part"
    assert scorer_for("hotpotqa") == scorer_for("hotpotqa_e") == "qa_f1"
    assert scorer_for("repobench-p") == scorer_for("lcc") == "code_sim"
    assert kvpress_score(" Paris\n", ["Paris", "Lyon"], task="qa_1") == 1.0
    assert kvpress_score(" Paris\n", ["Paris", "Lyon"], task="niah_single_1") == 0.5
    # LongBench's few-shot datasets keep the first line only
    assert kvpress_score("\n Paris\nLyon", ["Paris Lyon"], task="triviaqa") == pytest.approx(2 / 3, rel=F64)
    assert kvpress_score("\n Paris\nLyon", ["Paris Lyon"], task="hotpotqa") == 1.0
    assert kvpress_score("Lyon", ["Paris Lyon"], task="anything", scorer="string_match_all") == 0.0
    with pytest.raises(ValueError, match="jieba"):
        scorer_for("dureader")
    with pytest.raises(ValueError, match=r"task 'mystery' is neither a RULER task .* pick a scorer"):
        scorer_for("mystery")
