"""The compressed KV cache inside a Hugging Face transformers model (transformers >= 5).

Two pieces, used together:

- :class:`CompressedCache`, a ``transformers.Cache`` whose layers (:class:`CompressedLayer`)
  each hold a :class:`adapters.cache.kv_cache.LayerKV`. ``update`` does not store anything: it
  parks the new (post-RoPE) keys/values and hands them to the attention function, tagged
  with their layer.
- ``kvcodec`` attention, registered through ``AttentionInterface``: it attends the queries to
  the compressed past + the native window + the new tokens themselves (causal; a prefill
  chunk therefore attends to itself natively), then appends the new tokens, so tokens enter
  the codec only as they leave the window. Native layers (codec 'none', protected layers),
  the first prefill into an empty cache (plain attention: nothing is cached yet) and untagged
  keys (a plain ``DynamicCache``) go through the model's own attention function on exactly the
  tensors a ``DynamicCache`` would hold, so 'none' reproduces the model's logits bit for bit and
  a prefill's logits do not depend on the codec.
- Sliding-window (and chunked) attention layers stay native (:mod:`adapters.hf.arch`): their
  cache layer is transformers' own (:class:`NativeSlidingLayer`), whose keys are untagged, so they
  attend exactly as with a ``DynamicCache``; what they hold is mirrored into their (codec-free)
  :class:`LayerKV`, so the cache's byte counts include it.
- Codecs that are transformers' own quantized cache (``hf-quanto``, ``hf-hqq``) store every codec layer in
  transformers' ``QuantoQuantizedLayer`` / ``HQQQuantizedLayer`` (:mod:`adapters.hf.library_layer`), whose
  keys reach the model's own attention untagged in the same way.

``with attach(model) as new_cache:`` switches the model's attention implementation to
``kvcodec`` and restores it on exit; ``new_cache(cache_config)`` builds a cache to pass to
``model(...)`` or ``model.generate(...)`` under the keyword they take (``cache=`` from transformers
5.24, ``past_key_values=`` before: :func:`adapters.hf.compat.cache_kwargs`).

Left-padded batches (sequences of different lengths): the caller passes the model a 2-D
attention mask over every column fed so far and position ids counted from each sequence's
first real token, and tells the cache before each forward which new tokens are padding
(:meth:`CompressedCache.set_padding`; inside ``attach`` a call that passes a 2-D mask and no
padding, as ``model.generate`` on a left-padded batch does, gets it from the mask's new
columns). Codec layers drop the pads and keep every sequence
left-aligned, committing exactly as for that sequence alone, so no pad enters a codec state
(nor a per-channel group of KIVI); once a batch has held pads, they read it by per-sequence
lengths, causally, and check only the size of transformers' mask (its columns are the padded
ones). Native layers keep the padded columns and the model's own masked attention, as a
``DynamicCache`` of the same batch does.
"""
from __future__ import annotations

import copy
from dataclasses import replace

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from kernels import make_codec

from adapters.hf.arch import UnservableModel, decoder_arch, geometry, refuse_padding
from adapters.hf.library_layer import is_library_layer, library_layer
from adapters.hf.prefill import chunk_bounds, chunk_pads
from adapters.hf.sliding import NativeSlidingLayer
from adapters.cache.config import CacheConfig
from adapters.cache.kv_cache import CompressedKVCache
from adapters.cache.layer_kv import LayerKV

ATTN_NAME = "kvcodec"
_NATIVE_ATTR = "_kvcodec_native_attn"  # on the model config while attached: the implementation to delegate to
_TAG = "_kvcodec_layer"  # on the key tensor that CompressedLayer.update returns


class CompressedLayer(CacheLayerMixin):
    """A transformers cache layer backed by a :class:`LayerKV`."""

    is_compileable = False
    is_croppable = False
    is_sliding = False

    def __init__(self, kv: LayerKV, layer_idx: int):
        super().__init__()
        self.kv = kv
        self.layer_idx = layer_idx
        self.pending: tuple[torch.Tensor, torch.Tensor] | None = None
        self.next_pads: list[int] | None = None  # set by CompressedCache.set_padding for the next update
        self.static = None  # a StaticKV while a graphed decode holds the layer (adapters.hf.graphed_decode)
        self._pads: list[int] | None = None  # the pending tokens' padding

    def lazy_initialization(self, key_states, value_states) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        codec = self.kv.codec
        if codec is not None and codec.device != key_states.device:
            # a model spread over GPUs (device_map): this layer runs elsewhere than model.device, so its
            # codec is built again where its keys are (the same tables: codecs draw on the CPU)
            self.kv.codec = make_codec(codec.config, device=key_states.device)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """key_states, value_states: [B, Hkv, t, d] post-RoPE, new tokens only. Returns them, the
        keys tagged with this layer; the ``kvcodec`` attention attends and then appends them."""
        if self.pending is not None:
            raise RuntimeError(
                f"layer {self.layer_idx}: the previous step's keys were never attended. The model's attention "
                f"implementation is not '{ATTN_NAME}': use a CompressedCache inside `with attach(model):`"
            )
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.pending = (key_states, value_states)
        self._pads, self.next_pads = self.next_pads, None
        if self._pads is not None and len(self._pads) != key_states.shape[0]:
            raise ValueError(f"layer {self.layer_idx}: padding given for {len(self._pads)} sequences, "
                             f"the batch has {key_states.shape[0]}")
        setattr(key_states, _TAG, self)
        return key_states, value_states

    def attend_and_commit(self, query: torch.Tensor, mask: torch.Tensor | None, scaling: float,
                          softcap: float | None = None) -> torch.Tensor:
        """query [B, Hq, Tq, d] -> attention output [B, Hq, Tq, d]; then the new tokens are appended."""
        k, v = self.pending
        self.pending = None
        if self.kv.padded or (self._pads is not None and any(self._pads)):  # by lengths, not the padded mask
            out = self.kv.attend(query, scale=scaling, k_new=k, v_new=v, causal=True, pads=self._pads,
                                 softcap=softcap)
        else:
            out = self.kv.attend(query, scale=scaling, mask=mask, k_new=k, v_new=v, causal=mask is None,
                                 softcap=softcap)
        self.kv.append(k, v, self._pads)
        return out

    def native_kv(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Append the new tokens and return the keys/values to attend natively [B, Hkv, T, d]: for a
        native layer the whole history (the same concatenation a DynamicCache makes), for a codec
        layer's first prefill the new tokens themselves (the codec commits after the append)."""
        k, v = self.pending
        self.pending = None
        # stored contiguous, as a DynamicCache stores them (and a shared prefill replays them): a
        # window kept in the projection's transposed layout is read with other rounding in a batch
        k, v = k.contiguous(), v.contiguous()
        self.kv.append(k, v, self._pads)
        codec = self.kv.codec
        if codec is not None:  # the first prefill of a codec layer (which has just committed)
            if codec.stores_before_attending(0):  # an engine that writes its cache first attends it as stored
                return codec.decode(codec.encode(k)), codec.decode_values(codec.encode_values(v))
            return k, v
        return self.kv.window_k, self.kv.window_v  # no codec: nothing commits, the window is the history

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    def get_seq_length(self) -> int:
        return self.kv.columns  # pads included: what the model's masks and positions count

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        raise NotImplementedError("a CompressedCache cannot be reset: build a new one per rollout")

    def reorder_cache(self, beam_idx) -> None:
        raise NotImplementedError("beam search is not supported with a compressed KV cache (use greedy or sampling)")

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("a compressed KV cache cannot be cropped (assisted generation is not supported)")

    def batch_repeat_interleave(self, repeats: int) -> None:
        if repeats != 1:
            raise NotImplementedError("num_return_sequences > 1 is not supported with a compressed KV cache")

    def batch_select_indices(self, indices) -> None:
        raise NotImplementedError("batch selection is not supported with a compressed KV cache")

    def offload(self):  # the cache lives where the model runs
        pass

    def prefetch(self):
        pass


class CompressedCache(Cache):
    """The KV cache of a transformers causal LM: one :class:`CompressedLayer` per full-attention
    decoder layer, a :class:`NativeSlidingLayer` per sliding-window one (:mod:`adapters.hf.arch`).

    ``cache.kv`` is the underlying :class:`CompressedKVCache` (byte counts, ``stats()``); its
    sliding-window layers are native layers (no codec) holding what the model's window keeps.
    """

    def __init__(self, model_config, cache_config: CacheConfig, device="cpu"):
        self.arch = decoder_arch(model_config)  # first: refuses what one geometry cannot describe
        n_layers, n_kv, head_dim = geometry(model_config)
        native = set(self.arch.native)
        if native and len(native) == n_layers and cache_config.codec != "none":
            raise UnservableModel(
                f"every layer of this '{self.arch.model_type}' model attends through a sliding window "
                f"({sorted(set(self.arch.windows))[0]} tokens), which stays native: there is nothing for codec "
                f"'{cache_config.codec}' to compress")
        kv_config = cache_config
        if native:  # sliding layers get no codec: protected, like layers the run keeps native
            kv_config = replace(cache_config, protect=sorted(cache_config.protected_layers(n_layers) | native))
        self.kv = CompressedKVCache(kv_config, n_layers, n_kv, head_dim, device=device)
        super().__init__(layers=[self._layer(i) for i in range(n_layers)])
        self.cache_config = cache_config

    def _layer(self, i: int) -> CacheLayerMixin:
        w = self.arch.windows[i]
        if w is not None:
            return NativeSlidingLayer(self.kv[i], w)
        codec = self.kv[i].codec
        if codec is not None and hasattr(codec, "transformers_cache_config"):  # stored by transformers itself
            return library_layer(self.kv[i], codec)
        return CompressedLayer(self.kv[i], i)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        """key_states/value_states [B, Hkv, t, d] of layer ``layer_idx``, checked against the geometry
        the cache was built for (read from the config) before they reach the layer."""
        self._check_geometry(layer_idx, key_states, value_states)
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)

    def _check_geometry(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor) -> None:
        want = (self.kv.num_kv_heads, self.kv.head_dim)
        if (k.shape[1], k.shape[-1]) != want or v.shape[-1] != k.shape[-1]:
            raise UnservableModel(
                f"layer {layer_idx} caches keys {tuple(k.shape)} and values {tuple(v.shape)} ([B, Hkv, t, d]); its "
                f"config gives {want[0]} KV heads of width {want[1]}, the geometry the compressed cache was built for")

    def fork(self) -> "CompressedCache":
        """An independent copy after, e.g., a shared prefill (codecs and encoded states are shared)."""
        other = CompressedCache.__new__(CompressedCache)
        other.__dict__.update(self.__dict__)
        other.kv = self.kv.fork()
        other.layers = []
        for i, old in enumerate(self.layers):
            if not isinstance(old, CompressedLayer):  # transformers' own: never written in place, share them
                new = copy.copy(old)
                new.kv = other.kv[i]
            else:
                new = CompressedLayer(other.kv[i], i)
                new.is_initialized = old.is_initialized
                if old.is_initialized:
                    new.dtype, new.device = old.dtype, old.device
            other.layers.append(new)
        return other

    def stats(self) -> dict:
        return self.kv.stats()

    def repeat_batch(self, n: int) -> None:
        """Each sequence repeated ``n`` times in place (b -> b n .. b n + n - 1): a batch-1 cache made a
        batch of n (throughput measurements). Sliding-window layers repeat transformers' own tensors
        too (its ``batch_repeat_interleave``), then mirror them into the byte counts again."""
        if any(is_library_layer(layer) for layer in self.layers):
            raise NotImplementedError("transformers' quantized cache cannot repeat its batch")
        self.kv.repeat_batch(n)
        for layer in self.layers:
            if isinstance(layer, NativeSlidingLayer) and layer.is_initialized:
                layer.batch_repeat_interleave(n)
                layer._mirror()

    def set_padding(self, pads: list[int] | None) -> None:
        """For the next forward only: sequence b's first ``pads[b]`` new tokens are padding (a
        left-padded batch; None: every token is real). Codec layers drop them (module docstring);
        A model with sliding-window layers takes no padding (:func:`refuse_padding`)."""
        if pads is not None and any(pads):
            refuse_padding(self.arch.native)
        for layer in self.layers:
            if isinstance(layer, CompressedLayer):
                layer.next_pads = None if pads is None else [int(p) for p in pads]

    def replay(self, layer_idx: int, native: CacheLayerMixin, pads: list[int] | None = None,
               chunk: int | None = None) -> None:
        """Fill an empty layer from ``native``, a ``DynamicCache`` layer after a prefill computed
        elsewhere by plain attention: a compressed layer appends its keys/values [B, Hkv, t, d] (what
        the ``kvcodec`` attention does after a live first prefill; ``pads`` as :meth:`set_padding`
        takes them), a sliding layer takes its state. ``chunk``: a codec layer appends ``chunk`` columns
        at a time (its encode temporaries a chunk's, not the layer's), committing exactly what one
        append commits (:meth:`adapters.cache.layer_kv.LayerKV.append`: tokens leave the window in whole
        codec blocks either way); a native layer takes the whole tensor (nothing to encode)."""
        if pads is not None and any(pads):
            refuse_padding(self.arch.native)
        layer = self.layers[layer_idx]
        if layer.kv.columns or getattr(layer, "pending", None) is not None:
            raise RuntimeError(f"layer {layer_idx}: replay needs an empty cache layer")
        self._check_geometry(layer_idx, native.keys, native.values)
        if not isinstance(layer, CompressedLayer):  # transformers' own layer takes the prefill itself
            layer.load(native)
            return
        k, v = native.keys, native.values
        if not layer.is_initialized:
            layer.lazy_initialization(k, v)
        t = k.shape[-2]
        if layer.kv.codec is None or layer.kv.config.residual_unit != "token":
            chunk = None  # nothing to encode, or a window of whole appends: one append
        bounds = chunk_bounds(t, chunk)
        if len(bounds) == 1:
            layer.kv.append(k, v, pads)
            return
        layer.kv.reserve_commits([t - (pads[b] if pads else 0) for b in range(k.shape[0])])  # one growth
        for s, e in bounds:
            layer.kv.append(k[..., s:e, :], v[..., s:e, :], chunk_pads(pads, s, e))
