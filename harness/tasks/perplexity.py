"""``perplexity``: chunked teacher forcing, so the scored tokens really read the compressed cache.

Per prompt (``context`` tokens of real text): the first ``prefix`` tokens are fed as one chunk
(prefilled natively, not scored); then chunks of ``chunk`` tokens, each attending to the
compressed past + the native window + itself (causal), after which it is appended (tokens
enter the codec as they leave the window). Every logit of those later chunks that predicts a
token of the context is scored: perplexity, and against the uncompressed baseline the mean KL
of next-token distributions and top-1 agreement (see :mod:`metrics.text`).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from adapters.cache.stats import cache_row_stats
from adapters.cache.rollout_clock import RolloutClock
from registry.options import Allowed, option
from metrics.text import token_nll, topk_logprobs

from harness.tasks.base import Prompt, Task, register_task
from harness.tasks.text_corpus import load_excerpts, text_hash


@register_task("perplexity")
class PerplexityTask(Task):
    modality = "text"
    metrics = ("perplexity", "kl", "top1_agree")
    #: the ranking metric: KL to the baseline's next-token distributions varies far less from
    #: prompt to prompt than perplexity does, and a codec that changes nothing scores exactly 0
    headline = "kl"

    @dataclass(frozen=True)
    class Options:
        context: int = option(512, "tokens per prompt", Allowed(lo=3, positions=True))
        prefix: int = option(384, "first chunk: prefilled natively, not scored", Allowed(lo=1))
        chunk: int = option(
            64, "tokens per later chunk; each attends to compressed past + window + itself", Allowed(lo=1))
        count: int = option(4, "prompts taken from the default corpus (--limit also cuts)", Allowed(lo=1))
        topk: int = option(256, "baseline tokens kept per position for the KL (plus one tail bucket)", Allowed(lo=1))
        batch: int = option(
            0, "prompts run together through one cache; 0: the run's --batch-size (rows do not "
            "depend on it beyond float rounding)", Allowed(lo=0))

    @classmethod
    def check_options(cls, options) -> None:
        if options.prefix + 2 > options.context:
            raise ValueError(f"prefix ({options.prefix}) must leave at least 2 tokens of the context "
                             f"({options.context}) to score")

    def prompts(self, source: str | None = None, limit: int | None = None) -> list[Prompt]:
        n = limit or (self.opts.count if source in (None, "", "default") else 8)
        excerpts = load_excerpts(source, chars=self.opts.context * 8, limit=n)
        return [Prompt(e.id, e.text, {"source": e.source, "text_sha": e.sha}) for e in excerpts]

    # --- shared --------------------------------------------------------------------------
    def _plan(self, model, prompt: Prompt) -> tuple[list[int], list[int]]:
        """(token ids, chunk sizes)."""
        ids = model.encode(prompt.data)[: self.opts.context]
        prefix, chunk = self.opts.prefix, self.opts.chunk
        if prefix < 1 or chunk < 1:
            raise ValueError(f"perplexity: prefix ({prefix}) and chunk ({chunk}) must be >= 1")
        if len(ids) < prefix + 2:
            raise ValueError(f"prompt '{prompt.id}' has {len(ids)} tokens, fewer than prefix {prefix} + 2: "
                             f"use a longer text or a smaller prefix (--task-opt perplexity.prefix=N)")
        sizes, left = [prefix], len(ids) - prefix
        while left > 0:
            sizes.append(min(chunk, left))
            left -= sizes[-1]
        return ids, sizes

    def _scored(self, ids: list[int], start: int, logits: torch.Tensor) -> tuple[slice, torch.Tensor] | None:
        """For a chunk at ``start``: (rows of the scored-token arrays, targets) or None (the prefix)."""
        prefix = self.opts.prefix
        if start < prefix:
            return None
        n = min(logits.shape[-2], len(ids) - 1 - start)  # the last token of the context predicts nothing
        if n <= 0:
            return None
        return slice(start - prefix, start - prefix + n), torch.tensor(ids[start + 1: start + 1 + n], device=logits.device)

    def memory_shape(self, prompts: list[Prompt], batch: int):
        """Teacher forcing keeps every column's logits (the prefix's, then each chunk's); nothing is generated."""
        from harness.run.memory import TaskShape

        return TaskShape(batch=max(1, min(self.opts.batch or batch, len(prompts))), context=self.opts.context,
                         logit_columns=max(self.opts.prefix, self.opts.chunk))

    def batches(self, model, prompts: list[Prompt]) -> list[list[Prompt]]:
        """Runs of up to ``batch`` (else ``--batch-size``) consecutive prompts; prompts of other
        token lengths run together left-padded, each on its own chunk plan. Every prompt's plan is
        checked here, before the first batch runs."""
        size = self.opts.batch or self.prompts_per_batch(model)
        if size < 1:
            raise ValueError(f"perplexity: batch must be >= 1, got {size}")
        for p in prompts:
            self._plan(model, p)
        return [prompts[i:i + size] for i in range(0, len(prompts), size)]

    def _rollout(self, model, plans: list[tuple[list[int], list[int]]], cache_config, on_scored,
                 speed: RolloutClock | None = None) -> tuple[list[list[int]], object]:
        """Teacher-force the batch of ``_plan``s; ``on_scored(b, rows, targets, logits [n, V])`` per
        sequence and scored chunk; ``speed`` times it. Returns (token ids per prompt, the cache)."""
        ids = [ids for ids, _ in plans]

        def on_chunk(b, start, logits):  # logits [t, V] of sequence b
            s = self._scored(ids[b], start, logits)
            if s is not None:
                rows, tgt = s
                on_scored(b, rows, tgt, logits[: tgt.shape[0]])

        cache = model.teacher_force(ids, [sizes for _, sizes in plans], cache_config, on_chunk, speed=speed)
        return ids, cache

    # --- the contract --------------------------------------------------------------------
    def baseline(self, model, prompt: Prompt, seed: int) -> dict:
        return self.baseline_batch(model, [prompt], seed)[0]

    def evaluate(self, model, prompt: Prompt, cache_config, seed: int, baseline: dict, out_dir: Path) -> dict:
        return self.evaluate_batch(model, [prompt], cache_config, seed, [baseline], out_dir)[0]

    def baseline_batch(self, model, prompts: list[Prompt], seed: int) -> list[dict]:
        acc = [{"nll": [], "top_ids": [], "top_logp": []} for _ in prompts]

        def on_scored(b, rows, tgt, lg):
            acc[b]["nll"].append(token_nll(lg, tgt))
            i, lp = topk_logprobs(lg, self.opts.topk)
            acc[b]["top_ids"].append(i)
            acc[b]["top_logp"].append(lp)

        ids, _ = self._rollout(model, [self._plan(model, p) for p in prompts], None, on_scored)
        return [{"ids_sha": text_hash(repr(ids[b])), "tokens": len(ids[b]), **{k: torch.cat(v) for k, v in a.items()}}
                for b, a in enumerate(acc)]

    def evaluate_batch(self, model, prompts: list[Prompt], cache_config, seed: int, baselines: list[dict],
                       out_dir: Path) -> list[dict]:
        plans = [self._plan(model, p) for p in prompts]
        for p, (ids, _), base in zip(prompts, plans, baselines):
            if text_hash(repr(ids)) != base["ids_sha"]:
                raise RuntimeError(f"prompt '{p.id}': the stored baseline was made from other tokens "
                                   f"(another tokenizer or text?); start a fresh run")
        acc = [{"nll": [], "kl": [], "agree": []} for _ in prompts]
        kl_fn, agree_fn = self.metric("kl"), self.metric("top1_agree")

        def on_scored(b, rows, tgt, lg):
            base = baselines[b]
            acc[b]["nll"].append(token_nll(lg, tgt))
            acc[b]["kl"].append(kl_fn(base["top_ids"][rows], base["top_logp"][rows], lg))
            acc[b]["agree"].append(agree_fn(base["top_ids"][rows, 0], lg).float())

        clock = RolloutClock(model.device)  # the prefix is the prefill; nothing is decoded
        ids, cache = self._rollout(model, plans, cache_config, on_scored, clock)
        speed, out = clock.record(), []
        for b, a in enumerate(acc):
            nll_t = torch.cat(a["nll"])
            out.append({
                "perplexity": self.metric("perplexity")(nll_t),
                "kl": float(torch.cat(a["kl"]).double().mean()),
                "top1_agree": float(torch.cat(a["agree"]).double().mean()),
                "baseline_perplexity": self.metric("perplexity")(baselines[b]["nll"]),
                "tokens": len(ids[b]),
                "scored_tokens": int(nll_t.numel()),
                **cache_row_stats(cache.kv, b),  # the sequence's own tokens: as if it ran alone
                "speed": speed,  # the batch's one rollout: the runner keeps it out of rows.jsonl
            })
        return out
