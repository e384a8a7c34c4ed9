"""harness/tasks/kvpress.py: kvpress-layout files (RULER and LongBench rows in parquet and jsonl)
read, prompted and rolled out as kvpress does (context prefilled and compressed, then the question
through the cache), on the tiny model; bad input refused in one line."""
from __future__ import annotations

import copy
import json
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from helpers.hostile import save_hostile
from helpers.tiny_lm import tiny_causal_lm
from helpers.tolerances import U32, coarse_kl_abs, logsoftmax_abs

from adapters.hf.causal_lm import CausalLM
from adapters.cache.config import CacheConfig
from harness.tasks import get_task
from kernels import list_codecs

CODEC = next(c for c in ("turboquant-mse", "octopus", "quarot") if c in list_codecs())
HAY = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
RULER_ROWS = [
    {"context": "Some special magic numbers are hidden within the following text.\n" + HAY * 2
                + "One of the special magic numbers for calm-otter is: 4417203.\n" + HAY,
     "question": "What is the special magic number for calm-otter mentioned in the provided text?",
     "answer_prefix": "The special magic number for calm-otter mentioned in the provided text is",
     "answer": ["4417203"], "task": "niah_multikey_1", "max_new_tokens": 6},
    {"context": "Answer the question based on the given documents.\n\nDocument 1:\nParis is in France.\n" + HAY * 4,
     "question": "Question: Where is Paris?", "answer_prefix": "Answer:", "answer": ["France", "FR"],
     "task": "qa_1", "max_new_tokens": 5},
]
LONGBENCH_ROWS = [
    {"context": "Answer the question based on the given passages.\n\nPassage 1:\nThe Rhine flows north.\n" + HAY * 4,
     "question": "Question: Which way does the Rhine flow?\n", "answer_prefix": "Answer:", "answers": ["north"],
     "all_classes": None, "length": 40, "task": "hotpotqa", "max_new_tokens": 4},
    {"context": "Here are 2 paragraphs.\n\nParagraph 1: cats.\n\nParagraph 2: dogs.\n" + HAY * 3,
     "question": "Dogs bark.\n\nPlease enter the number of the paragraph.\n\n", "answer_prefix": "The answer is: ",
     "answers": ["Paragraph 2"], "all_classes": None, "length": 30, "task": "passage_retrieval_en",
     "max_new_tokens": 4},
]


def _parquet(path, rows):
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def lm():
    return tiny_causal_lm("qwen2")


@pytest.fixture()
def data(tmp_path):
    """A folder as kvpress's datasets come: RULER rows in parquet, LongBench rows in jsonl."""
    _parquet(tmp_path / "ruler.parquet", RULER_ROWS)
    (tmp_path / "sub").mkdir()
    _jsonl(tmp_path / "sub" / "longbench.jsonl", LONGBENCH_ROWS)
    return tmp_path


def test_rows_are_read_from_parquet_jsonl_and_folders(data):
    task = get_task("kvpress")()
    prompts = task.prompts(str(data))
    assert len(prompts) == 4  # ruler.parquet, then sub/longbench.jsonl (path order)
    ids = [p.id for p in prompts]
    assert [re.sub(r"-[0-9a-f]{8}$", "", i) for i in ids] == [
        "niah_multikey_1-00000", "qa_1-00001", "hotpotqa-00002", "passage_retrieval_en-00003"]
    assert [p.meta["file"] for p in prompts] == ["ruler.parquet"] * 2 + ["sub/longbench.jsonl"] * 2
    first = prompts[0].data
    assert first["answers"] == ["4417203"] and first["max_new_tokens"] == 6 and first["scorer"] == "string_match_all"
    assert [p.data["scorer"] for p in prompts[1:]] == ["string_match_part", "qa_f1", "retrieval"]
    assert prompts[2].data["answers"] == ["north"]  # LongBench's 'answers' column
    # ids are stable (the row's content and index) and follow the content
    assert [p.id for p in get_task("kvpress")().prompts(str(data))] == ids
    assert [p.id for p in task.prompts(str(data / "ruler.parquet"), limit=1)] == ids[:1]
    edited = [dict(RULER_ROWS[0], question="What else?")]
    other = task.prompts(str(_parquet(data / "edited.parquet", edited)))[0].id
    assert other.startswith("niah_multikey_1-00000-") and other != ids[0]
    one = get_task("kvpress")().prompts(str(_jsonl(data / "one.jsonl", [{"answer": "x", **RULER_ROWS[1]}])))
    assert one[0].data["answers"] == ["France", "FR"]
    as_json = data / "rows.json"
    as_json.write_text(json.dumps(RULER_ROWS))
    assert [p.id for p in task.prompts(str(as_json))] == ids[:2]


def test_prompt_is_built_as_kvpress_builds_it(lm, tmp_path):
    row = RULER_ROWS[1]
    task = get_task("kvpress")()
    b = task.build(lm, _prompt(task, row, tmp_path))
    # no chat template: BOS (none here) + context, then question + "\n" + answer prefix, tokenized apart
    assert b["ids"] == lm.encode(row["context"]) + lm.encode(row["question"] + "\n" + row["answer_prefix"])
    assert b["prefill"] == len(lm.encode(row["context"])) and b["cut"] == 0 and b["max_new_tokens"] == 5
    # a chat template: the user turn holding the context, cut where the context ends; the rest follows the question
    tok = copy.deepcopy(lm.tokenizer)
    tok.chat_template = ("{% for m in messages %}<|user|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
                         "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
    chat = CausalLM(lm.model, tok, "tiny-chat", "(in memory)")
    task = get_task("kvpress")(max_context=40, max_new_tokens=3)
    b = task.build(chat, _prompt(task, row, tmp_path))
    context = chat.encode("<|user|>\n" + row["context"])
    assert b["ids"] == context[:40] + chat.encode(row["question"] + "<|end|>\n<|assistant|>\n" + row["answer_prefix"])
    assert b["prefill"] == 40 and b["cut"] == len(context) - 40 and b["max_new_tokens"] == 3


def _prompt(task, row, folder):
    """The prompt of a one-row jsonl file holding ``row``."""
    return task.prompts(str(_jsonl(folder / "one_row.jsonl", [row])))[0]


def _kl_topk(native: torch.Tensor, comp: torch.Tensor, k: int) -> tuple[float, float]:
    """Mean KL(native || comp) on {native's top-k tokens, the rest}, float64 from the definition, and the bound on
    what the task's float32 log-softmaxes of the same logits may move it by (tests/helpers/tolerances.py; the task also
    rounds each position's KL to float32)."""
    p, q = torch.softmax(native.double(), -1), torch.softmax(comp.double(), -1)
    top = p.topk(k, -1).indices
    pb = torch.cat([p.gather(-1, top), 1 - p.gather(-1, top).sum(-1, keepdim=True)], -1)
    qb = torch.cat([q.gather(-1, top), 1 - q.gather(-1, top).sum(-1, keepdim=True)], -1)
    kl = torch.where(pb > 0, pb * (pb.log() - qb.log()), torch.zeros_like(pb)).sum(-1)
    spread = float(max((x.amax(-1) - x.amin(-1)).max() for x in (native, comp)))
    return float(kl.mean()), coarse_kl_abs(pb, qb, *logsoftmax_abs(native.shape[-1], spread)) + U32 * float(kl.max())


def test_rows_none_and_compressed(lm, tmp_path):
    row = RULER_ROWS[0]
    # the references: two characters the model does say (so the score is not 0 by default) and one it does not
    task = get_task("kvpress")()
    ids_ctx = lm.encode(row["context"])
    ids = ids_ctx + lm.encode(row["question"] + "\n" + row["answer_prefix"])
    said = lm.decode(lm.greedy(ids, 6, None, prefill=len(ids_ctx))["tokens"])
    refs = [said[:2], said[-2:], "zz-not-said"]
    prompt = _prompt(task, dict(row, answer=refs), tmp_path)
    base = task.baseline(lm, prompt, seed=0)
    assert base["answer"] == said
    none = task.evaluate(lm, prompt, CacheConfig(residual=8), 0, base, tmp_path)
    assert none["kl"] == 0.0 and none["top1_agree"] == 1.0 and none["output_match"] == 1.0
    assert none["kvpress_score"] == none["baseline_kvpress_score"] == pytest.approx(2 / 3)  # float64 2/3: default rel
    assert none["scorer"] == "string_match_all" and none["tokens"] == len(ids) and none["context_tokens"] == len(ids_ctx)

    cfg = CacheConfig(codec=CODEC, bits=2, residual=8)
    got = task.evaluate(lm, prompt, cfg, 0, base, tmp_path)
    assert got["cache_bytes"] < got["uncompressed_bytes"]
    # reference: the baseline's answer teacher-forced after the prompt, uncompressed as one plain forward; compressed
    # through the same steps as kvpress (the context prefilled, the question as one chunk, then the answer)
    answer = base["tokens"]
    n_q = len(ids) - len(ids_ctx)
    with torch.no_grad():
        native = lm.model(torch.tensor([ids + answer[:-1]])).logits[0, len(ids) - 1:]
    chunks = []
    lm.teacher_force(ids + answer[:-1], [len(ids_ctx), n_q, len(answer) - 1], cfg, lambda s, lg: chunks.append(lg))
    comp = torch.cat([chunks[1][-1:], chunks[2]])
    want, tol = _kl_topk(native, comp, task.opts.topk)
    assert want > 5 * tol  # the codec moved the distributions far beyond rounding
    # the logits: one forward of prompt + answer against the cache's chunks, float32 rounding apart (no clean bound)
    assert abs(got["kl"] - want) <= tol
    assert got["top1_agree"] == float((native.argmax(-1) == comp.argmax(-1)).double().mean())
    expect = sum(r.lower() in re.sub(r"[\x00-\x1f]", "", got["answer"]).lower() for r in refs) / 3
    assert got["kvpress_score"] == pytest.approx(expect)  # a float64 mean of three 0/1: default rel
    r = lm.greedy(ids, 6, cfg, force=answer, prefill=len(ids_ctx))
    # the same forwards through the same cache by two routes (greedy's steps, teacher forcing's chunks): float32
    # rounding of logits ~1 with no clean bound (measured one unit in the last place, 1.2e-7); atol 1e-5 allows ~80
    assert torch.allclose(r["forced_logits"], comp, rtol=0, atol=1e-5)
    # every token but the last generated one went through the cache; all but the 8-token window are committed
    assert got["committed_tokens"] == len(ids) + len(r["tokens"]) - 1 - 8
    # the question really read the compressed context: prefilling it with the context gives other logits
    whole = lm.greedy(ids, 6, cfg, force=answer)["forced_logits"]
    assert not torch.allclose(whole, comp, rtol=0, atol=1e-3)  # the codec's effect (5e-2 measured), not rounding


def test_too_long_rows_are_refused_or_cut(lm, tmp_path):
    row = dict(RULER_ROWS[0], context="word " * 900)  # 4,500 byte tokens: more than the tiny model's 4,096
    task = get_task("kvpress")()
    prompts = task.prompts(str(_jsonl(tmp_path / "long.jsonl", [row])))
    with pytest.raises(ValueError, match=r"exceed the model's 4096 positions; cut contexts with "
                                         r"--task-opt kvpress.max_context=N"):
        task.batches(lm, prompts)
    task = get_task("kvpress")(max_context=3000)
    prompts = task.prompts(str(tmp_path / "long.jsonl"))
    assert task.batches(lm, prompts) == [[prompts[0]]]
    assert task.build(lm, prompts[0])["cut"] == 4500 - 3000


@pytest.mark.parametrize("make, message", [
    (lambda d: d / "nope.parquet", "no such file or folder"),
    (lambda d: d, "a folder without .parquet, .jsonl, .json files"),
    (lambda d: _write(d / "rows.txt", "hello"), "a '.txt' file; the kvpress task reads"),
    (lambda d: _write(d / "rows.jsonl", "{not json"), "rows.jsonl:1:2: is not valid JSON"),
    (lambda d: _write(d / "rows.jsonl", ""), "no rows in it"),
    (lambda d: _jsonl(d / "r.jsonl", [{k: v for k, v in RULER_ROWS[0].items() if k != "question"}]),
     "row 0: no column 'question' (it has answer, answer_prefix, context, max_new_tokens, task)"),
    (lambda d: _jsonl(d / "r.jsonl", [{k: v for k, v in RULER_ROWS[0].items() if k != "max_new_tokens"}]),
     "no column 'max_new_tokens'"),
    (lambda d: _jsonl(d / "r.jsonl", [dict(RULER_ROWS[0], answer={"a": 1})]), "'answer' must be a reference string"),
    (lambda d: _jsonl(d / "r.jsonl", [RULER_ROWS[0], dict(RULER_ROWS[1], task="mystery")]),
     "row 1: task 'mystery' is neither a RULER task"),
    (lambda d: _jsonl(d / "r.jsonl", [dict(LONGBENCH_ROWS[1], answers=["the second"])]),
     "a retrieval answer must name its paragraph"),
    (lambda d: _jsonl(d / "r.jsonl", [dict(LONGBENCH_ROWS[0], task="trec")]), "needs the row's 'all_classes'"),
    (lambda d: _jsonl(d / "r.jsonl", [dict(RULER_ROWS[0], max_new_tokens=0)]), "max_new_tokens must be a positive"),
])
def test_bad_input_is_one_line(tmp_path, make, message):
    with pytest.raises((ValueError, OSError)) as e:
        get_task("kvpress")().prompts(str(make(tmp_path)))
    assert message in str(e.value) and "\n" not in str(e.value)


def _write(path, text):
    path.write_text(text)
    return path


def test_a_pickle_named_parquet_is_refused_unread(tmp_path):
    marker = tmp_path / "pwned"
    bad = save_hostile({"context": ["x"]}, tmp_path / "rows.parquet", marker)
    with pytest.raises(ValueError, match="cannot read it as parquet"):
        get_task("kvpress")().prompts(str(bad))
    assert not marker.exists()


def test_missing_max_new_tokens_column_is_fine_with_the_option(tmp_path):
    rows = [{k: v for k, v in RULER_ROWS[0].items() if k != "max_new_tokens"}]
    task = get_task("kvpress")(max_new_tokens=7)
    assert task.prompts(str(_jsonl(tmp_path / "r.jsonl", rows)))[0].data["answers"] == ["4417203"]


def test_a_run_of_a_kvpress_file(lm, tmp_path):
    from harness.run.config import RunConfig
    from harness.runner import run

    data = _parquet(tmp_path / "ruler_4096.parquet", [dict(LONGBENCH_ROWS[0], answer=["north"])] + RULER_ROWS)
    config = RunConfig(model="hf", model_path="(tiny)", tasks=["kvpress"], codecs=[CODEC], bits=[2],
                       prompts=str(data), limit=2, residual=8, codec_seeds=[0])
    out = run(config, out=tmp_path / "run", model=lm, progress=False, log=lambda *_: None)
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and {r["label"] for r in rows} == {"none", f"{CODEC}@2"}
    assert all(r["kl"] == 0.0 for r in rows if r["label"] == "none")
    assert [r["prompt_meta"]["task"] for r in rows if r["label"] == "none"] == ["hotpotqa", "niah_multikey_1"]
    summary = json.loads((out / "summary.json").read_text())["tasks"]["kvpress"]
    assert summary["headline"] == "kl"
    assert [m["name"] for m in summary["metrics"]] == ["kvpress_score", "output_match", "length_ratio", "kl", "top1_agree"]


def test_cli_refuses_a_bad_file_before_the_model_loads(tmp_path, capsys):
    from harness.cli.main import main

    # the model path does not exist either, yet the error is the file's: the file is read first
    bad = ["run", "--model", "hf", "--model-path", str(tmp_path / "no-model"), "--codec", CODEC, "--bits", "2",
           "--task", "kvpress", "--prompts", str(tmp_path / "missing.parquet"), "--quiet", "--out", str(tmp_path / "x")]
    assert main(bad) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "missing.parquet: no such file or folder" in err[0]
    assert not (tmp_path / "x").exists()
