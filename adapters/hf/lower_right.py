"""A chunk's causal attention to its whole prefix, with no mask in memory.

A prefill in pieces (:mod:`adapters.hf.prefill`) runs chunk i's ``c`` queries against every key before
them and itself: the last ``c`` of ``T`` positions, a causal mask aligned to the lower right. transformers
builds that mask as a boolean tensor [B, 1, c, T] (``sdpa_mask`` skips it only where ``c`` is 1 or ``T``),
which at a million tokens is ``c`` megabytes per query row block (8 GiB for a 8,192-token chunk) and keeps
SDPA off its flash kernel. Here the mask interface answers None for exactly that pattern (causal, no
padding, no sliding window or chunked overlay, the queries the last positions), and the native attention
then asks SDPA for ``causal_lower_right(c, T)``: the same keys kept, computed by the flash kernel
(measured on an H200 at 331-351 TFLOP/s against 256-285 with the materialized mask). The compressed
attention already reads a None mask as lower-right causal (:meth:`adapters.cache.layer_kv.LayerKV.attend`).
"""
from __future__ import annotations

import functools

from typing import Callable

import torch
from torch.nn.attention.bias import causal_lower_right
from transformers.masking_utils import causal_mask_function, sdpa_mask


def _all_kept(mask: torch.Tensor | None, kv_length: int, kv_offset: int) -> bool:
    """True when a 2-D padding mask [B, >= kv_offset + kv_length] keeps every key column the step reads."""
    if mask is None:
        return True
    if mask.shape[-1] < kv_offset + kv_length:  # sdpa_mask pads a short mask with masked columns
        return False
    return bool(mask[:, kv_offset:kv_offset + kv_length].all())


def chunk_mask(batch_size: int, q_length: int, kv_length: int, q_offset=0, kv_offset: int = 0,
               mask_function: Callable = causal_mask_function, attention_mask: torch.Tensor | None = None,
               local_size: int | None = None, allow_is_causal_skip: bool = True, **kwargs) -> torch.Tensor | None:
    """transformers' ``sdpa_mask``, but None for a plain causal chunk of ``q_length`` > 1 queries that are the
    last of ``kv_length`` keys with nothing padded (the pattern :func:`attend_lower_right` computes). Returns a
    boolean [B, 1, q_length, kv_length] (True = keep) or None, as ``sdpa_mask`` does."""
    plain = (allow_is_causal_skip and mask_function is causal_mask_function and local_size is None
             and 1 < q_length < kv_length and isinstance(q_offset, int) and isinstance(kv_offset, int)
             and q_offset + q_length == kv_offset + kv_length and not torch.compiler.is_compiling())
    if plain and _all_kept(attention_mask, kv_length, kv_offset):
        return None
    mask = sdpa_mask(batch_size, q_length, kv_length, q_offset, kv_offset, mask_function, attention_mask,
                     local_size, allow_is_causal_skip, **kwargs)
    if mask is None and 1 < q_length < kv_length:
        # transformers' own None for fewer queries than keys means upper-left causal (the prefill of an empty
        # static cache) or no mask at all; every reader of this interface takes None as lower-right: spell it out
        mask = sdpa_mask(batch_size, q_length, kv_length, q_offset, kv_offset, mask_function, attention_mask,
                         local_size, False, **{**kwargs, "allow_is_bidirectional_skip": False})
    return mask


@functools.lru_cache(maxsize=None)  # one wrapper per attention function, not one per layer and call
def lower_right(sdpa: Callable) -> Callable:
    """transformers' sdpa attention function ``sdpa`` with a None mask for fewer queries than keys read as
    lower-right causal (:func:`chunk_mask`'s pattern); any other call goes to ``sdpa`` unchanged.
    query [B, Hq, c, d], key/value [B, Hkv, T, d] -> [B, c, Hq, d], as ``sdpa`` returns."""

    def attend(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        c, t = query.shape[-2], key.shape[-2]
        causal = kwargs.get("is_causal")
        causal = getattr(module, "is_causal", True) if causal is None else causal  # transformers' own rule
        # a soft cap goes on to transformers' sdpa, which refuses it in one line
        if attention_mask is not None or not 1 < c < t or not causal or kwargs.get("softcap") is not None:
            return sdpa(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
        out = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=causal_lower_right(c, t), dropout_p=dropout if module.training else 0.0,
            scale=scaling, enable_gqa=query.shape[1] != key.shape[1])
        return out.transpose(1, 2).contiguous(), None

    return attend
