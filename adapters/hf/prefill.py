"""A prompt's prefill in pieces: its first forward, chunk by chunk through a native cache.

A prefill in one piece runs the whole prompt through each layer at once: its activations scale with
the prompt (a million tokens through Qwen2.5-7B's MLP is a 38 GB intermediate alone). Chunked, it keeps
the prefill's meaning: the prompt's tokens attend to each other natively, and only then does a cache
commit them. Chunk i runs through a transformers ``DynamicCache`` holding chunks < i exactly as computed,
so it reads them and itself causally, as the whole prompt's forward does (the same numbers to float
rounding: other matmul shapes); a left-padded batch gets each chunk's columns of the attention mask (every
column up to the chunk's end) and of the position ids. The native layers are then replayed into the
rollout's cache (:meth:`adapters.hf.cache.CompressedCache.replay`, in pieces of the same size, so a codec
encodes a chunk at a time, never a whole layer's float32 temporaries), as a shared prefill is
(:mod:`adapters.cache.shared_prefill`).

``chunk`` None (or a prompt no longer than it) is the one-piece prefill, unchanged.
"""
from __future__ import annotations

import torch

from adapters.hf.compat import cache_kwargs


def chunk_bounds(t: int, chunk: int | None) -> list[tuple[int, int]]:
    """[(start, end)] of the pieces of a ``t``-column prefill: one piece where ``chunk`` is None or >= t."""
    if chunk is not None and chunk < 1:
        raise ValueError(f"a prefill chunk must be >= 1 token, got {chunk}")
    step = t if chunk is None or chunk >= t else chunk
    return [(s, min(s + step, t)) for s in range(0, t, step)]


def chunk_pads(pads: list[int] | None, start: int, end: int) -> list[int] | None:
    """The left pads of columns [start, end) of a step whose sequence b opens with ``pads[b]`` pads."""
    if pads is None:
        return None
    return [min(max(p - start, 0), end - start) for p in pads]


def native_prefill(model, x: torch.Tensor, padding: dict, chunk: int | None = None) -> tuple[list, torch.Tensor]:
    """x [B, t] into a fresh ``DynamicCache``, ``chunk`` columns at a time (None: one piece).

    ``padding``: :meth:`adapters.cache.padded_batch.LeftPadded.step`'s keywords for the whole step
    (``attention_mask`` [B, t], ``position_ids`` [B, t], or none), plus ``logits_to_keep`` where only the
    last column's logits are wanted. Returns (the cache's layers, the logits [B, t or 1, V] float32): every
    chunk's logits in order, or with ``logits_to_keep`` the last chunk's last column (the others keep one
    column each, dropped)."""
    from transformers import DynamicCache

    native = DynamicCache(config=model.config)
    kwargs = cache_kwargs(model, native)
    keep_last = "logits_to_keep" in padding
    mask, positions = padding.get("attention_mask"), padding.get("position_ids")
    bounds = chunk_bounds(x.shape[1], chunk)
    out = []
    for s, e in bounds:
        step = {k: v for k, v in padding.items() if k not in ("attention_mask", "position_ids", "logits_to_keep")}
        if mask is not None:
            step["attention_mask"] = mask[:, :e]  # every column so far: earlier chunks are in the cache
        if positions is not None:
            step["position_ids"] = positions[:, s:e]
        if keep_last:  # one column from each chunk (the model cannot skip its head): the last chunk's is kept
            step["logits_to_keep"] = 1
        logits = model(x[:, s:e], **kwargs, use_cache=True, **step).logits.float()
        if not keep_last or (s, e) == bounds[-1]:
            out.append(logits)
    return list(native.layers), out[0] if len(out) == 1 else torch.cat(out, 1)
