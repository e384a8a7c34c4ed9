"""Whether, and how, a transformers decoder is served behind the compressed cache.

We serve a causal decoder whose attention goes through transformers' attention interface (the
``kvcodec`` attention of :mod:`adapters.hf.cache` is plugged in there) over plain per-token keys
and values of one width: Llama, Qwen2/3, Mistral, Phi-3, Gemma 2/3 and the many alike. Per layer
(``config.layer_types``, else inferred from ``sliding_window`` as transformers' own cache does):

- full attention: through the compressed cache;
- sliding-window or chunked attention (Mistral, Qwen2 with ``use_sliding_window``, every other
  Gemma 2 layer, five of six Gemma 3 layers, Llama 4's chunked layers): kept native, in
  transformers' own cache layer for it, so it attends to exactly what a ``DynamicCache`` holds.
  Its window already bounds its memory; its bytes count in the cache's statistics as native.

:func:`servable` checks a loaded model, or a config before any weight is read, and returns its
:class:`Arch`; what cannot be served raises :class:`UnservableModel`, one line naming why.
:func:`attention_softcap` checks each call of the ``kvcodec`` attention: an argument the
compressed attention cannot honour raises instead of being ignored.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

#: layer types whose keys and values we cache: full attention is compressed, the others stay native
NATIVE_TYPES = {"sliding_attention": "sliding", "chunked_attention": "chunked"}
SERVED_TYPES = ("full_attention", *NATIVE_TYPES)
#: why a layer type cannot be served (transformers' cache layer types, cache_utils.DYNAMIC_LAYER_TYPE_MAPPING)
_UNSERVED_TYPES = {
    "linear_attention": "recurrent (state-space / linear-attention) layers, whose state is not a key-value cache",
    "conv": "convolution layers with a recurrent state, not a key-value cache",
    "hybrid": "hybrid layers (attention plus a recurrent state)",
    "hybrid_sliding": "hybrid layers (sliding attention plus a recurrent state)",
    "dummy": "layers that keep no cache of their own (keys and values shared with another layer, or no attention)",
    "indexed_attention": "sparse attention over an indexed cache",
    "compressed_sparse_attention": "compressed sparse attention layers",
    "heavily_compressed_attention": "heavily compressed attention layers",
}
#: attention-call arguments that do not change what attention computes (RoPE is applied before the call)
_HARMLESS = frozenset({"position_ids", "use_cache", "output_attentions", "output_hidden_states",
                       "output_router_logits", "num_items_in_batch"})
_CHECKED = frozenset({"sliding_window", "softcap", "s_aux", "is_causal"})


class UnservableModel(ValueError):
    """A model the compressed cache cannot serve; the message is one line naming why."""


@dataclass(frozen=True)
class Arch:
    """What the compressed cache makes of a decoder. ``windows[i]``: the window (tokens) of layer i
    when it stays native (sliding / chunked attention), None when it goes through the codec."""

    model_type: str
    layer_types: tuple[str, ...]
    windows: tuple[int | None, ...]

    @property
    def native(self) -> tuple[int, ...]:
        """Indices of the layers kept native because of their attention pattern."""
        return tuple(i for i, w in enumerate(self.windows) if w is not None)

    def native_layers(self) -> dict[str, list[int]]:
        """For ``describe()``: {'sliding': [...], 'chunked': [...]} of the layers kept native; {} if none."""
        out: dict[str, list[int]] = {}
        for i in self.native:
            out.setdefault(NATIVE_TYPES[self.layer_types[i]], []).append(i)
        return out


def _fail(config, why: str, cls: type | None = None) -> UnservableModel:
    name = f"'{getattr(config, 'model_type', '') or type(config).__name__}'"
    if cls is not None:
        name += f" ({cls.__name__})"
    return UnservableModel(f"model type {name} cannot be served behind the compressed KV cache: {why}")


def decoder_arch(config) -> Arch:
    """The :class:`Arch` of a transformers config, from the config alone (cheap: every cache
    construction asks). Raises :class:`UnservableModel` for an encoder-decoder, a non-causal
    decoder, multi-head latent attention, a layer type other than full / sliding / chunked
    attention (state-space, hybrid, shared-KV, sparse-indexed layers), or layers whose keys and
    values differ in geometry (one cache geometry serves every layer)."""
    from transformers.cache_utils import get_layer_types_and_kwargs

    if getattr(config, "is_encoder_decoder", False):
        raise _fail(config, "it is an encoder-decoder model; only decoder-only models are served")
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    if getattr(text, "is_causal", True) is False:
        raise _fail(config, "its attention is bidirectional (config.is_causal is False)")
    if getattr(text, "kv_lora_rank", None) is not None:
        raise _fail(config, f"it uses multi-head latent attention (kv_lora_rank={text.kv_lora_rank}): its keys and "
                            f"values differ in width, which the cache's codecs do not take")
    types, kwargs = get_layer_types_and_kwargs(text)
    types = list(types)  # may be the config's own list
    if isinstance(kwargs, dict):  # transformers before 5.23: one dict for every layer
        kwargs = [kwargs] * len(types)
    if len(types) != text.num_hidden_layers:  # transformers before 5.23 drops the layers that share keys/values
        types += ["dummy"] * (text.num_hidden_layers - len(types))
    for t in dict.fromkeys(types):
        if t not in SERVED_TYPES:
            layers = [i for i, u in enumerate(types) if u == t]
            why = _UNSERVED_TYPES.get(t, f"layers of type '{t}'")
            raise _fail(config, f"it has {why} ('{t}': layers {_span(layers)}); the compressed cache serves "
                                f"{', '.join(SERVED_TYPES)} layers")
    # (KV heads, head_dim) of each layer (transformers before 5.23: one config for all)
    shapes = [_kv_geometry(c) for c in getattr(text, "per_layer_config", None) or [text]]
    if len(set(shapes)) > 1:
        where = "; ".join(f"{g} in layers {_span([i for i, h in enumerate(shapes) if h == g])}"
                          for g in dict.fromkeys(shapes))
        raise _fail(config, f"its layers differ in key/value geometry (KV heads, head_dim): {where}; one cache "
                            f"geometry serves every layer")
    windows = tuple(int(kw["sliding_window"]) if t in NATIVE_TYPES else None for t, kw in zip(types, kwargs))
    return Arch(getattr(config, "model_type", ""), tuple(types), windows)


def servable(model_or_config) -> Arch:
    """Check that a transformers causal LM (a loaded model, or its config: then before any weight
    is read) can be served behind the compressed cache; return its :class:`Arch`.

    On top of :func:`decoder_arch`: the model class must route attention through transformers'
    attention interface (``_supports_attention_backend``), and its decoder's attention modules
    must be causal and free of learned attention sinks (gpt-oss). A config is checked on a
    skeleton of the model built on the meta device (no memory, no weights)."""
    if isinstance(model_or_config, torch.nn.Module):
        model = model_or_config
        config, cls = model.config, type(model)
    else:
        config, model = model_or_config, None
        cls = _causal_lm_class(config)
    arch = decoder_arch(config)
    if not (cls._supports_attention_backend and cls._can_set_attn_implementation()):
        raise _fail(config, f"its attention does not go through transformers' attention interface "
                            f"({cls.__name__}._supports_attention_backend is False)", cls)
    if model is None:
        try:
            with torch.device("meta"):
                model = cls(copy.deepcopy(config))
        except Exception as e:  # noqa: BLE001 (the model cannot be built: say so in one line)
            raise _fail(config, f"it cannot be built from its config ({type(e).__name__}: {e})", cls) from None
    text = model.config.get_text_config(decoder=True)
    for m in model.modules():
        if getattr(m, "config", None) is not text:  # the decoder's own modules (not a vision tower's)
            continue
        if isinstance(getattr(m, "sinks", None), torch.Tensor):
            raise _fail(config, f"its attention ({type(m).__name__}) adds learned attention sinks, which the "
                                f"compressed attention does not implement", cls)
        if getattr(m, "is_causal", True) is False:
            raise _fail(config, f"its attention module {type(m).__name__} is not causal (bidirectional or "
                                f"cross-attention)", cls)
    return arch


def attention_softcap(module, dropout: float, kwargs: dict) -> float | None:
    """Check one call of the ``kvcodec`` attention through a compressed-cache layer; return the
    logit soft-cap to apply (``softcap``: Gemma 2), or None. What the compressed attention cannot
    honour (a sliding window on a layer the config calls full attention, attention sinks,
    non-causal attention, dropout, packed sequences, an argument it does not know) raises
    :class:`UnservableModel`."""
    where = f"layer {getattr(module, 'layer_idx', '?')} ({type(module).__name__})"
    window = kwargs.get("sliding_window")  # what the attention function is told (a module attribute may not be)
    if window is not None:
        raise UnservableModel(f"{where} attends through a sliding window of {window} tokens, but the model's config "
                              f"(layer_types / sliding_window) makes it a full-attention layer of the cache")
    if kwargs.get("s_aux") is not None:
        raise UnservableModel(f"{where} adds learned attention sinks (s_aux), which the compressed attention does "
                              f"not implement")
    if kwargs.get("is_causal") is False or getattr(module, "is_causal", True) is False:
        raise UnservableModel(f"{where} is not causal; the compressed cache serves causal attention only")
    if dropout:
        raise UnservableModel(f"{where} applies attention dropout {dropout} (training mode): call model.eval()")
    unknown = sorted(k for k, v in kwargs.items() if v is not None and k not in _HARMLESS and k not in _CHECKED)
    if unknown:
        raise UnservableModel(f"{where} passes {', '.join(unknown)} to its attention function, which the compressed "
                              f"attention does not implement")
    return kwargs.get("softcap")


def geometry(config) -> tuple[int, int, int]:
    """(num_layers, num_kv_heads, head_dim) of a transformers decoder config (every layer's: see
    :func:`decoder_arch`)."""
    c = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    return c.num_hidden_layers, *_kv_geometry(c)


def _kv_geometry(c) -> tuple[int, int]:
    """(KV heads, head_dim) of one layer's config."""
    heads = c.num_attention_heads
    return getattr(c, "num_key_value_heads", None) or heads, getattr(c, "head_dim", None) or c.hidden_size // heads


def _causal_lm_class(config) -> type:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    try:
        return MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    except KeyError:
        raise _fail(config, "transformers has no causal-LM class for it (AutoModelForCausalLM)") from None


def _span(idx: list[int]) -> str:
    return ", ".join(map(str, idx)) if len(idx) <= 6 else f"{', '.join(map(str, idx[:6]))}, ... ({len(idx)} in all)"


def refuse_padding(sliding_layers) -> None:
    """Raise where a left-padded batch cannot give every prompt its own numbers: a model whose
    sliding-window layers stay native (their window counts columns, pads included, and keeps the
    last window - 1 of them; a pad between a sequence's tokens pushes real tokens out)."""
    if sliding_layers:
        raise ValueError(f"this model's sliding-window layers {sorted(sliding_layers)} stay native, and a native "
                         f"window counts pad columns, so a left-padded batch would not give each prompt the numbers "
                         f"it gets alone; run it with --batch-size 1 (lm-eval: batch_size=1), or batch prompts of "
                         f"one length")
