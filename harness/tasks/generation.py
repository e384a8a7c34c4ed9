"""Greedy answers through the cache, graded against the uncompressed baseline's answer (shared by
the generation tasks: ``needle``, ``kvpress``).

The baseline answers natively and keeps, along its own answer, the top-k of each next-token
distribution. A codec's rollout answers through the compressed cache and, on a fork of the cache
taken after the prompt, teacher-forces the baseline's answer: the KL and top-1 agreement of those
distributions grade the codec even where both answers are equally right or wrong.
"""
from __future__ import annotations

from adapters.cache_stats import cache_row_stats
from metrics.text import topk_logprobs

from .text_corpus import text_hash


def _ids_sha(ids: list[int], prefill: int | None) -> str:
    return text_hash(repr(ids) if prefill is None else repr((ids, prefill)))


def baseline_answer(model, ids: list[int], max_new_tokens: int, topk: int, prefill: int | None = None) -> dict:
    """The native greedy answer to ``ids``: {'ids_sha', 'tokens', 'answer', 'top_ids' [n, k] int32,
    'top_logp' [n, k] float32}. ``prefill``: as :meth:`adapters.hf_causal_lm.CausalLM.greedy`."""
    kw = {} if prefill is None else {"prefill": prefill}
    r = model.greedy(ids, max_new_tokens, None, force="self", **kw)
    top_ids, top_logp = topk_logprobs(r["forced_logits"], topk)
    return {"ids_sha": _ids_sha(ids, prefill), "tokens": r["tokens"], "answer": model.decode(r["tokens"]),
            "top_ids": top_ids, "top_logp": top_logp}


def graded_answer(task, model, prompt_id: str, ids: list[int], cache_config, baseline: dict, max_new_tokens: int,
                  prefill: int | None = None) -> tuple[str, dict]:
    """The greedy answer through ``cache_config``'s cache and its graded row part: (answer text,
    {'output_match', 'kl', 'top1_agree', and the rate fields of the cache}). ``task`` gives the
    metric implementations (:meth:`harness.tasks.base.Task.metric`)."""
    if _ids_sha(ids, prefill) != baseline["ids_sha"]:
        raise RuntimeError(f"prompt '{prompt_id}': the stored baseline was made from another prompt "
                           f"(another tokenizer or haystack?); start a fresh run")
    kw = {} if prefill is None else {"prefill": prefill}
    r = model.greedy(ids, max_new_tokens, cache_config, force=baseline["tokens"], **kw)
    forced = r["forced_logits"]
    row = {
        "output_match": task.metric("output_match")(r["tokens"], baseline["tokens"]),
        "kl": float(task.metric("kl")(baseline["top_ids"], baseline["top_logp"], forced).double().mean()),
        "top1_agree": float(task.metric("top1_agree")(baseline["top_ids"][:, 0], forced).double().mean()),
    }
    row.update(cache_row_stats(r["cache"].kv))
    return model.decode(r["tokens"]), row
