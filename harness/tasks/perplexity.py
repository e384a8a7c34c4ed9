"""``perplexity``: chunked teacher forcing, so the scored tokens really read the compressed cache.

Per prompt (``context`` tokens of real text): the first ``prefix`` tokens are fed as one chunk
(prefilled natively, not scored); then chunks of ``chunk`` tokens, each attending to the
compressed past + the native window + itself (causal), after which it is appended (tokens
enter the codec as they leave the window). Every logit of those later chunks that predicts a
token of the context is scored: perplexity, and against the uncompressed baseline the mean KL
of next-token distributions and top-1 agreement (see :mod:`metrics.text`).
"""
from __future__ import annotations

from pathlib import Path

import torch

from adapters.cache_stats import cache_row_stats
from metrics.text import token_nll, topk_logprobs

from .base import Prompt, Task, register_task
from .text_corpus import load_excerpts, text_hash


@register_task("perplexity")
class PerplexityTask(Task):
    modality = "text"
    metrics = ("perplexity", "kl", "top1_agree")
    option_defaults = {
        "context": (1024, "tokens per prompt"),
        "prefix": (256, "first chunk: prefilled natively, not scored"),
        "chunk": (64, "tokens per later chunk; each attends to compressed past + window + itself"),
        "count": (3, "prompts taken from the default corpus (--limit also cuts)"),
        "topk": (256, "baseline tokens kept per position for the KL (plus one tail bucket)"),
    }

    def prompts(self, source: str | None = None, limit: int | None = None) -> list[Prompt]:
        n = limit or (self.opt("count") if source in (None, "", "default") else 8)
        excerpts = load_excerpts(source, chars=self.opt("context") * 8, limit=n)
        return [Prompt(e.id, e.text, {"source": e.source, "text_sha": e.sha}) for e in excerpts]

    # --- shared --------------------------------------------------------------------------
    def _plan(self, model, prompt: Prompt) -> tuple[list[int], list[int]]:
        """(token ids, chunk sizes)."""
        ids = model.encode(prompt.data)[: self.opt("context")]
        prefix, chunk = self.opt("prefix"), self.opt("chunk")
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
        prefix = self.opt("prefix")
        if start < prefix:
            return None
        n = min(logits.shape[0], len(ids) - 1 - start)  # the last token of the context predicts nothing
        if n <= 0:
            return None
        return slice(start - prefix, start - prefix + n), torch.tensor(ids[start + 1: start + 1 + n])

    # --- the contract --------------------------------------------------------------------
    def baseline(self, model, prompt: Prompt, seed: int) -> dict:
        ids, sizes = self._plan(model, prompt)
        nll, top_ids, top_logp = [], [], []

        def on_chunk(start, logits):
            s = self._scored(ids, start, logits)
            if s is not None:
                rows, tgt = s
                lg = logits[: tgt.shape[0]]
                nll.append(token_nll(lg, tgt))
                i, lp = topk_logprobs(lg, self.opt("topk"))
                top_ids.append(i)
                top_logp.append(lp)

        model.teacher_force(ids, sizes, None, on_chunk)
        return {"ids_sha": text_hash(repr(ids)), "tokens": len(ids), "nll": torch.cat(nll),
                "top_ids": torch.cat(top_ids), "top_logp": torch.cat(top_logp)}

    def evaluate(self, model, prompt: Prompt, cache_config, seed: int, baseline: dict, out_dir: Path) -> dict:
        ids, sizes = self._plan(model, prompt)
        if text_hash(repr(ids)) != baseline["ids_sha"]:
            raise RuntimeError(f"prompt '{prompt.id}': the stored baseline was made from other tokens "
                               f"(another tokenizer or text?); start a fresh run")
        nll, kl, agree = [], [], []
        kl_fn, agree_fn = self.metric("kl"), self.metric("top1_agree")

        def on_chunk(start, logits):
            s = self._scored(ids, start, logits)
            if s is not None:
                rows, tgt = s
                lg = logits[: tgt.shape[0]]
                nll.append(token_nll(lg, tgt))
                kl.append(kl_fn(baseline["top_ids"][rows], baseline["top_logp"][rows], lg))
                agree.append(agree_fn(baseline["top_ids"][rows, 0], lg).float())

        cache = model.teacher_force(ids, sizes, cache_config, on_chunk)
        nll_t = torch.cat(nll)
        row = {
            "perplexity": self.metric("perplexity")(nll_t),
            "kl": float(torch.cat(kl).double().mean()),
            "top1_agree": float(torch.cat(agree).double().mean()),
            "baseline_perplexity": self.metric("perplexity")(baseline["nll"]),
            "tokens": len(ids),
            "scored_tokens": int(nll_t.numel()),
        }
        row.update(cache_row_stats(cache.kv))
        return row
