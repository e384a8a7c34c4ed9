"""harness/tasks/turns.py: a context with a needle per key, prefilled once; then one question per turn
through the same cache, each answer kept in it. Checked: every needle is in the context and each turn
asks another key; the cache holds the whole conversation after each turn; the baseline's answers are a
plain transformers greedy loop's over the growing conversation; a run writes one row per turn, each
scored; reruns are byte-identical, and a run cut after a turn gives that turn's rows unchanged."""
from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest
import torch
from helpers.tiny_lm import EOS, text_run_config, tiny_causal_lm

from adapters.cache.config import CacheConfig
from harness.run.config import RunError
from harness.run.rows import read_rows
from harness.tasks import task_options
from harness.runner import run
from harness.tasks import get_task
from harness.tasks.turns import follow_up

NEEDLE = re.compile(r"One of the special magic numbers for ([a-z]+-[a-z]+) is: (\d{7})\.")
QUESTION = re.compile(r"What is the special magic number for ([a-z]+-[a-z]+) mentioned in the provided text\? "
                      r"The special magic number for \1 mentioned in the provided text is$")
CONTEXT = 1500  # bytes: four needles, four questions and their answers, and some essay on the byte tokenizer
OPTS = {"contexts": [CONTEXT], "turns": 4, "repeats": 2, "max_new_tokens": 6}
CHAT = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}" + EOS + "{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}")


def lively(seed: int = 0):
    """The tiny model with its weights x10: at init its tied embeddings echo the last token whatever the
    context, so answers would say nothing of the cache; scaled, they depend on what it holds."""
    lm = tiny_causal_lm("qwen2", seed=seed)
    with torch.no_grad():
        for name, p in lm.model.named_parameters():
            if "norm" not in name:
                p.mul_(10)
    return lm


@pytest.fixture(scope="module")
def lm():
    return lively()


def _task(**opts):
    return get_task("turns")(**{**OPTS, **opts})


def test_prompts_are_turns_and_a_conversation_is_one_batch(lm):
    task = _task()
    task.batch_size = 3  # a conversation's turns share one rollout, whatever the batch size
    prompts = task.prompts()
    assert [p.id for p in prompts[:5]] == ["turns-c1500-r0-t1", "turns-c1500-r0-t2", "turns-c1500-r0-t3",
                                           "turns-c1500-r0-t4", "turns-c1500-r1-t1"]
    assert [p.meta["turn"] for p in prompts] == [1, 2, 3, 4] * 2 and all(p.meta["turns"] == 4 for p in prompts)
    assert [[p.id for p in b] for b in task.batches(lm, prompts)] == [[p.id for p in prompts[:4]],
                                                                     [p.id for p in prompts[4:]]]
    cut = task.prompts(limit=6)  # --limit counts turns: the second conversation's first two
    assert [len(b) for b in task.batches(lm, cut)] == [4, 2]
    cls = get_task("turns")
    assert task_options(cls, {"turns": "3"}) == {"contexts": [4096], "turns": 3, "repeats": 2, "max_new_tokens": 16}
    with pytest.raises(RunError, match="turns.turns=41: 41 is out of range"):  # RULER's 40 depths
        task_options(cls, {"turns": "41"})


def test_context_holds_every_needle_and_each_turn_asks_another_key(lm):
    task = _task()
    prompts = task.prompts()
    b = task.build(lm, prompts[0].data, seed=0)
    context = lm.decode(b["context"])
    needles = dict(NEEDLE.findall(context))
    assert context.startswith("Some special magic numbers are hidden within the following text.")
    assert len(needles) == 4 and sorted(needles) == sorted(b["keys"])
    assert [needles[k] for k in b["keys"]] == b["values"]
    asked = [QUESTION.search(lm.decode(q)).group(1) for q in b["questions"]]
    assert asked == b["keys"] and len(set(asked)) == 4  # turn t asks its own key
    assert lm.decode(b["questions"][1]).startswith("\nWhat is")  # no chat template: RULER's base form
    # the whole conversation fits its context with the largest haystack (an essay word adds < 20 bytes)
    total = len(b["context"]) + sum(map(len, b["questions"])) + 4 * OPTS["max_new_tokens"]
    assert CONTEXT - 20 < total <= CONTEXT and b["haystack"] > 0
    assert _task().build(lm, prompts[0].data, 0) == b  # a fresh task: byte-identical
    assert _task().build(lm, prompts[0].data, 1)["values"] != b["values"]
    assert task.build(lm, prompts[4].data, 0)["values"] != b["values"]  # another conversation, another draw
    with pytest.raises(ValueError, match="4 turns do not fit a conversation of 900 tokens"):
        _task(contexts=[900]).build(lm, _task(contexts=[900]).prompts()[0].data, 0)


def test_cache_holds_the_conversation_after_each_turn(lm):
    b = _task().build(lm, _task().prompts()[0].data, 0)
    held = []
    turns = lm.converse(b["context"], b["questions"], 6, CacheConfig(),
                     on_turn=lambda cache: held.append([layer.seq_lengths[0] for layer in cache.kv.layers]))
    answers = [t["tokens"] for t in turns]
    assert len({tuple(a) for a in answers}) > 1  # the answers differ by turn: they read the cache
    for t in range(4):
        # context, questions and answers so far; the last answer token is generated, fed with the next question
        want = len(b["context"]) + sum(len(q) + len(a) for q, a in zip(b["questions"][:t + 1], answers)) - 1
        assert held[t] == [want] * len(held[t]) and turns[t]["fed"] == want
        assert turns[t]["chunk"] == answers[t - 1][-1:] * (t > 0) + b["questions"][t]


def test_baseline_is_a_plain_greedy_loop_over_the_conversation(lm):
    task = _task()
    prompts = task.prompts()[:4]
    b = task.build(lm, prompts[0].data, 0)
    base = task.baseline_batch(lm, prompts, 0)
    eos = lm.tokenizer.eos_token_id
    seq = list(b["context"])
    for t, question in enumerate(b["questions"]):
        assert question[0] != eos  # no chat template: nothing of a question is dropped after an EOS
        seq += question
        x = torch.tensor([seq])
        out = lm.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=6, do_sample=False,
                                eos_token_id=eos, pad_token_id=eos)[0, len(seq):].tolist()
        assert base[t]["tokens"] == out and base[t]["answer"] == lm.decode(out)
        seq += out


def test_an_answer_ending_in_eos_is_not_closed_twice(lm, monkeypatch):
    context, rest = lm.encode("A context of some length to prefill."), lm.encode(" and a question")
    first = lm.converse(context, [rest], 1, CacheConfig())[0]["tokens"]
    question = first + rest  # the chat template's end of turn, when the answer's last token is an EOS
    plain = lm.converse(context, [rest, question], 1, CacheConfig())
    assert plain[1]["chunk"] == first + first + rest  # not an EOS: the answer's token, then the question's
    monkeypatch.setattr(lm, "eos_ids", lambda: set(first))
    ended = lm.converse(context, [rest, question], 1, CacheConfig())
    assert ended[1]["chunk"] == question and ended[1]["fed"] == plain[1]["fed"] - 1


def test_chat_template_turns(lm, monkeypatch):
    monkeypatch.setattr(lm.tokenizer, "chat_template", CHAT)
    assert follow_up(lm.tokenizer, "Q?", "A:") == f"{EOS}<user>Q?{EOS}<assistant>A:"
    task = _task()
    b = task.build(lm, task.prompts()[0].data, 0)
    context, questions = lm.decode(b["context"]), [lm.decode(q) for q in b["questions"]]
    assert context.startswith("<user>Some special magic numbers are hidden")  # EOS text is skipped by decode
    assert [QUESTION.search(q.replace("<assistant>", " ")).group(1) for q in questions] == b["keys"]
    assert b["questions"][1][0] == lm.tokenizer.eos_token_id and questions[1].startswith("<user>What is")
    monkeypatch.setattr(lm.tokenizer, "chat_template", "{% for m in messages %}{% if m['role'] == 'user' %}"
                                                       "{{ m['content'] }}{% endif %}{% endfor %}")
    with pytest.raises(ValueError, match="drops or rewrites an earlier answer"):
        follow_up(lm.tokenizer, "Q?", "A:")


def test_run_writes_a_scored_row_per_turn_and_reruns_are_byte_identical(tmp_path):
    config = text_run_config(tmp_path, tasks=("turns",), codecs=("kivi",), limit=None, task_options={"turns": OPTS})
    quiet = {"progress": False, "log": lambda *_: None}
    out = run(config, out=tmp_path / "a", model=lively(), **quiet)
    rows = read_rows(out / "rows.jsonl")
    assert len(rows) == 2 * 2 * 4 and {r["label"] for r in rows} == {"none", "kivi@2"}
    task, lm = _task(), tiny_causal_lm("qwen2")  # the tokenizer builds the conversations
    built = {p.id: task.build(lm, p.data, 0) for p in task.prompts(config.prompts)}
    for r in rows:
        turn, b = r["prompt_meta"]["turn"], built[r["prompt"]]
        assert r["prompt"].endswith(f"-t{turn}") and r["key"] == b["keys"][turn - 1]
        assert r["string_match_all"] == float(b["values"][turn - 1] in r["answer"])
        assert r["output_match"] in (0.0, 1.0) and r["length_ratio"] == r["output_tokens"] / r["baseline_output_tokens"]
        assert r["prompt_meta"]["repeat"] == int(r["prompt"].split("-r")[1].split("-")[0])
        assert {"baseline_string_match_all", "answer", "key", "conversation_tokens", "cache_bits_per_coord",
                "bits_per_coord", "committed_tokens"} <= set(r)
        assert r["conversation_tokens"] <= CONTEXT
    assert all(r["output_match"] == 1 and r["string_match_all"] == r["baseline_string_match_all"]
               for r in rows if r["label"] == "none")
    kivi = [r for r in rows if r["label"] == "kivi@2"]
    assert any(r["output_match"] == 0 for r in kivi) and all(r["cache_bits_per_coord"] < 16 for r in kivi)
    for label in ("none", "kivi@2"):  # the cache grows turn by turn
        first = [r for r in rows if r["label"] == label and r["prompt"].startswith("turns-c1500-r0-")]
        assert [r["prompt_meta"]["turn"] for r in first] == [1, 2, 3, 4]
        assert all(a["uncompressed_bytes"] < b["uncompressed_bytes"] for a, b in zip(first, first[1:]))
    summary = json.loads((out / "summary.json").read_text())["tasks"]["turns"]
    assert summary["headline"] == "string_match_all"
    assert [m["name"] for m in summary["metrics"]] == ["string_match_all", "output_match", "length_ratio"]
    # the score per turn (how it degrades as the chat goes on), and over the turns per conversation
    assert summary["breakdown"]["columns"] == [f"{t} @ {CONTEXT}" for t in (1, 2, 3, 4)]
    assert [c["average"][str(CONTEXT)]["n"] for c in summary["breakdown"]["configs"]] == [2, 2]

    again = run(config, out=tmp_path / "b", model=lively(), **quiet)  # a fresh model and folder
    for name in ("rows.jsonl", "summary.json"):
        assert (again / name).read_bytes() == (out / name).read_bytes()
    cut = run(replace(config, limit=6), out=tmp_path / "c", model=lively(), **quiet)
    kept = read_rows(cut / "rows.jsonl")  # the second conversation up to its turn 2: those rows unchanged
    assert len(kept) == 2 * 6 and all(r in rows for r in kept)
