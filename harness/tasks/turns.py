"""``turns``: one context, several questions asked one after another through the same compressed
cache, as a chat goes on (SCBench's shared-context multi-turn mode); scored per turn, so what a
codec loses over the turns shows.

A conversation is RULER's niah_multiquery sample with ``turns`` keys (:mod:`harness.tasks.ruler_synthetic`):
as many needles "One of the special magic numbers for <key> is: <value>." at random depths of the
essay haystack (our corpus, or ``--prompts``). The context (RULER's instruction and the haystack) is
prefilled natively once, then committed to the cache. Turn t asks for the t-th key in RULER's niah
wording (singular: one value asked): the question goes through the SAME cache as one chunk
(attending to the compressed prefix, the native window and itself), the model answers greedily
through it (``max_new_tokens``, stopping at EOS), and the answer stays in the cache (it was
generated through it) when the next question follows. The baseline holds the same conversation
through codec 'none'. A later question is the model's chat template's next user turn after the
answer (:func:`follow_up`); without a template, RULER's 'base' form of a question.

Rows: one per (conversation, turn). The runner keys a row by its prompt and takes one result per
prompt of a batch, so each turn is a :class:`Prompt` ``{conversation}-t{t}`` (``prompt_meta`` turn=t)
and a conversation is one batch (:meth:`TurnsTask.batches`): one rollout scores all its turns. A
batch holding only the first turns (``--limit`` counts turns) runs the conversation up to its last.
Per turn: ``string_match_all`` (RULER's: that turn's value found in that turn's answer; also the
baseline's answer's, ``baseline_string_match_all``), ``output_match`` (the answer equals the
baseline's answer of that turn) and ``length_ratio`` (its tokens over the baseline's), with the rate
fields of the cache as that turn ends. The summary breaks the score down by turn (``breakdown``).

``contexts`` counts the whole conversation, as RULER's max_seq_length counts the answer: the
context, every question and ``turns`` x ``max_new_tokens`` answer tokens fit in it, with the largest
haystack that does. Every draw comes from a private generator of (conversation, seed): reruns
are byte-identical.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import groupby
from pathlib import Path

from adapters.cache.stats import cache_row_stats
from adapters.cache.config import CacheConfig
from kernels import private_generator
from registry.options import Allowed, option

from harness.tasks.base import Prompt, Task, first, register_task
from harness.tasks.needle import RULER_WORDING
from harness.tasks.ruler import render
from harness.tasks.ruler_synthetic import DEPTHS, Corpus, Niah, fit, niah
from harness.tasks.text_corpus import text_hash

#: one turn's question and the answer's opening: RULER's niah wording where one value is asked
QUESTION, ANSWER_PREFIX = RULER_WORDING[False][1:]
#: stand-ins for an answer and a question in a rendered chat, found again to cut the text between them
MARKS = ("ANSWERMARK", "QUESTIONMARK")


def follow_up(tokenizer, question: str, answer_prefix: str) -> str:
    """The text that asks a later ``question`` after the previous answer, up to ``answer_prefix``
    opening the next answer. With a chat template: the end of the assistant's turn, the user's turn
    and the generation prompt, cut from the template's rendering of a chat with two user turns;
    without one, RULER's 'base' form, as the first question's (:func:`harness.tasks.ruler.render`)."""
    if not getattr(tokenizer, "chat_template", None):
        return f"\n{question} {answer_prefix}"
    answer, asked = MARKS
    chat = [{"role": "user", "content": "context"}, {"role": "assistant", "content": answer},
            {"role": "user", "content": asked}]
    text = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True, enable_thinking=False)
    a, q = text.find(answer), text.rfind(asked)
    if a < 0 or q < a + len(answer):
        raise ValueError("turns: the model's chat template drops or rewrites an earlier answer, so a later question "
                         "cannot follow the answer the cache holds")
    return text[a + len(answer):q] + question + text[q + len(asked):] + answer_prefix


@register_task("turns")
class TurnsTask(Task):
    modality = "text"
    metrics = ("string_match_all", "output_match", "length_ratio")
    # no teacher-forced KL: after the first turn the codec's cache holds its own answers, not the baseline's
    headline = "string_match_all"
    score_metric = "string_match_all"
    breakdown = ("turn", "context")  # the report's table of the score per turn: how it degrades as the chat goes on

    @dataclass(frozen=True)
    class Options:
        contexts: tuple[int, ...] = option(
            (4096,), "conversation lengths in tokens (comma list): the context, every question and turns x "
            "max_new_tokens answer tokens", Allowed(lo=1, nonempty=True, positions=True))
        turns: int = option(
            4, "needles in the context, one asked per turn (RULER's depths give 40 at most)",
            Allowed(lo=1, hi=len(DEPTHS)))
        repeats: int = option(2, "conversations per context, each its own draw", Allowed(lo=1))
        max_new_tokens: int = option(16, "greedy tokens generated per answer", Allowed(lo=1))

    def __init__(self, **options):
        super().__init__(**options)
        self._source: str | None = None
        self._corpus: Corpus | None = None
        self._built: dict[tuple[str, int], dict] = {}  # the current conversation (baseline, then every codec)

    def prompts(self, source: str | None = None, limit: int | None = None) -> list[Prompt]:
        """One prompt per turn, the turns of a conversation in order; ``limit`` counts turns."""
        self._source = source
        k, answers = self.opts.turns, self.opts.turns * self.opts.max_new_tokens
        for ctx in self.opts.contexts:  # what needs no tokenizer, checked before the model loads
            if ctx <= answers:
                raise ValueError(f"turns: {k} turns do not fit a conversation of {ctx} tokens: their answers alone "
                                 f"take {k} x {self.opts.max_new_tokens} = {answers}; give turns.contexts above "
                                 f"{answers}, or fewer turns.turns or turns.max_new_tokens")
        return first((Prompt(f"turns-c{ctx}-r{rep}-t{t}", {"conversation": f"turns-c{ctx}-r{rep}", "context": int(ctx),
                                                           "turn": t},
                             {"turn": t, "turns": k, "context": int(ctx), "repeat": rep, "source": source or "default"})
                      for ctx in self.opts.contexts for rep in range(self.opts.repeats) for t in range(1, k + 1)), limit)

    def memory_shape(self, prompts: list[Prompt], batch: int):
        """One conversation at a time (:meth:`batches`): its context counts every turn."""
        from dataclasses import replace

        shape = super().memory_shape(prompts, batch)
        return replace(shape, batch=1, new_tokens=0)

    def batches(self, model, prompts: list[Prompt]) -> list[list[Prompt]]:
        """One batch per conversation, whatever ``--batch-size``: its turns share one rollout."""
        return [list(run) for _, run in groupby(prompts, key=lambda p: p.data["conversation"])]

    # --- building a conversation -------------------------------------------------------------
    def corpus(self) -> Corpus:
        if self._corpus is None:
            self._corpus = Corpus.load(self._source)
        return self._corpus

    def build(self, model, data: dict, seed: int) -> dict:
        """The conversation of a turn's prompt ``data``: {'context': token ids prefilled, 'questions': each
        turn's token ids, 'keys', 'values': each turn's, 'haystack': essay words, 'ids_sha'};
        deterministic in (conversation, seed, tokenizer, corpus)."""
        key = (data["conversation"], seed)
        if key in self._built:
            return self._built[key]
        k, ctx, tok = self.opts.turns, data["context"], model.tokenizer
        d = niah(Niah("essay", "words", "numbers", k=k, q=k),
                  lambda *tag: private_generator("turns", data["conversation"], seed, *tag), self.corpus())
        keys = list(d.keys)
        first = f"\n{QUESTION.format(key=keys[0])}"  # as RULER's niah asks: after the context, on its own line

        def context(n: int) -> list[int]:
            return model.encode(render(tok, d.user(n)[0], first, ANSWER_PREFIX.format(key=keys[0]))[0])

        questions = [model.encode(render(tok, d.user(0)[0], first, ANSWER_PREFIX.format(key=keys[0]))[1])]
        questions += [model.encode(follow_up(tok, QUESTION.format(key=key), ANSWER_PREFIX.format(key=key)))
                      for key in keys[1:]]
        answers = k * self.opts.max_new_tokens
        n = fit(lambda n: len(context(n)), ctx - sum(map(len, questions)) - answers)
        if n < 0:
            raise ValueError(f"turns: {k} turns do not fit a conversation of {ctx} tokens: without a haystack the "
                             f"context and questions take {len(context(0)) + sum(map(len, questions))} tokens and "
                             f"the answers {answers}; use a longer context")
        ids = context(n)
        built = {"context": ids, "questions": questions, "keys": keys, "values": list(d.answers), "haystack": n,
                 "ids_sha": text_hash(repr((ids, questions)))}
        self._built = {key: built}  # a batch is one conversation: only this one is asked for again
        return built

    def _converse(self, model, prompts: list[Prompt], built: dict, cache_config: CacheConfig) -> list[dict]:
        """The conversation up to the batch's last turn, with each turn's rate fields."""
        last = max(p.data["turn"] for p in prompts)
        return model.converse(built["context"], built["questions"][:last], self.opts.max_new_tokens,
                        cache_config, on_turn=lambda cache: cache_row_stats(cache.kv, 0))

    # --- the contract ------------------------------------------------------------------------
    def baseline(self, model, prompt: Prompt, seed: int) -> dict:
        return self.baseline_batch(model, [prompt], seed)[0]

    def evaluate(self, model, prompt: Prompt, cache_config, seed: int, baseline: dict, out_dir: Path) -> dict:
        return self.evaluate_batch(model, [prompt], cache_config, seed, [baseline], out_dir)[0]

    def baseline_batch(self, model, prompts: list[Prompt], seed: int) -> list[dict]:
        built = self.build(model, prompts[0].data, seed)
        turns = self._converse(model, prompts, built, CacheConfig())
        return [{"ids_sha": built["ids_sha"], "tokens": turns[p.data["turn"] - 1]["tokens"],
                 "answer": model.decode(turns[p.data["turn"] - 1]["tokens"])} for p in prompts]

    def evaluate_batch(self, model, prompts: list[Prompt], cache_config, seed: int, baselines: list[dict],
                       out_dir: Path) -> list[dict]:
        built = self.build(model, prompts[0].data, seed)
        for p, baseline in zip(prompts, baselines):
            if baseline["ids_sha"] != built["ids_sha"]:
                raise RuntimeError(f"prompt '{p.id}': the stored baseline was made from another conversation "
                                   f"(another tokenizer or haystack?); start a fresh run")
        turns = self._converse(model, prompts, built, cache_config)
        match, same, longer = (self.metric(m) for m in ("string_match_all", "output_match", "length_ratio"))
        rows = []
        for p, baseline in zip(prompts, baselines):
            t = p.data["turn"] - 1
            turn, value, answer = turns[t], built["values"][t], model.decode(turns[t]["tokens"])
            rows.append({"string_match_all": match(answer, [value]),
                         "baseline_string_match_all": match(baseline["answer"], [value]),
                         "output_match": same(turn["tokens"], baseline["tokens"]),
                         "length_ratio": longer(turn["tokens"], baseline["tokens"]),
                         "output_tokens": len(turn["tokens"]), "baseline_output_tokens": len(baseline["tokens"]),
                         **turn["after"],
                         "answer": answer.strip(), "key": built["keys"][t], "haystack": built["haystack"],
                         "context_tokens": len(built["context"]), "conversation_tokens": turn["fed"] + 1})
        return rows
