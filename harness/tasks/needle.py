"""``needle``: multi-key needle in a haystack, in the style of RULER's ``niah_multikey_1``.

``needles`` sentences "One of the special magic numbers for <key> is: <7-digit value>." with
keys and values from a private generator of (seed, prompt id) are inserted into a haystack of
real text (the default corpus, or ``--prompts``); the queried needle sits at the prompt's depth,
the others at random depths. The question asks for the queried key's value; the model answers
greedily through the compressed cache (the prompt is prefilled natively, then committed; every
generated token reads the compressed cache). Scores: exact match of the first 7-digit number,
whether the whole output equals the baseline's, and, teacher-forcing the baseline's answer on a
fork of the cache taken after the prefill, the KL and top-1 agreement of the next-token
distributions along that answer.

``ruler``: RULER's own niah forms (its ``scripts/synthetic.yaml``) in RULER's wording, scored as
RULER does, by ``string_match_all`` (the share of the asked values found in the answer):
``multikey`` (niah_multikey_1: one key asked among ``needles``), ``multivalue`` (``needles``
values of one key, all asked), ``multiquery`` (``needles`` keys, all asked). RULER's defaults (4
needles, up to 128 answer tokens) are the run preset ``harness run --preset ruler``.

Prompts sweep ``contexts`` (tokens) x ``depths`` (fraction of the haystack) x ``repeats``.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from kernels import private_generator
from registry.options import Allowed, option
from metrics.text import first_number

from harness.tasks.base import Prompt, Task, first, register_task
from harness.tasks.generation import baseline_answers, graded_answers
from harness.tasks.text_corpus import load_excerpts, text_hash

ADJECTIVES = ("amber", "bold", "brisk", "calm", "clever", "crimson", "dusty", "eager", "faint", "gentle", "golden",
              "hollow", "icy", "jolly", "keen", "lively", "lucky", "misty", "noble", "olive", "pale", "proud",
              "quiet", "rapid", "rosy", "rusty", "silent", "silver", "sleepy", "smooth", "sturdy", "tidy", "vivid",
              "wild", "windy", "witty")
NOUNS = ("anchor", "badger", "beacon", "canyon", "cedar", "comet", "cradle", "falcon", "fern", "garden", "harbor",
         "island", "kettle", "lantern", "meadow", "mirror", "orchard", "otter", "pebble", "pillow", "quarry",
         "raven", "ribbon", "saddle", "spindle", "summit", "teapot", "thistle", "tunnel", "valley", "violin",
         "walrus", "willow", "window", "wizard", "yarrow")
INSTRUCTION = ("Some special magic numbers are hidden within the following text. Make sure to memorize it. "
               "I will quiz you about the numbers afterwards.")
QUESTION = "What is the special magic number for {key} mentioned in the provided text?"
ANSWER_PREFIX = "The special magic number for {key} mentioned in the provided text is"
NEEDLE = "One of the special magic numbers for {key} is: {value}."
RULER_VARIANTS = ("multikey", "multivalue", "multiquery")
#: RULER's niah template (scripts/data/synthetic/constants.py): singular where one value is asked, else plural
RULER_WORDING = {
    False: ("A special magic number is hidden within the following text. Make sure to memorize it. "
            "I will quiz you about the number afterwards.",
            "What is the special magic number for {key} mentioned in the provided text?",
            "The special magic number for {key} mentioned in the provided text is"),
    True: ("Some special magic numbers are hidden within the following text. Make sure to memorize it. "
           "I will quiz you about the numbers afterwards.",
           "What are all the special magic numbers for {key} mentioned in the provided text?",
           "The special magic numbers for {key} mentioned in the provided text are"),
}


def sentences(text: str) -> list[str]:
    """Split prose into sentences (after '. ', '? ', '! ' or a blank line), whitespace collapsed."""
    out, buf = [], []
    for word in text.split():
        buf.append(word)
        if word.endswith((".", "?", "!", ":")) and len(buf) > 3:
            out.append(" ".join(buf))
            buf = []
    if buf:
        out.append(" ".join(buf))
    return out


@register_task("needle")
class NeedleTask(Task):
    modality = "text"
    metrics = ("exact_match", "string_match_all", "output_match", "length_ratio", "kl", "top1_agree")
    score_metric = "string_match_all"
    headline = "kl"  # graded where exact match is all or nothing on a few prompts
    forks_cache = True  # the baseline's answer teacher-forced on a fork (harness.tasks.generation)

    @dataclass(frozen=True)
    class Options:
        contexts: tuple[int, ...] = option(
            (1024,), "prompt lengths in tokens (comma list)", Allowed(lo=1, nonempty=True, positions=True))
        depths: tuple[float, ...] = option(
            (0.1, 0.3, 0.5, 0.7, 0.9), "depths of the queried needle, fractions of the haystack (comma list)",
            Allowed(lo=0, hi=1, nonempty=True))
        repeats: int = option(
            1, "prompts per (context, depth), each with other keys, values and haystack", Allowed(lo=1))
        needles: int = option(
            2, "needles per prompt (1 queried + distractors; RULER uses 4, too hard for a 135M model)", Allowed(lo=1))
        max_new_tokens: int = option(12, "greedy tokens generated per answer", Allowed(lo=1))
        topk: int = option(256, "baseline tokens kept per position for the KL (plus one tail bucket)", Allowed(lo=1))
        ruler: str = option(
            "", "RULER's niah form, wording and string_match_all scoring: multikey, multivalue (needles values "
            "of one key) or multiquery (needles keys, all asked); '' this task's own. RULER's 4 needles "
            "and 128 answer tokens: --preset ruler", Allowed(choices=("", "multikey", "multivalue", "multiquery")))

    def __init__(self, **options):
        super().__init__(**options)
        self._haystack: list[str] | None = None
        self._source: str | None = None
        self._sent_tokens: dict = {}

    def prompts(self, source: str | None = None, limit: int | None = None) -> list[Prompt]:
        self._source = source
        self._ruler()  # a bad value stops the run before the model loads
        for depth in self.opts.depths:
            if not 0.0 <= depth <= 1.0:
                raise ValueError(f"needle depth must be in [0, 1], got {depth}")
        many = self.opts.repeats > 1
        return first((Prompt(f"niah-c{ctx}-d{depth:g}" + (f"-r{rep}" if many else ""),
                             {"context": int(ctx), "depth": float(depth), "repeat": rep},
                             {"source": source or "default", "context": int(ctx)})
                      for ctx in self.opts.contexts for depth in self.opts.depths for rep in range(self.opts.repeats)),
                     limit)

    def _ruler(self) -> str:
        variant = self.opts.ruler
        if variant not in ("",) + RULER_VARIANTS:
            raise ValueError(f"needle: ruler={variant!r} is not a RULER niah form; use one of "
                             f"{', '.join(RULER_VARIANTS)} (or leave it empty)")
        return variant

    # --- building a prompt -----------------------------------------------------------------
    def _hay(self) -> list[str]:
        if self._haystack is None:
            excerpts = load_excerpts(self._source, chars=200_000, limit=None if not self._source else 4)
            self._haystack = [s for e in excerpts for s in sentences(e.text)]
        return self._haystack

    def build(self, model, prompt: Prompt, seed: int) -> dict:
        """{'ids': prompt token ids, 'key', 'value' (the first asked), 'expected' (every value asked),
        'query', 'needle_depths', 'text_sha'}; deterministic in (prompt, seed)."""
        ctx, depth, rep = prompt.data["context"], prompt.data["depth"], prompt.data["repeat"]
        g = private_generator("needle", prompt.id, seed)
        k, variant = self.opts.needles, self._ruler()
        picks = torch.randperm(len(ADJECTIVES) * len(NOUNS), generator=g)[:1 if variant == "multivalue" else k].tolist()
        keys = [f"{ADJECTIVES[i // len(NOUNS)]}-{NOUNS[i % len(NOUNS)]}" for i in picks]
        values = [str(int(v)) for v in torch.randint(1_000_000, 10_000_000, (k,), generator=g)]
        needles = [NEEDLE.format(key=a, value=b) for a, b in zip(keys * k if variant == "multivalue" else keys, values)]
        asked = keys if variant == "multiquery" else keys[:1]
        expected = values if variant in ("multivalue", "multiquery") else values[:1]
        query = asked[0] if len(asked) == 1 else ", ".join(asked[:-1]) + ", and " + asked[-1]  # RULER's join
        plural = len(expected) > 1

        hay = self._hay()
        overhead = len(self._render(model, "", query, plural))
        budget = ctx - overhead - sum(len(model.encode(" " + n)) for n in needles)
        if budget < 16:
            raise ValueError(f"needle: context {ctx} leaves no room for a haystack (the template takes {overhead} tokens)")
        # sentences from a start that depends on the repeat, until the token budget is spent
        start = (rep * 997) % len(hay)
        body, used, i = [], 0, start
        while True:
            s = hay[i % len(hay)]
            n = self._count(model, s)
            if used + n > budget:  # fill the rest with the longest word prefix that fits
                words = s.split()
                lo, hi = 0, len(words)
                while lo < hi:
                    mid = (lo + hi + 1) // 2
                    if len(model.encode(" " + " ".join(words[:mid]))) <= budget - used:
                        lo = mid
                    else:
                        hi = mid - 1
                if lo:
                    body.append(" ".join(words[:lo]))
                break
            body.append(s)
            used += n
            i += 1
        slots = len(body)
        where = [round(depth * slots)] + torch.randint(0, slots + 1, (k - 1,), generator=g).tolist()
        for pos, needle in sorted(zip(where, needles), key=lambda t: -t[0]):
            body.insert(pos, needle)
        text = " ".join(body)
        ids = self._render(model, text, query, plural)
        return {"ids": ids, "key": keys[0], "value": values[0], "expected": expected, "query": query,
                "needle_depths": [w / max(slots, 1) for w in where], "text_sha": text_hash(text)}

    def _count(self, model, sentence: str) -> int:
        n = self._sent_tokens.get(sentence)
        if n is None:
            n = self._sent_tokens[sentence] = len(model.encode(" " + sentence))
        return n

    def _render(self, model, context: str, key: str, plural: bool = False) -> list[int]:
        instruction, question, answer_prefix = RULER_WORDING[plural] if self._ruler() else (INSTRUCTION, QUESTION,
                                                                                            ANSWER_PREFIX)
        user = f"{instruction}\n{context}\n{question.format(key=key)}"
        tok = model.tokenizer
        if getattr(tok, "chat_template", None):
            text = tok.apply_chat_template([{"role": "user", "content": user}], tokenize=False,
                                           add_generation_prompt=True)
            return model.encode(text + answer_prefix.format(key=key))
        return model.encode(f"{user}\nAnswer: {answer_prefix.format(key=key)}")

    # --- the contract ------------------------------------------------------------------------
    def baseline(self, model, prompt: Prompt, seed: int) -> dict:
        return self.baseline_batch(model, [prompt], seed)[0]

    def evaluate(self, model, prompt: Prompt, cache_config, seed: int, baseline: dict, out_dir: Path) -> dict:
        return self.evaluate_batch(model, [prompt], cache_config, seed, [baseline], out_dir)[0]

    def batches(self, model, prompts: list[Prompt]) -> list[list[Prompt]]:
        """Runs of up to ``--batch-size`` consecutive prompts of one context size (a batch is padded
        to its longest prompt; a row does not depend on its batch beyond float rounding)."""
        size, out = self.prompts_per_batch(model), []
        for p in prompts:
            if out and len(out[-1]) < size and out[-1][0].data["context"] == p.data["context"]:
                out[-1].append(p)
            else:
                out.append([p])
        return out

    def baseline_batch(self, model, prompts: list[Prompt], seed: int) -> list[dict]:
        built = [self.build(model, p, seed) for p in prompts]
        # the baseline's distributions along its own answer, computed exactly as a codec's are
        answers = baseline_answers(model, [p["ids"] for p in built], self.opts.max_new_tokens, self.opts.topk)
        return [{**a, "value": p["value"], "prompt_tokens": len(p["ids"])} for a, p in zip(answers, built)]

    def evaluate_batch(self, model, prompts: list[Prompt], cache_config, seed: int, baselines: list[dict],
                       out_dir: Path) -> list[dict]:
        built = [self.build(model, p, seed) for p in prompts]
        graded = graded_answers(self, model, [p.id for p in prompts], [p["ids"] for p in built], cache_config,
                                baselines, self.opts.max_new_tokens)
        return [{**self._scores(answer, baseline["answer"], p), **row, "answer": answer.strip(), "tokens": len(p["ids"])}
                for (answer, row), p, baseline in zip(graded, built, baselines)]

    def _scores(self, answer: str, base_answer: str, p: dict) -> dict:
        """Exact match of the first 7-digit number where one value is asked; with ``ruler`` also
        RULER's string_match_all over every value asked. Each for the answer and the baseline's."""
        out = {}
        if len(p["expected"]) == 1:
            exact_match = self.metric("exact_match")
            out["exact_match"] = exact_match(first_number(answer, 7), p["value"])
            out["baseline_exact_match"] = exact_match(first_number(base_answer, 7), p["value"])
        if self._ruler():
            string_match = self.metric("string_match_all")
            out["string_match_all"] = string_match(answer, p["expected"])
            out["baseline_string_match_all"] = string_match(base_answer, p["expected"])
        return out
