"""A sliding-window (or chunked) attention layer of a :class:`adapters.hf.cache.CompressedCache`:
:class:`NativeSlidingLayer`, transformers' own cache layer, kept native and mirrored into the cache's
byte counts."""
from __future__ import annotations

import torch
from transformers.cache_utils import DynamicSlidingWindowLayer

from adapters.cache.layer_kv import LayerKV


class NativeSlidingLayer(DynamicSlidingWindowLayer):
    """A sliding-window (or chunked) attention layer kept native: transformers' own cache layer,
    unchanged, whose held keys/values [B, Hkv, <= window - 1, d] are mirrored into ``kv`` (a
    codec-free :class:`LayerKV`) after each update, so the cache's byte counts include them."""

    def __init__(self, kv: LayerKV, sliding_window: int):
        super().__init__(sliding_window=sliding_window)
        self.kv = kv

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        out = super().update(key_states, value_states, *args, **kwargs)
        self._mirror()
        return out

    def load(self, other: DynamicSlidingWindowLayer) -> None:
        """Take the state of ``other`` (a DynamicCache's layer after a shared prefill; tensors are shared,
        never written in place)."""
        self.__dict__.update({k: v for k, v in vars(other).items() if k != "kv"})
        self._mirror()

    def _mirror(self) -> None:
        # what a native cache holds for this layer, so 'uncompressed' is the same bytes
        self.kv.hold_native(self.keys, self.values)
