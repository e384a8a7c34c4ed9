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


class ChunkedFirstForward:
    """``with ChunkedFirstForward(model, cache, chunk, prefill): model.generate(..., cache=cache)``: the
    forward ``generate`` makes into the empty ``cache`` with more than ``chunk`` columns is answered by
    ``prefill(x [B, t], cache, padding, pads)`` (:meth:`adapters.hf.causal_lm.CausalLM._prefill`: natively in
    chunks, then replayed into the cache, as every other rollout prefills), which returns the logits; every
    other call runs the model's own forward. ``padding``: the call's ``attention_mask`` [B, t] (left pads:
    its leading zeros), ``position_ids`` and ``logits_to_keep`` where given. The model's ``forward`` is
    replaced on the instance inside the block (its signature kept: generate reads it) and restored after."""

    def __init__(self, model, cache, chunk: int | None, prefill):
        self.model, self.cache, self.chunk, self.prefill = model, cache, chunk, prefill
        self.key = next(iter(cache_kwargs(model, cache)))
        self.prefills = 0  # forwards answered by ``prefill``

    def __enter__(self) -> "ChunkedFirstForward":
        import functools

        self._own = vars(self.model).get("forward")  # an instance's own forward (accelerate's hooks) kept
        forward = self.model.forward

        def first_in_chunks(*args, **kw):
            x = kw.get("input_ids", args[0] if args else None)
            if (self.chunk is None or kw.get(self.key) is not self.cache or not isinstance(x, torch.Tensor)
                    or x.shape[1] <= self.chunk or self.cache.get_seq_length() > 0
                    or kw.get("inputs_embeds") is not None):
                return forward(*args, **kw)
            from transformers.modeling_outputs import CausalLMOutputWithPast

            mask = kw.get("attention_mask")
            padding = {k: kw[k] for k in ("attention_mask", "position_ids", "logits_to_keep") if kw.get(k) is not None}
            pads = None if mask is None else (mask.shape[1] - mask.sum(1)).tolist()
            self.prefills += 1
            self.cache.set_padding(None)  # what attach's hook read from the mask for this call: replay takes pads
            return CausalLMOutputWithPast(logits=self.prefill(x, self.cache, padding, pads),
                                          past_key_values=self.cache)

        self.model.forward = functools.wraps(forward)(first_in_chunks)
        return self

    def __exit__(self, *exc) -> None:
        if self._own is None:
            del self.model.forward  # the class's method again
        else:
            self.model.forward = self._own
