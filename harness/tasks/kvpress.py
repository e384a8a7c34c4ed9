"""``kvpress``: long-context datasets in kvpress's layout (RULER, LongBench), read from local files.

``--prompts PATH``: a ``.parquet``, ``.jsonl`` or ``.json`` file (a list of row objects), or a
folder holding such files (read recursively, in path order), one row per question with kvpress's
columns: ``context``, ``question``, ``answer_prefix`` (absent: ''), ``answer`` (the reference
strings, or one string; LongBench's ``answers`` is read too), ``max_new_tokens``, and where the
scorer needs them ``task`` and ``all_classes``. These are the files kvpress's
``evaluation/benchmarks/*/create_huggingface_dataset.py`` publish (simonjegou/ruler,
Xnhyacinth/LongBench on the Hub). Every row is checked before the model loads; the prompt id
is ``<task>-<row index>-<hash of the row>``.

The prompt is kvpress's: with a chat template, the user turn holding the context is rendered with
the generation prompt and cut where the context ends, giving the context text (the template's
prefix + context) and the suffix that follows the question (end of turn, assistant header);
without one, the tokenizer's BOS + context, and '\\n' as the suffix. The context and
``question + suffix + answer_prefix`` are tokenized apart. ``max_context`` keeps the first N
context tokens, as kvpress's ``max_context_length``; without it a row that does not fit the
model's positions (with its answer) is refused before any rollout.

The rollout is kvpress's too: the context is prefilled and committed to the cache, so the codec
compresses it before the question arrives; the question chunk then attends to the compressed
context (and the native window) and itself, and the answer is decoded greedily through the cache,
up to ``max_new_tokens`` tokens or EOS. Scores: ``kvpress_score`` (the row's scorer as kvpress
picks it from the ``task`` column, 0..1; kvpress's table is a task's mean x 100) for the answer
and for the baseline's, and against the baseline (:mod:`harness.tasks.generation`) whether the
answers are equal and, along the baseline's answer teacher-forced on a fork of the cache taken
after the question, the KL and top-1 agreement.

Headline: ``kl``. A kvpress score moves in steps (RULER rows are 0/1 or quarters) and reads the
codec's effect through the model's ability on the task: a small model fails most long-context
rows with or without compression, leaving nothing to rank. The KL is graded, is 0 exactly for a
codec that changes nothing, and grows with what the codec changes.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from adapters.hf.models import max_positions
from registry.options import Allowed, option
from metrics.kvpress_scores import SCORERS, kvpress_score, paragraph_id, scorer_for

from harness.run.input_files import InputError, parse_json, read_jsonl, read_text
from harness.tasks.base import Prompt, Task, register_task
from harness.tasks.generation import baseline_answers, graded_answers
from harness.tasks.text_corpus import text_hash

SUFFIXES = (".parquet", ".jsonl", ".json")
LAYOUT = ("kvpress's layout: context, question, answer_prefix, answer (the reference strings) and max_new_tokens, "
          "plus task for its scorer")


def _files(source: str | None) -> list[Path]:
    if not source or source == "default":
        raise ValueError(f"task kvpress reads a dataset file: pass --prompts PATH (a {', '.join(SUFFIXES)} file or a "
                         f"folder of them in {LAYOUT})")
    path = Path(source).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"--prompts {source}: no such file or folder; pass a {', '.join(SUFFIXES)} file or a "
                                f"folder of them")
    if path.is_dir():
        files = sorted(f for f in path.rglob("*") if f.suffix in SUFFIXES and f.is_file())
        if not files:
            raise ValueError(f"--prompts {source}: a folder without {', '.join(SUFFIXES)} files; pass one that holds "
                             f"kvpress dataset files")
        return files
    if path.suffix not in SUFFIXES:
        raise ValueError(f"--prompts {source}: a '{path.suffix}' file; the kvpress task reads "
                         f"{', '.join(SUFFIXES)} files (or a folder of them)")
    return [path]


def _read(path: Path) -> list[dict]:
    """The rows of one file, as dicts (data only: parquet through pyarrow, JSON through json)."""
    try:
        if path.suffix == ".parquet":
            try:
                import pyarrow.parquet as pq
                from pyarrow import ArrowException
            except ImportError as e:
                raise ImportError(f"--prompts {path}: reading parquet needs pyarrow (pip install pyarrow)") from e
            try:
                return pq.read_table(path).to_pylist()
            except ArrowException as e:
                raise ValueError(str(e)) from None
        if path.suffix == ".jsonl":
            return [row for _, row in read_jsonl(path, "kvpress rows (.jsonl)", expect=object)]
        data = parse_json(read_text(path, "kvpress rows"), str(path))
        if isinstance(data, dict) and data and all(isinstance(v, list) for v in data.values()):
            n = {len(v) for v in data.values()}
            if len(n) == 1:  # columns -> rows
                return [dict(zip(data, vals)) for vals in zip(*data.values())]
        if not isinstance(data, list):
            raise ValueError("expected a list of row objects")
        return data
    except InputError:  # names the file and line already
        raise
    except (OSError, UnicodeDecodeError, ValueError) as e:
        why = " ".join(str(e).split())[:200]
        raise ValueError(f"--prompts {path}: cannot read it as {path.suffix[1:]} ({type(e).__name__}: {why}); pass a "
                         f"file in {LAYOUT}") from None


def _references(value, where: str) -> list[str]:
    refs = [value] if isinstance(value, str) else value
    if not isinstance(refs, (list, tuple)) or not refs or not all(isinstance(r, (str, int, float)) for r in refs):
        raise ValueError(f"{where}: 'answer' must be a reference string or a non-empty list of them, got "
                         f"{type(value).__name__}; pass a file in {LAYOUT}")
    return [str(r) for r in refs]


def _row(raw, where: str, need_max_new: bool, scorer: str) -> dict:
    """One validated row: {context, question, answer_prefix, answers, max_new_tokens, task, all_classes}."""
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: a {type(raw).__name__}, not a row object; pass a file in {LAYOUT}")
    answer_col = "answer" if "answer" in raw else "answers"
    need = ["context", "question", answer_col] + (["max_new_tokens"] if need_max_new else [])
    missing = [c for c in need if c not in raw]
    if missing:
        fix = " (or pass --task-opt kvpress.max_new_tokens=N)" if missing == ["max_new_tokens"] else ""
        has = ", ".join(sorted(map(str, raw))) or "none"
        raise ValueError(f"{where}: no column {', '.join(map(repr, missing))} (it has {has}); {LAYOUT}{fix}")
    row = {"answers": _references(raw[answer_col], where), "max_new_tokens": raw.get("max_new_tokens")}
    for col in ("context", "question", "answer_prefix", "task"):
        value = raw.get(col)
        if value is None and col in ("answer_prefix", "task"):  # optional: kvpress reads a missing prefix as ''
            value = ""
        if not isinstance(value, str):
            raise ValueError(f"{where}: '{col}' must be a string, got {type(value).__name__}; pass a file in {LAYOUT}")
        row[col] = value
    if not row["context"]:
        raise ValueError(f"{where}: an empty context; kvpress compresses the context, so every row needs one")
    n = row["max_new_tokens"]
    if need_max_new and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise ValueError(f"{where}: max_new_tokens must be a positive integer, got {n!r}")
    classes = raw.get("all_classes")
    row["all_classes"] = [str(c) for c in classes] if isinstance(classes, (list, tuple)) else []
    try:
        name = scorer_for(row["task"]) if scorer == "auto" else scorer
    except ValueError as e:
        raise ValueError(f"{where}: {e} with --task-opt kvpress.scorer=NAME") from None
    if name == "classification" and not row["all_classes"]:
        raise ValueError(f"{where}: task '{row['task']}' is scored by classification, which needs the row's "
                         f"'all_classes' (the class names); pass a file that has them")
    if name == "retrieval" and any(paragraph_id(a) is None for a in row["answers"]):
        raise ValueError(f"{where}: a retrieval answer must name its paragraph ('Paragraph 3'), got "
                         f"{row['answers'][0][:40]!r}")
    row["scorer"] = name
    return row


@register_task("kvpress")
class KvpressTask(Task):
    modality = "text"
    metrics = ("kvpress_score", "output_match", "length_ratio", "kl", "top1_agree")
    score_metric = "kvpress_score"
    headline = "kl"  # graded; kvpress scores move in steps and mostly measure the model (module docstring)
    forks_cache = True  # the baseline's answer teacher-forced on a fork (harness.tasks.generation)

    @dataclass(frozen=True)
    class Options:
        max_new_tokens: int = option(
            0, "tokens generated per answer; 0: each row's max_new_tokens, as kvpress does", Allowed(lo=0))
        max_context: int = option(
            0, "keep each context's first N tokens (chat-template prefix included), as kvpress's "
            "max_context_length; 0: keep all, and refuse a row the model cannot hold", Allowed(lo=0, positions=True))
        scorer: str = option(
            "auto", f"auto: each row's kvpress scorer by its task (RULER, LongBench); or one for every row: "
            f"{', '.join(SCORERS)}", Allowed(choices=("auto", *SCORERS)))
        topk: int = option(256, "baseline tokens kept per position for the KL (plus one tail bucket)", Allowed(lo=1))

    def __init__(self, **options):
        super().__init__(**options)
        self._built: tuple[str, dict] | None = None  # the last prompt's tokens (baseline, then every codec)

    def prompts(self, source: str | None = None, limit: int | None = None) -> list[Prompt]:
        scorer = self.opts.scorer
        if scorer != "auto" and scorer not in SCORERS:
            raise ValueError(f"kvpress: unknown scorer '{scorer}'. Available: auto, {', '.join(SCORERS)}")
        root = Path(source).expanduser() if source else None
        out: list[Prompt] = []
        for path in _files(source):
            rel = path.relative_to(root).as_posix() if root is not None and root.is_dir() else path.name
            for i, raw in enumerate(_read(path)):
                if limit and len(out) >= limit:
                    return out
                row = _row(raw, f"--prompts {path} row {i}", self.opts.max_new_tokens == 0, scorer)
                content = json.dumps([row[k] for k in ("context", "question", "answer_prefix", "answers", "task")])
                tag = re.sub(r"[^A-Za-z0-9_.-]", "_", row["task"])[:40] or "row"
                out.append(Prompt(f"{tag}-{len(out):05d}-{text_hash(content)[:8]}", row,
                                  {"file": rel, "row": i, "task": row["task"]}))
        if not out:
            raise ValueError(f"--prompts {source}: no rows in it; pass a file in {LAYOUT}")
        return out

    # --- building a prompt -------------------------------------------------------------------
    def build(self, model, prompt: Prompt) -> dict:
        """{'ids': context + question token ids, 'prefill': context tokens, 'cut': context tokens
        dropped by max_context, 'max_new_tokens'}; the last prompt's is kept."""
        if self._built is not None and self._built[0] == prompt.id:
            return self._built[1]
        d, tok = prompt.data, model.tokenizer
        if getattr(tok, "chat_template", None):
            # a run of '#' longer than the context cannot occur in it: it marks where the context ends
            marker = "#" * (len(d["context"]) + 10)
            text = tok.apply_chat_template([{"role": "user", "content": d["context"] + marker}], tokenize=False,
                                           add_generation_prompt=True, enable_thinking=False)
            context, found, suffix = text.partition(marker)
            if not found:
                raise ValueError(f"prompt '{prompt.id}': the model's chat template rewrites the user's text, so the "
                                 f"context cannot be cut from the question as kvpress does")
        else:
            context, suffix = (tok.bos_token or "") + d["context"], "\n"
        context_ids = model.encode(context)
        question_ids = model.encode(d["question"] + suffix + d["answer_prefix"])
        keep = self.opts.max_context or len(context_ids)
        built = {"ids": context_ids[:keep] + question_ids, "prefill": min(keep, len(context_ids)),
                 "cut": max(0, len(context_ids) - keep),
                 "max_new_tokens": self.opts.max_new_tokens or d["max_new_tokens"]}
        if built["prefill"] < 1:
            raise ValueError(f"prompt '{prompt.id}': its context is no token at all; every row needs a context")
        self._built = (prompt.id, built)
        return built

    def batches(self, model, prompts: list[Prompt]) -> list[list[Prompt]]:
        """One by one, after checking that every prompt fits the model (before any rollout)."""
        limit = max_positions(model)
        for p in prompts:
            b = self.build(model, p)
            need = len(b["ids"]) + b["max_new_tokens"]
            if limit and need > limit:
                raise ValueError(f"prompt '{p.id}' ({p.meta['file']} row {p.meta['row']}): {len(b['ids'])} prompt "
                                 f"tokens + {b['max_new_tokens']} answer tokens exceed the model's {limit} positions; "
                                 f"cut contexts with --task-opt kvpress.max_context=N (kvpress's max_context_length) "
                                 f"or use a model with a longer context")
        return [[p] for p in prompts]

    def _score(self, prompt: Prompt, answer: str) -> float:
        d = prompt.data
        return kvpress_score(answer, d["answers"], d["task"], d["all_classes"], d["scorer"])

    # --- the contract ------------------------------------------------------------------------
    def baseline(self, model, prompt: Prompt, seed: int) -> dict:
        b = self.build(model, prompt)
        return baseline_answers(model, [b["ids"]], b["max_new_tokens"], self.opts.topk, prefill=[b["prefill"]])[0]

    def evaluate(self, model, prompt: Prompt, cache_config, seed: int, baseline: dict, out_dir: Path) -> dict:
        b = self.build(model, prompt)
        (answer, graded), = graded_answers(self, model, [prompt.id], [b["ids"]], cache_config, [baseline],
                                           b["max_new_tokens"], prefill=[b["prefill"]])
        return {"kvpress_score": self._score(prompt, answer),
                "baseline_kvpress_score": self._score(prompt, baseline["answer"]), **graded,
                "answer": answer.strip(), "scorer": prompt.data["scorer"], "tokens": len(b["ids"]),
                "context_tokens": b["prefill"], "context_cut": b["cut"]}
