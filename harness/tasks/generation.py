"""Greedy answers through the cache, graded against the uncompressed baseline's answer (shared by
the generation tasks: ``needle``, ``kvpress``), for a batch of prompts at once.

The baseline answers natively and keeps, along its own answer, the top-k of each next-token
distribution. A codec's rollout answers through the compressed cache and, on a fork of the cache
taken after the prompt, teacher-forces the baseline's answer: the KL and top-1 agreement of those
distributions grade the codec even where both answers are equally right or wrong.

A batch of prompts of different lengths runs left-padded (:meth:`adapters.hf.causal_lm.CausalLM.greedy`);
each prompt's row is the one it gets alone, to float rounding.
"""
from __future__ import annotations

from adapters.cache.stats import cache_row_stats
from adapters.cache.rollout_clock import RolloutClock
from metrics.text import topk_logprobs

from harness.tasks.text_corpus import text_hash


def _ids_sha(ids: list[int], prefill: int | None) -> str:
    return text_hash(repr(ids) if prefill is None else repr((ids, prefill)))


def _prefills(prefill: list[int] | None, n: int) -> list[int | None]:
    return [None] * n if prefill is None else list(prefill)


def baseline_answers(model, ids: list[list[int]], max_new_tokens: int, topk: int,
                     prefill: list[int] | None = None) -> list[dict]:
    """The native greedy answer to each prompt of ``ids``: {'ids_sha', 'tokens', 'answer', 'top_ids'
    [n, k] int32, 'top_logp' [n, k] float32}. ``prefill``: one count per prompt, as
    :meth:`adapters.hf.causal_lm.CausalLM.greedy` takes it."""
    kw = {} if prefill is None else {"prefill": list(prefill)}
    out = []
    for p, pre, r in zip(ids, _prefills(prefill, len(ids)), model.greedy(ids, max_new_tokens, None, force="self", **kw)):
        top_ids, top_logp = topk_logprobs(r["forced_logits"], topk)
        out.append({"ids_sha": _ids_sha(p, pre), "tokens": r["tokens"], "answer": model.decode(r["tokens"]),
                    "top_ids": top_ids, "top_logp": top_logp})
    return out


def graded_answers(task, model, prompt_ids: list[str], ids: list[list[int]], cache_config, baselines: list[dict],
                   max_new_tokens: int, prefill: list[int] | None = None) -> list[tuple[str, dict]]:
    """Each prompt's greedy answer through ``cache_config``'s cache and its graded row part: (answer
    text, {'output_match', 'length_ratio' (its tokens over the baseline's; 'output_tokens' and
    'baseline_output_tokens' the counts), 'kl', 'top1_agree', and the rate fields of its own sequence in the
    cache}, and 'speed': the batch's rollout's record, one dict shared by its rows,
    :class:`adapters.cache.rollout_clock.RolloutClock`). ``task`` gives the metric implementations
    (:meth:`harness.tasks.base.Task.metric`)."""
    for pid, p, pre, baseline in zip(prompt_ids, ids, _prefills(prefill, len(ids)), baselines):
        if _ids_sha(p, pre) != baseline["ids_sha"]:
            raise RuntimeError(f"prompt '{pid}': the stored baseline was made from another prompt "
                               f"(another tokenizer or haystack?); start a fresh run")
    kw = {} if prefill is None else {"prefill": list(prefill)}
    clock = RolloutClock(model.device)
    results = model.greedy(ids, max_new_tokens, cache_config, force=[b["tokens"] for b in baselines], speed=clock, **kw)
    speed, out = clock.record(), []
    for r, baseline in zip(results, baselines):
        forced = r["forced_logits"]
        row = {
            "output_match": task.metric("output_match")(r["tokens"], baseline["tokens"]),
            "length_ratio": task.metric("length_ratio")(r["tokens"], baseline["tokens"]),
            "output_tokens": len(r["tokens"]), "baseline_output_tokens": len(baseline["tokens"]),
            "kl": float(task.metric("kl")(baseline["top_ids"], baseline["top_logp"], forced).double().mean()),
            "top1_agree": float(task.metric("top1_agree")(baseline["top_ids"][:, 0], forced).double().mean()),
        }
        row.update(cache_row_stats(r["cache"].kv, r["sequence"]))  # the prompt's own tokens, as if alone
        row["speed"] = speed
        out.append((model.decode(r["tokens"]), row))
    return out
