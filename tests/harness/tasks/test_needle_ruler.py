"""harness/tasks/needle.py with ``ruler``: RULER's niah forms (multikey, multivalue, multiquery) in its
wording, scored by string_match_all; the run preset with RULER's defaults; the task's own rows
unchanged without it."""
from __future__ import annotations

import re

import pytest
from helpers.tiny_lm import tiny_causal_lm

from adapters.cache.config import CacheConfig
from harness.tasks import get_task

NEEDLE = re.compile(r"One of the special magic numbers for ([a-z]+-[a-z]+) is: (\d{7})\.")


@pytest.fixture(scope="module")
def lm():
    return tiny_causal_lm("qwen2")


def _built(lm, variant: str, **opts):
    task = get_task("needle")(contexts=(900,), depths=(0.5,), ruler=variant, needles=4, max_new_tokens=4, **opts)
    p = task.prompts()[0]
    b = task.build(lm, p, seed=0)
    return task, p, b, lm.decode(b["ids"])


def test_multikey_asks_one_of_four_keys_in_ruler_singular_wording(lm):
    task, p, b, text = _built(lm, "multikey")
    needles = NEEDLE.findall(text)
    assert len(needles) == 4
    keys, values = [k for k, _ in needles], [v for _, v in needles]
    assert len(set(keys)) == 4 and len(set(values)) == 4
    assert b["expected"] == [b["value"]] and (b["key"], b["value"]) in needles
    assert text.startswith("A special magic number is hidden within the following text. Make sure to memorize it. "
                           "I will quiz you about the number afterwards.\n")
    assert text.endswith(f"\nWhat is the special magic number for {b['key']} mentioned in the provided text?\n"
                         f"Answer: The special magic number for {b['key']} mentioned in the provided text is")


def test_multivalue_hides_four_values_of_one_key(lm):
    task, p, b, text = _built(lm, "multivalue")
    needles = NEEDLE.findall(text)
    assert len(needles) == 4 and {k for k, _ in needles} == {b["key"]}
    assert sorted(b["expected"]) == sorted(v for _, v in needles) and len(set(b["expected"])) == 4
    assert text.startswith("Some special magic numbers are hidden within the following text.")
    assert f"What are all the special magic numbers for {b['key']} mentioned in the provided text?" in text
    assert text.endswith(f"The special magic numbers for {b['key']} mentioned in the provided text are")


def test_multiquery_asks_every_key(lm):
    task, p, b, text = _built(lm, "multiquery")
    needles = NEEDLE.findall(text)
    assert len(needles) == 4 and len({k for k, _ in needles}) == 4 and len({v for _, v in needles}) == 4
    keys = [k for k, _ in needles]
    by_key = dict(needles)
    # RULER joins the asked keys "a, b, c, and d"; the values are expected in the keys' order
    asked = b["query"].replace(", and ", ", ").split(", ")
    assert sorted(asked) == sorted(keys) and b["expected"] == [by_key[k] for k in asked]
    assert b["query"] == f"{asked[0]}, {asked[1]}, {asked[2]}, and {asked[3]}"
    assert f"What are all the special magic numbers for {b['query']} mentioned in the provided text?" in text


def test_ruler_scoring_is_string_match_all(lm, tmp_path):
    task, p, b, _ = _built(lm, "multivalue")
    v = b["expected"]
    # two of the four values said, one split by a control character (RULER's cleaning removes it): 3 of 4
    said = f"They are {v[2]}, {v[0][:3]}\x00{v[0][3:]} and {v[1]}."
    scores = task._scores(said, "nothing", b)
    assert scores == {"string_match_all": 0.75, "baseline_string_match_all": 0.0}
    base = task.baseline(lm, p, seed=0)
    row = task.evaluate(lm, p, CacheConfig(residual=8), 0, base, tmp_path)
    assert row["kl"] == 0.0 and row["output_match"] == 1.0
    assert row["string_match_all"] == row["baseline_string_match_all"]
    assert "exact_match" not in row  # four values asked: no single number to match
    one = _built(lm, "multikey")
    assert set(one[0]._scores(f"it is {one[2]['value']}", "", one[2])) == {
        "exact_match", "baseline_exact_match", "string_match_all", "baseline_string_match_all"}


def test_without_ruler_the_task_is_unchanged(lm, tmp_path):
    task = get_task("needle")(contexts=(600,), depths=(0.5,), needles=2, max_new_tokens=3)
    p = task.prompts()[0]
    b = task.build(lm, p, seed=0)
    text = lm.decode(b["ids"])
    assert text.startswith("Some special magic numbers are hidden within the following text. Make sure to memorize "
                           "it. I will quiz you about the numbers afterwards.\n")
    assert text.endswith(f"\nWhat is the special magic number for {b['key']} mentioned in the provided text?\n"
                         f"Answer: The special magic number for {b['key']} mentioned in the provided text is")
    row = task.evaluate(lm, p, CacheConfig(residual=8), 0, task.baseline(lm, p, seed=0), tmp_path)
    assert {"exact_match", "baseline_exact_match"} <= set(row) and not any("string_match" in k for k in row)
    # a report leaves out a declared metric that no row carries
    from harness.report.run_data import describe_task
    from harness.report.summary import task_metrics

    needle = describe_task(type(task))
    assert task_metrics(needle, [row]) == ["exact_match", "output_match", "length_ratio", "kl", "top1_agree"]
    assert "string_match_all" in task_metrics(needle, [row, {"string_match_all": 0.5}])


def test_bad_ruler_value_and_the_preset():
    with pytest.raises(ValueError, match="task option needle.ruler=multi: must be one of '', 'multikey', 'multivalue'"):
        get_task("needle")(ruler="multi")
    from harness.run.config import RunConfig, with_preset

    cfg = RunConfig(**with_preset("ruler", {}))
    assert cfg.tasks == ["needle"]
    assert cfg.task_options["needle"] == {"ruler": "multikey", "needles": 4, "max_new_tokens": 128}
    mixed = RunConfig(**with_preset("ruler", {"task_options": {"needle": {"ruler": "multiquery"}}}))
    assert mixed.task_options["needle"]["ruler"] == "multiquery" and mixed.task_options["needle"]["needles"] == 4
