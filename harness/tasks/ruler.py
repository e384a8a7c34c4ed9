"""``ruler``: RULER's synthetic tasks (NVIDIA/RULER, commit c3f5e3b) generated offline from our own
text, at context lengths measured by the model's tokenizer, scored as RULER scores them.

Tasks (``tasks``; RULER's ``scripts/synthetic.yaml`` less its two QA tasks): niah_single_1 (noise
haystack, number values), niah_single_2 (essay haystack: our corpus), niah_single_3 (essay, UUID
values), niah_multikey_1 (essay, 4 keys, one asked), niah_multikey_2 (a haystack of distractor
needles), niah_multikey_3 (distractor needles, UUID keys and values), niah_multivalue (4 values of
one key), niah_multiquery (4 keys asked), vt (variable tracking: a chain of 4 hops in noise, after
one in-context example), cwe (common words extraction: 10 words 30 times among words 3 times; 6 and 1
below 4096 tokens, as RULER), fwe (frequent words extraction: coded words of zeta(2) frequencies, the
top 3 asked). How each is generated: :mod:`harness.tasks.ruler_synthetic`.

A context of ``C`` tokens is RULER's ``max_seq_length``: the prompt (chat template included) plus
the task's ``tokens_to_generate`` (niah 128, vt 30, cwe 120, fwe 50) is at most ``C``, with the
largest haystack that fits. The prompt is the model's chat template with the task's template as the
user turn and RULER's answer prefix opening the answer; without a chat template, RULER's 'base'
form: the template, a space, the answer prefix (after the tokenizer's BOS text, if any). It is
tokenized in two pieces, up to the end of the context and the rest (the question), so that
``prefill='context'`` can prefill and compress the context before the question arrives (kvpress's
order, question-agnostic); the default ``'all'`` prefills the whole prompt natively, then commits
it, as RULER is run and as ``needle`` does. Every token of the answer reads the compressed cache.

Each draw comes from a private generator of (prompt id, seed): prompts are byte-identical for a
seed. Scores: ``ruler_score`` (RULER's metric for the task's family: string_match_all, the share of
the reference strings found in the answer, case-insensitive) and ``ruler_pass`` (all found), for the
codec's answer and the baseline's, and against the baseline (:mod:`harness.tasks.generation`): the
answers' exact equality and the KL and top-1 agreement along the baseline's answer (the headline:
graded where RULER's scores move in steps). The row's ``prompt_meta`` names the RULER task.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import groupby
from pathlib import Path

from kernels import private_generator
from registry.options import Allowed, option

from harness.tasks.base import Prompt, Task, first, register_task
from harness.tasks.generation import baseline_answers, graded_answers
from harness.tasks.ruler_synthetic import RULER_TASKS, TOKENS_TO_GENERATE, Corpus, draft, family, fit
from harness.tasks.text_corpus import text_hash


def render(tokenizer, head: str, tail: str, answer_prefix: str) -> tuple[str, str]:
    """The prompt text in two pieces, (up to the end of the context, the rest): with a chat template,
    the user turn ``head + tail`` with the generation prompt, cut where ``tail`` starts, and
    ``answer_prefix`` opening the assistant's turn; without one, RULER's 'base' form (BOS text,
    the template, a space, the answer prefix)."""
    if not getattr(tokenizer, "chat_template", None):
        return (tokenizer.bos_token or "") + head, f"{tail} {answer_prefix}"
    text = tokenizer.apply_chat_template([{"role": "user", "content": head + tail}], tokenize=False,
                                         add_generation_prompt=True, enable_thinking=False)
    cut = text.rfind(tail)
    if cut < 0 or not text[:cut].endswith(head):
        raise ValueError("ruler: the model's chat template rewrites the user's text, so the prompt cannot be cut "
                         "where the context ends")
    return text[:cut], text[cut:] + answer_prefix


@register_task("ruler")
class RulerTask(Task):
    modality = "text"
    metrics = ("ruler_score", "ruler_pass", "output_match", "length_ratio", "kl", "top1_agree")
    score_metric = "ruler_score"
    breakdown = ("ruler_task", "context")
    headline = "kl"  # graded; a RULER score moves in steps and mostly measures the model
    forks_cache = True  # the baseline's answer teacher-forced on a fork (harness.tasks.generation)

    @dataclass(frozen=True)
    class Options:
        tasks: tuple[str, ...] = option(
            RULER_TASKS, "RULER tasks (comma list; its 13 synthetic ones less qa_1, qa_2)",
            Allowed(choices=RULER_TASKS, nonempty=True))
        contexts: tuple[int, ...] = option(
            (4096,), "sequence lengths in tokens (comma list), RULER's max_seq_length: the prompt with its "
            "chat template plus the task's answer tokens", Allowed(lo=1, nonempty=True, positions=True))
        repeats: int = option(2, "samples per (task, context), each its own draw", Allowed(lo=1))
        max_new_tokens: int = option(
            0, "greedy tokens generated per answer; 0: RULER's tokens_to_generate (niah 128, vt 30, "
            "cwe 120, fwe 50), which every context's length counts either way", Allowed(lo=0))
        topk: int = option(256, "baseline tokens kept per position for the KL (plus one tail bucket)", Allowed(lo=1))
        prefill: str = option(
            "all", "all: the whole prompt prefilled natively, then committed (RULER, needle); context: the "
            "context prefilled and committed, the question through the compressed cache (kvpress)",
            Allowed(choices=("all", "context")))

    def __init__(self, **options):
        super().__init__(**options)
        self._source: str | None = None
        self._corpus: Corpus | None = None
        self._built: dict[tuple[str, int], dict] = {}  # the current batch's prompts (baseline, then every codec)

    def prompts(self, source: str | None = None, limit: int | None = None) -> list[Prompt]:
        self._source = source
        for ctx in self.opts.contexts:  # what needs no tokenizer, checked before the model loads
            for name in self.opts.tasks:
                if name not in RULER_TASKS:
                    raise ValueError(f"ruler: unknown task '{name}'. Available: {', '.join(RULER_TASKS)}")
                answer = TOKENS_TO_GENERATE[family(name)]
                if ctx <= answer:
                    raise ValueError(f"ruler: {name} does not fit a context of {ctx} tokens: its answer alone takes "
                                     f"{answer} (RULER's tokens_to_generate, counted in the context); give "
                                     f"ruler.contexts above {answer}")
        return first((Prompt(f"{name}-c{ctx}-r{rep}", {"task": name, "context": int(ctx), "repeat": rep},
                             {"ruler_task": name, "context": int(ctx), "repeat": rep, "source": source or "default"})
                      for ctx in self.opts.contexts for name in self.opts.tasks for rep in range(self.opts.repeats)),
                     limit)

    # --- building a prompt -----------------------------------------------------------------
    def corpus(self) -> Corpus:
        if self._corpus is None:
            self._corpus = Corpus.load(self._source)
        return self._corpus

    def build(self, model, prompt: Prompt, seed: int) -> dict:
        """{'ids': prompt token ids, 'prefill': tokens up to the end of the context, 'answers': the
        reference strings, 'family', 'haystack': units in it, 'text_sha'}; deterministic in
        (prompt, seed, tokenizer, corpus)."""
        key = (prompt.id, seed)
        if key in self._built:
            return self._built[key]
        name, ctx = prompt.data["task"], prompt.data["context"]
        d = draft(name, lambda *tag: private_generator("ruler", prompt.id, seed, *tag), self.corpus(), ctx,
                  lambda text: len(model.encode(text)))
        budget = ctx - TOKENS_TO_GENERATE[d.family]

        def pieces(n: int) -> tuple[list[int], list[int]]:
            head, tail = render(model.tokenizer, *d.user(n), d.answer_prefix)
            return model.encode(head), model.encode(tail)

        n = fit(lambda n: sum(map(len, pieces(n))), budget)
        if n < 0:
            raise ValueError(f"ruler: {name} does not fit a context of {ctx} tokens: without a haystack its prompt "
                             f"takes {sum(map(len, pieces(0)))} tokens, and {TOKENS_TO_GENERATE[d.family]} are its "
                             f"answer's; use a longer context")
        head, tail = d.user(n)
        missing = [a for a in d.answers if a not in head]
        if missing:  # fwe's rarest answer needs a few dozen words; a reference must be in the text
            raise ValueError(f"ruler: {name} at {ctx} tokens holds {n} {d.unit}, too few to hold its answer "
                             f"{missing[0]!r}; use a longer context")
        head_ids, tail_ids = pieces(n)
        built = {"ids": head_ids + tail_ids, "prefill": len(head_ids), "answers": list(d.answers),
                 "family": d.family, "haystack": n, "text_sha": text_hash(head + tail)}
        if len(self._built) >= 64:  # keep memory flat over a long run: only recent prompts are rebuilt from here
            self._built.clear()
        self._built[key] = built
        return built

    def _max_new_tokens(self, built: dict) -> int:
        return self.opts.max_new_tokens or TOKENS_TO_GENERATE[built["family"]]

    def _prefills(self, built: list[dict]) -> list[int] | None:
        return [b["prefill"] for b in built] if self.opts.prefill == "context" else None

    # --- the contract ------------------------------------------------------------------------
    def baseline(self, model, prompt: Prompt, seed: int) -> dict:
        return self.baseline_batch(model, [prompt], seed)[0]

    def evaluate(self, model, prompt: Prompt, cache_config, seed: int, baseline: dict, out_dir: Path) -> dict:
        return self.evaluate_batch(model, [prompt], cache_config, seed, [baseline], out_dir)[0]

    def batches(self, model, prompts: list[Prompt]) -> list[list[Prompt]]:
        """Runs of up to ``--batch-size`` consecutive prompts of one task and context (one answer length
        a batch; a batch is padded to its longest prompt, a row does not depend on it beyond float rounding)."""
        size, out = self.prompts_per_batch(model), []
        for _, run in groupby(prompts, key=lambda p: (p.data["task"], p.data["context"])):
            run = list(run)
            out.extend(run[i:i + size] for i in range(0, len(run), size))
        return out

    def baseline_batch(self, model, prompts: list[Prompt], seed: int) -> list[dict]:
        built = [self.build(model, p, seed) for p in prompts]
        answers = baseline_answers(model, [b["ids"] for b in built], self._max_new_tokens(built[0]), self.opts.topk,
                                   prefill=self._prefills(built))
        return [{**a, "prompt_tokens": len(b["ids"])} for a, b in zip(answers, built)]

    def evaluate_batch(self, model, prompts: list[Prompt], cache_config, seed: int, baselines: list[dict],
                       out_dir: Path) -> list[dict]:
        built = [self.build(model, p, seed) for p in prompts]
        graded = graded_answers(self, model, [p.id for p in prompts], [b["ids"] for b in built], cache_config,
                                baselines, self._max_new_tokens(built[0]), prefill=self._prefills(built))
        return [{**self.scores(answer, baseline["answer"], p.data["task"], b["answers"]), **row,
                 "answer": answer.strip(), "tokens": len(b["ids"]), "haystack": b["haystack"]}
                for (answer, row), p, b, baseline in zip(graded, prompts, built, baselines)]

    def scores(self, answer: str, base_answer: str, task: str, references: list[str]) -> dict:
        """RULER's score of the answer and of the baseline's, and whether each holds every reference."""
        score, passed = self.metric("ruler_score"), self.metric("ruler_pass")
        out = {}
        for prefix, text in (("", answer), ("baseline_", base_answer)):
            out[f"{prefix}ruler_score"] = s = score(text, references, task)
            out[f"{prefix}ruler_pass"] = passed(s)
        return out
