"""Attaching a model to the compressed cache: :func:`attach` routes its attention through
:func:`kvcodec_attention_forward` (transformers' attention interface, registered as ``kvcodec``), which
reads a :class:`adapters.hf.cache.CompressedLayer`'s tagged keys from the cache and hands every other call
(a plain ``DynamicCache``, a native sliding layer, a first prefill) to the model's own attention."""
from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Callable, Iterator

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from adapters.hf.arch import attention_softcap, servable
from adapters.hf.cache import _NATIVE_ATTR, _TAG, ATTN_NAME, CompressedCache, CompressedLayer
from adapters.hf.compat import cache_kwargs, check_transformers, passed_cache
from adapters.hf.lower_right import chunk_mask, lower_right
from adapters.cache.config import CacheConfig
from adapters.cache.padded_batch import pads_from_mask


def kvcodec_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                              attention_mask: torch.Tensor | None, scaling: float | None = None,
                              dropout: float = 0.0, **kwargs) -> tuple[torch.Tensor, None]:
    """The ``kvcodec`` attention implementation. query [B, Hq, Tq, d]; key/value [B, Hkv, t, d] (new
    tokens, tagged by :class:`CompressedLayer`, or a plain cache's full keys). Returns [B, Tq, Hq, d]."""
    layer: CompressedLayer | None = getattr(key, _TAG, None)
    if layer is None:  # not our cache, or a native sliding layer: plain attention, as the model would do it
        return _native_attention(module)(module, query, key, value, attention_mask, scaling=scaling,
                                         dropout=dropout, **kwargs)
    softcap = attention_softcap(module, dropout, kwargs)  # raises on what the compressed attention cannot honour
    if layer.static is not None:  # a graphed decode step: static buffers, lengths on the device
        (k, v), layer.pending = layer.pending, None
        out = layer.static.step(query, k, v, query.shape[-1] ** -0.5 if scaling is None else scaling, softcap)
        return out.transpose(1, 2).contiguous(), None
    if layer.kv.codec is None or layer.kv.columns == 0:  # a native layer (bit-identical to the model's own path),
        k, v = layer.native_kv()  # or the first prefill: nothing cached yet, so plain (native) attention
        return _native_attention(module)(module, query, k, v, attention_mask, scaling=scaling, dropout=dropout,
                                         **kwargs)
    if attention_mask is not None and attention_mask.dim() == 4 and attention_mask.shape[-1] != layer.kv.columns + key.shape[-2]:
        raise ValueError(f"attention mask covers {attention_mask.shape[-1]} keys, the cache holds "
                         f"{layer.kv.columns + key.shape[-2]} columns")
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    out = layer.attend_and_commit(query, attention_mask, scaling, softcap=softcap)
    return out.transpose(1, 2).contiguous(), None


def _native_attention(module) -> Callable:
    """The model's own attention function, called with the masks sdpa gets (see ``_register``)."""
    if getattr(module.config, _NATIVE_ATTR, "sdpa") != "eager":  # a chunk's None mask: lower-right causal
        return lower_right(ALL_ATTENTION_FUNCTIONS["sdpa"])
    eager = sys.modules[type(module).__module__].eager_attention_forward  # eager lives in each modeling file

    def eager_with_sdpa_mask(module, query, key, value, mask, **kw):
        # sdpa masks are None (causal) or boolean (True = keep); eager adds a float mask
        Tq, T = query.shape[-2], key.shape[-2]
        if mask is None:
            mask = torch.arange(T, device=query.device) <= torch.arange(T - Tq, T, device=query.device)[:, None]
        if mask.dtype == torch.bool:
            mask = torch.zeros(mask.shape, dtype=query.dtype, device=query.device).masked_fill(
                ~mask, torch.finfo(query.dtype).min)
        return eager(module, query, key, value, mask, **kw)

    return eager_with_sdpa_mask


def _register() -> None:
    if ATTN_NAME not in ALL_ATTENTION_FUNCTIONS.valid_keys():
        AttentionInterface.register(ATTN_NAME, kvcodec_attention_forward)
        # the masks sdpa gets: None where sdpa would use is_causal, or for a causal chunk against its whole prefix
        # (adapters.hf.lower_right), else a boolean [B, 1, Tq, T] (True = keep)
        AttentionMaskInterface.register(ATTN_NAME, chunk_mask)


@contextmanager
def attach(model) -> Iterator[Callable[[CacheConfig], CompressedCache]]:
    """Route ``model``'s attention through the compressed cache; restore the model on exit.

    Yields ``new_cache(cache_config) -> CompressedCache``. Inside the block a plain
    ``DynamicCache`` (or no cache) still runs the model's own attention, unchanged. A model the
    cache cannot serve (:func:`adapters.hf.arch.servable`, a forward that takes no cache, a
    transformers release below the tested range) raises ``UnservableModel`` first.
    """
    servable(model)  # one line naming why not, before the model is touched
    check_transformers()
    cache_kwargs(model, None)  # a forward that takes no cache is refused here, not silently left empty
    _register()
    config = model.config
    original = config._attn_implementation
    if original == ATTN_NAME:
        raise RuntimeError("this model is already attached to a compressed cache")
    native = "eager" if original == "eager" else "sdpa"  # flash / flex models run native layers through sdpa
    model.set_attn_implementation(ATTN_NAME)
    for sub in _configs(model):
        setattr(sub, _NATIVE_ATTR, native)
    hook = model.register_forward_pre_hook(_padding_from_mask, with_kwargs=True)
    try:
        yield lambda cache_config: CompressedCache(model.config, cache_config, device=model.device)
    finally:
        hook.remove()
        for sub in _configs(model):
            if hasattr(sub, _NATIVE_ATTR):
                delattr(sub, _NATIVE_ATTR)
        model.set_attn_implementation(original)


def _padding_from_mask(module, args, kwargs) -> None:
    """Forward pre-hook while attached: a call with a :class:`CompressedCache`, a 2-D attention mask
    and no padding given (``model.generate`` on a left-padded batch) tells the cache the new tokens'
    padding, read from the mask's last t columns (which must be zeros, then ones)."""
    cache, mask = passed_cache(kwargs), kwargs.get("attention_mask")
    if not isinstance(cache, CompressedCache) or mask is None or mask.dim() != 2:
        return
    if any(getattr(layer, "next_pads", None) is not None for layer in cache.layers):
        return  # the caller said it
    tokens = next((x for x in (kwargs.get("input_ids"), kwargs.get("inputs_embeds"), *args[:1]) if x is not None), None)
    pads = None if tokens is None else pads_from_mask(mask, tokens.shape[1])
    if pads is not None:
        cache.set_padding(pads)


def _configs(model) -> list:
    """Every distinct config object the model's attention modules read."""
    seen, out = set(), []
    for m in model.modules():
        c = getattr(m, "config", None)
        if c is not None and id(c) not in seen:
            seen.add(id(c))
            out.append(c)
    return out


@contextmanager
def attached(model, cache_config: CacheConfig) -> Iterator[Callable[[], CompressedCache]]:
    """:func:`attach` for one cache configuration: yields a zero-argument factory of its caches."""
    with attach(model) as new_cache:
        yield lambda: new_cache(cache_config)
