"""harness/tasks/ruler.py (+ ruler_synthetic.py, metrics/ruler.py): RULER's synthetic tasks on the tiny
model's byte tokenizer (a token is a byte, so contexts are a little longer than on a real tokenizer):
each prompt fills its context as RULER's does, its answer is derivable from its text by an
independent reading, generation is byte-identical per seed, scoring is string_match_all, and a run
writes rows with the metrics."""
from __future__ import annotations

import json
import re
from collections import Counter

import pytest
import torch
from helpers.tiny_lm import text_run_config, tiny_causal_lm
from helpers.tolerances import U64, digits_rel, gamma, sum_rel

from adapters.cache.config import CacheConfig
from harness.run.config import RunError
from harness.run.rows import read_rows
from harness.tasks import task_options
from harness.runner import run
from harness.tasks import get_task
from registry.options import allowed
from harness.tasks.ruler_synthetic import NIAH, NOISE, RULER_TASKS, TOKENS_TO_GENERATE, family, fit, zeta

#: contexts (bytes) that hold each task's template, examples and a haystack on the byte tokenizer
CONTEXTS = {**{t: 1000 for t in NIAH}, "vt": 1500, "cwe": 2400, "fwe": 1000}
#: a context holds as much haystack as fits: what one more unit could add, in bytes (RULER's tolerance)
SLACK = {"noise": len(NOISE) + 1, "essay": 40, "needle": 110, "vt": len(NOISE) + 1, "cwe": 20, "fwe": 30}
NEEDLE = re.compile(r"One of the special magic (numbers|uuids) for (\S+) is: (\S+)\.(?=\s|$)")
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")


@pytest.fixture(scope="module")
def lm():
    return tiny_causal_lm("qwen2")


def _build(lm, name: str, seed: int = 0, **opts):
    task = get_task("ruler")(tasks=(name,), contexts=(CONTEXTS[name],), repeats=2, **opts)
    prompt = task.prompts()[0]
    built = task.build(lm, prompt, seed)
    return task, prompt, built, lm.decode(built["ids"])


def test_prompt_ids_and_options():
    task = get_task("ruler")(contexts=(1024, 2048), repeats=2)
    ids = [p.id for p in task.prompts()]
    assert len(ids) == 2 * 11 * 2 == len(set(ids)) and ids[:3] == ["niah_single_1-c1024-r0", "niah_single_1-c1024-r1",
                                                                     "niah_single_2-c1024-r0"]
    assert ids == [p.id for p in get_task("ruler")(contexts=(1024, 2048), repeats=2).prompts()]
    assert RULER_TASKS == ("niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multikey_2",
                           "niah_multikey_3", "niah_multivalue", "niah_multiquery", "vt", "cwe", "fwe")
    cls = get_task("ruler")
    assert task_options(cls, {"tasks": "vt,cwe", "contexts": "1024,2048"}) == {
        "tasks": ["vt", "cwe"], "contexts": [1024, 2048], "repeats": 2, "max_new_tokens": 0, "topk": 256,
        "prefill": "all"}
    assert task_options(cls, {})["tasks"] == list(RULER_TASKS)
    with pytest.raises(RunError, match="task option ruler.tasks=vt,qa_1: must be one of 'niah_single_1'"):
        task_options(cls, {"tasks": "vt,qa_1"})
    with pytest.raises(RunError, match="task option ruler.prefill=question: must be one of 'all', 'context'"):
        task_options(cls, {"prefill": "question"})
    assert allowed(cls.Options.__dataclass_fields__["contexts"]).positions  # checked against the model's positions
    assert TOKENS_TO_GENERATE == {"niah": 128, "vt": 30, "cwe": 120, "fwe": 50}


def test_batches_hold_one_task_and_context(lm):
    task = get_task("ruler")(tasks=("vt", "fwe"), contexts=(1500, 2000), repeats=3)
    task.batch_size = 2
    batches = [[p.id for p in b] for b in task.batches(lm, task.prompts())]
    assert batches[:3] == [["vt-c1500-r0", "vt-c1500-r1"], ["vt-c1500-r2"], ["fwe-c1500-r0", "fwe-c1500-r1"]]
    assert len(batches) == 8 and sum(map(len, batches)) == 12


@pytest.mark.parametrize("name", RULER_TASKS)
def test_prompt_fills_its_context(lm, name):
    _, _, b, text = _build(lm, name)
    total = len(b["ids"]) + TOKENS_TO_GENERATE[family(name)]
    kind = NIAH[name].haystack if name in NIAH else name
    assert CONTEXTS[name] - SLACK[kind] < total <= CONTEXTS[name]
    assert len(b["ids"]) == len(text.encode())  # byte tokenizer, no chat template: RULER's 'base' form
    assert b["haystack"] > 0


@pytest.mark.parametrize("name", list(NIAH))
def test_niah_answer_is_in_the_text(lm, name):
    spec = NIAH[name]
    _, _, b, text = _build(lm, name)
    body, question = text.rsplit("\nWhat ", 1)
    needles = NEEDLE.findall(body)
    kinds, keys, values = {k for k, _, _ in needles}, [k for _, k, _ in needles], [v for _, _, v in needles]
    assert kinds == {spec.values}
    form = UUID if spec.values == "uuids" else re.compile(r"\d{7}")
    assert all(form.fullmatch(v) for v in values)
    m = re.fullmatch(r"(is|are all) the special magic (\w+) for (.+) mentioned in the provided text\? The special "
                     r"magic (\w+) for (.+) mentioned in the provided text (is|are)", question)
    assert m and m.group(3) == m.group(5)
    asked = m.group(3).replace(", and ", ", ").split(", ")
    expected = [v for key in asked for k, v in zip(keys, values) if k == key]
    assert sorted(expected) == sorted(b["answers"])
    plural = spec.v * spec.q > 1  # RULER's wording: singular where one value is asked
    noun = spec.values if plural else spec.values[:-1]
    assert (m.group(1), m.group(2), m.group(4)) == (("are all" if plural else "is"), noun, noun)
    assert text.startswith(f"{'Some' if plural else 'A'} special magic {noun} {'are' if plural else 'is'} hidden")
    assert len(asked) == spec.q and len(expected) == spec.q * spec.v
    if spec.haystack == "needle":  # many distractor needles, none with an asked key
        assert len(needles) == b["haystack"] + 1 and keys.count(asked[0]) == 1
        assert all(line == "" or NEEDLE.fullmatch(line) for line in body.split("\n")[1:])
        if spec.keys == "uuids":
            assert all(UUID.fullmatch(k) for k in keys)
    else:
        assert len(needles) == max(spec.k, spec.q) * spec.v and len(set(keys)) == max(spec.k, spec.q)
    if spec.haystack == "noise":
        lines = body.split("\n")[1:]
        assert sum(line == NOISE for line in lines) == b["haystack"] and len(lines) == b["haystack"] + len(needles)
    if spec.haystack == "essay":  # the default corpus's first words (GPL-3's preamble), needles between sentences
        assert "The GNU General Public License is a free, copyleft license" in body


def _follow(section: str, letters: int) -> set[str]:
    """The variables of ``section`` whose value reaches the number its question asks about."""
    value = re.findall(r"assigned the value (\d{5}) in the text above", section)[0]
    assign = dict(re.findall(r"^VAR ([A-Z]{%d}) = (.+?) ?$" % letters, section, flags=re.M))
    found, todo = set(), {value}
    while todo:
        todo = {v for v, rhs in assign.items() if rhs in todo or rhs.removeprefix("VAR ") in todo} - found
        found |= todo
    return found


def test_vt_chain_is_followed_from_the_text(lm):
    _, _, b, text = _build(lm, "vt")
    example, _, main = text.rpartition("Memorize and track the chain(s) of variable assignment")
    assert _follow(main, 5) == set(b["answers"]) and len(b["answers"]) == 5
    value = re.findall(r"the value (\d{5}) in the text above", main)[0]
    assert main.endswith(f"5 variables are assigned the value {value}, they are: ")
    # the in-context example: its own chain of 3-letter names, answered, then a blank line
    assert example.startswith("Memorize and track") and example.endswith("\n\n")
    answered = example.rstrip("\n").rpartition("they are: ")[2].split()
    assert len(answered) == 5 and set(answered) == _follow(example, 3)
    lines = main.split("\n\n", 1)[1].split("\nQuestion:")[0].split("\n")
    assert sum(line == NOISE for line in lines) == b["haystack"] and len(lines) == b["haystack"] + 5


def _counts(listed: str) -> tuple[list[int], Counter]:
    entries = re.findall(r"(\d+)\. (\S+)", listed)
    return [int(i) for i, _ in entries], Counter(w for _, w in entries)


def test_cwe_answers_are_the_most_common_words(lm):
    _, _, b, text = _build(lm, "cwe")
    shot, main = text.split("\nBelow is a numbered list of words.")[-2:]
    numbers, counts = _counts(main.split("\nQuestion:")[0])
    assert numbers == list(range(1, len(numbers) + 1))
    top = [w for w, _ in counts.most_common(10)]
    assert set(top) == set(b["answers"]) and len(top) == 10
    # below 4096 tokens RULER repeats the common words 6 times and the others once
    assert {counts[w] for w in top} == {6} and set(counts.values()) == {6, 1} and len(counts) == 10 + b["haystack"]
    shot_list, shot_answer = shot.split("\nQuestion:")[0], shot.split("list are: ")[1]
    _, shot_counts = _counts(shot_list)
    assert set(re.findall(r"\d+\. (\S+)", shot_answer)) == {w for w, c in shot_counts.items() if c == 3}


def test_cwe_uses_ruler_frequencies_from_4096_tokens(lm):
    task = get_task("ruler")(tasks=("cwe",), contexts=(9000,), repeats=1)
    b = task.build(lm, task.prompts()[0], 0)
    main = lm.decode(b["ids"]).split("\nBelow is a numbered list of words.")[-1]
    _, counts = _counts(main.split("\nQuestion:")[0])
    assert {counts[w] for w in b["answers"]} == {30} and set(counts.values()) == {30, 3}


def test_fwe_answers_are_the_most_frequent_coded_words(lm):
    _, _, b, text = _build(lm, "fwe")
    coded = text.split("Find the three most frequently appeared coded words. ")[1].split("\nQuestion:")[0]
    counts = Counter(coded.split())
    ranked = [w for w, _ in counts.most_common()]
    assert ranked[0] == "..." and ranked[1:4] == b["answers"]
    assert counts[ranked[3]] > counts[ranked[4]]  # the answer is unique
    assert all(re.fullmatch(r"[a-z]{6}", w) for w in ranked[1:])
    # zeta(2) frequencies: the k-th word appears int(n k^-2 / zeta(2)) times for n words
    n = b["haystack"]
    assert [counts[w] for w in ranked[:3]] == [int(n * k ** -2 / (torch.pi ** 2 / 6)) for k in (1, 2, 3)]
    # zeta's error: its float64 sum of 999 terms (total < 2: 2 gamma(999) ~ 2.2e-13) and the first Euler-Maclaurin
    # term it leaves out, a (a+1) (a+2) n^(-a-3) / 720 at n = 1000 (~3e-17 for a = 2)
    for a, want in ((2.0, torch.pi ** 2 / 6), (3.0, 1.2020569031595942)):
        assert abs(zeta(a) - want) <= 2 * gamma(999, U64) + a * (a + 1) * (a + 2) / 720 * 1000.0 ** (-a - 3) + U64


@pytest.mark.parametrize("name", ["niah_multikey_2", "vt", "cwe", "fwe"])
def test_generation_is_seeded(lm, name):
    ids = _build(lm, name)[2]["ids"]
    assert _build(lm, name)[2]["ids"] == ids  # a fresh task, same seed: byte-identical
    assert _build(lm, name, seed=1)[2]["ids"] != ids
    task = get_task("ruler")(tasks=(name,), contexts=(CONTEXTS[name],), repeats=2)
    assert task.build(lm, task.prompts()[1], 0)["ids"] != ids  # another repeat, another draw
    assert _build(lm, name, prefill="context")[2]["ids"] == ids  # the rollout's order changes no prompt


def test_fit_finds_the_largest_haystack():
    g = torch.Generator().manual_seed(0)
    steps = torch.randint(1, 30, (5000,), generator=g).cumsum(0).tolist()
    calls = []

    def tokens(n):
        calls.append(n)
        return 50 + (steps[n - 1] if n else 0)

    for budget in (49, 50, 60, 1000, 30000):
        calls.clear()
        want = max((n for n in range(5000) if tokens(n) <= budget), default=-1)
        calls.clear()
        assert fit(tokens, budget) == want
        assert len(calls) == len(set(calls)) <= 40  # each size measured once, a few dozen at most


def test_scoring_is_string_match_all():
    task = get_task("ruler")()
    names = ["ABCDE", "FGHIJ", "KLMNO", "PQRST", "UVWXY"]
    # three of five found, one of them in lower case: RULER counts each reference found, case-insensitive
    said = "They are: ABCDE fghij, then VAR KLMNO"
    assert task.scores(said, "ABCDE FGHIJ KLMNO PQRST UVWXY", "vt", names) == {
        "ruler_score": 0.6, "ruler_pass": 0.0, "baseline_ruler_score": 1.0, "baseline_ruler_pass": 1.0}
    ruler = sum(r.lower() in said.lower() for r in names) / len(names)  # RULER's string_match_all, one row
    assert task.metric("ruler_score")(said, names, "vt") == ruler
    assert task.metric("ruler_score")("1234567 and 7654321", ["7654321", "1234567", "1111111"], "niah_multivalue") \
        == pytest.approx(2 / 3)  # 2 / 3 in float64 either way: approx's default rel 1e-6 is far above a rounding
    assert task.metric("ruler_score")("the answer: 7654321", ["7654321", "1"], "qa_1") == 1.0  # qa: any one


def test_chat_template_prompt(lm):
    tok = lm.tokenizer
    tok.chat_template = ("{% for m in messages %}<user>{{ m['content'] }}</user>{% endfor %}"
                         "{% if add_generation_prompt %}<bot>{% endif %}")
    try:
        task, _, b, text = _build(lm, "niah_single_1")
    finally:
        tok.chat_template = None
    assert text.startswith("<user>A special magic number is hidden")
    key = re.search(r"for (\S+) is: ", text).group(1)
    assert text.endswith(f"\nWhat is the special magic number for {key} mentioned in the provided text?</user>"
                         f"<bot>The special magic number for {key} mentioned in the provided text is")
    assert lm.decode(b["ids"][:b["prefill"]]).endswith(NOISE)  # the context ends where the question starts
    assert CONTEXTS["niah_single_1"] - SLACK["noise"] < len(b["ids"]) + 128 <= CONTEXTS["niah_single_1"]


def test_rows_score_against_the_baseline(lm, tmp_path):
    for prefill in ("all", "context"):
        task, p, b, text = _build(lm, "niah_single_1", prefill=prefill, max_new_tokens=4)
        base = task.baseline(lm, p, seed=0)
        row = task.evaluate(lm, p, CacheConfig(residual=8), 0, base, tmp_path)
        assert row["kl"] == 0.0 and row["output_match"] == 1.0 and row["top1_agree"] == 1.0
        assert row["ruler_score"] == row["baseline_ruler_score"] and row["ruler_pass"] in (0.0, 1.0)
        assert row["tokens"] == len(b["ids"]) and len(base["tokens"]) <= 4
    assert lm.decode(b["ids"][b["prefill"]:]).startswith("\nWhat is the special magic number for")


def test_too_short_a_context_is_refused(lm):
    task = get_task("ruler")(tasks=("niah_multikey_1",), contexts=(600,), repeats=1)
    with pytest.raises(ValueError, match="niah_multikey_1 does not fit a context of 600 tokens: without a haystack"):
        task.build(lm, task.prompts()[0], 0)
    with pytest.raises(ValueError, match="fwe at context 200 has a vocabulary of 3 coded words"):
        task = get_task("ruler")(tasks=("fwe",), contexts=(200,), repeats=1)
        task.build(lm, task.prompts()[0], 0)


def test_run_writes_rows_with_the_metrics(lm, tmp_path):
    opts = {"tasks": ["niah_single_1", "niah_single_2", "fwe"], "contexts": [1000], "repeats": 1,
            "max_new_tokens": 3}
    config = text_run_config(tmp_path, tasks=("ruler",), codecs=("kivi",), limit=None, task_options={"ruler": opts})
    out = run(config, out=tmp_path / "run", model=lm, progress=False, log=lambda *_: None)
    rows = read_rows(out / "rows.jsonl")
    assert {r["label"] for r in rows} == {"none", "kivi@2"} and len(rows) == 3 * 2
    assert {r["prompt_meta"]["ruler_task"] for r in rows} == set(opts["tasks"])
    for r in rows:
        assert {"ruler_score", "ruler_pass", "baseline_ruler_score", "output_match", "kl", "top1_agree"} <= set(r)
        assert 0 <= r["ruler_score"] <= 1 and r["ruler_pass"] in (0, 1) and r["tokens"] <= 1000 - 50
    assert all(r["kl"] == 0 and r["ruler_score"] == r["baseline_ruler_score"] for r in rows if r["label"] == "none")
    assert any(r["kl"] > 0 for r in rows if r["label"] == "kivi@2")
    summary = json.loads((out / "summary.json").read_text())["tasks"]["ruler"]
    assert summary["headline"] == "kl"
    assert [m["name"] for m in summary["metrics"]] == ["ruler_score", "ruler_pass", "output_match", "length_ratio", "kl",
                                                       "top1_agree"]
    # RULER's per-task table and its average over the tasks at each length
    bd = summary["breakdown"]
    assert bd["metric"] == "ruler_score" and bd["keys"] == ["ruler_task", "context"]
    assert len(bd["columns"]) == len(opts["tasks"]) and len(bd["averages"]) == 1
    kivi = next(c for c in bd["configs"] if c["label"] == "kivi@2")
    scores = [r["ruler_score"] for r in rows if r["label"] == "kivi@2"]
    # the mean of a few scores in [0, 1] from rows as stored, then written to 7 significant digits (summary.json)
    assert kivi["average"][bd["averages"][0]]["mean"] == pytest.approx(
        sum(scores) / len(scores), rel=digits_rel(7) + sum_rel(len(scores) + 1, U64))
    assert "### ruler_score by ruler_task and context" in (out / "report.md").read_text()
    # the essay haystack is the --prompts text
    task = get_task("ruler")(**opts)
    essay = task.build(lm, task.prompts(config.prompts)[1], 0)
    assert "The quick brown fox jumps over the lazy dog." in lm.decode(essay["ids"])


def test_scatter_keeps_items_at_one_index_in_their_order():
    """vt's chain is inserted at sorted depths: two links at the same line must not swap (VAR B = VAR A after
    VAR A = 12345)."""
    from harness.tasks.ruler_synthetic import scatter

    lines = [f"n{i}" for i in range(4)]
    # the depths are sorted and the items go to them in their order
    assert scatter(lines, [0.5, 0.5, 0.0], ["a", "b", "c"]) == ["a", "n0", "n1", "b", "c", "n2", "n3"]
    assert scatter(lines, [0.5, 0.5], ["first", "second"]) == ["n0", "n1", "first", "second", "n2", "n3"]
