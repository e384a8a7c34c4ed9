"""A layer of a :class:`adapters.hf.cache.CompressedCache` stored by transformers' own quantized cache
(codecs ``hf-quanto`` and ``hf-hqq``, :mod:`kernels.engines.hf_quantized`): :func:`library_layer` builds
transformers' ``QuantoQuantizedLayer`` / ``HQQQuantizedLayer``, unchanged (its residual window, its
flushes that quantize the whole history again, the real optimum-quanto and HQQ arithmetic), and mirrors
what it holds into the layer's :class:`LayerKV` so the cache's byte counts are the library's bytes.

Like a sliding-window layer's, its keys reach the attention untagged: the model's own attention reads
what the layer returns (dequantized history, residual, new tokens), exactly as in plain transformers
with ``cache_implementation="quantized"``.
"""
from __future__ import annotations

import torch
from transformers.cache_utils import HQQQuantizedLayer, QuantoQuantizedLayer

from adapters.cache.layer_kv import LayerKV


def _quantized_nbytes(state) -> int:
    """Bytes of one quantized tensor as the library holds it: optimum-quanto's packed data, scale and
    shift; HQQ's packed codes and its float scale and zero (a (codes, meta) pair)."""
    if state is None:
        return 0
    if isinstance(state, tuple):
        codes, meta = state
        tensors = [codes] + [v for v in meta.values() if torch.is_tensor(v)]
    else:
        data = state._data
        tensors = [getattr(data, "_data", data), state._scale, state._shift]
    return sum(t.numel() * t.element_size() for t in tensors)


class _Mirrored:
    """transformers' quantized layer, mirrored into ``kv`` after each update."""

    def __init__(self, kv: LayerKV, **options):
        super().__init__(**options)
        self.kv = kv

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        out = super().update(key_states, value_states, *args, **kwargs)
        self._mirror(key_states)
        return out

    def load(self, other) -> None:
        """Take a prefill computed elsewhere (a ``DynamicCache`` layer): the first update of an empty layer
        quantizes the prompt at once and returns it unquantized, as a live prefill does."""
        self.update(other.keys, other.values)

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise NotImplementedError("transformers' quantized cache layer cannot repeat its batch")

    def _mirror(self, like: torch.Tensor) -> None:
        residual = self.keys.shape[-2] if self.keys.dim() == 4 else 0
        B, H, _, d = like.shape
        quantized = self.cumulative_length - residual
        self.kv.hold_library((_quantized_nbytes(self._quantized_keys), _quantized_nbytes(self._quantized_values)),
                             B, quantized, residual, 2 * H * d * like.element_size())


class MirroredQuanto(_Mirrored, QuantoQuantizedLayer):
    pass


class MirroredHQQ(_Mirrored, HQQQuantizedLayer):
    pass


def library_layer(kv: LayerKV, codec):
    """transformers' quantized cache layer for ``codec`` (one with ``transformers_cache_config()``)."""
    options = dict(codec.transformers_cache_config())
    backend = options.pop("backend")
    return (MirroredQuanto if backend == "quanto" else MirroredHQQ)(kv, **options)


def is_library_layer(layer) -> bool:
    return isinstance(layer, _Mirrored)
