"""The compressed-cache interface every model adapter plugs into.

One :class:`CompressedKVCache` per rollout holds, per layer, a :class:`LayerKV`: the codec
states of committed tokens plus a native-precision residual window of the most recent
tokens. Tokens are encoded once, as they leave the window, and never re-encoded. Chosen
layers (by default none; ``protect='boundary-1'`` keeps the first and last) stay native.

Shapes: keys and values are ``[B, Hkv, T, d]``; queries ``[B, Hq, Tq, d]`` with Hq a
multiple of Hkv (GQA: query head h reads KV head h // (Hq // Hkv), as transformers'
``repeat_kv`` does).

Reading a layer (:meth:`LayerKV.attend`) sees, in token order: the committed tokens through
the codec (its ``score`` estimator, or decode-then-dot with ``attend='reconstruct'``), the
native window, and optionally extra native tokens in flight (``k_new``/``v_new``: a prefill
chunk, a video block) that are attended but not stored; the adapter appends them afterwards.
"""
from __future__ import annotations

from kernels import make_codec

from adapters.cache.config import CacheConfig
from adapters.cache.layer_kv import LayerKV


class CompressedKVCache:
    """The per-rollout cache: one :class:`LayerKV` per layer, each with its own codec instance
    (rotation signs drawn from (seed, layer, head))."""

    def __init__(self, config: CacheConfig, num_layers: int, num_kv_heads: int, head_dim: int, device="cpu"):
        self.config = config
        self.num_layers = num_layers
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        protected = config.protected_layers(num_layers)
        self.layers: list[LayerKV] = []
        for i in range(num_layers):
            codec = None
            if config.codec != "none" and i not in protected:
                codec = make_codec(config.codec_config(head_dim, num_kv_heads, layer=i), device=device)
            self.layers.append(LayerKV(codec, config))

    def __getitem__(self, i: int) -> LayerKV:
        return self.layers[i]

    def __len__(self) -> int:
        return self.num_layers

    def fork(self) -> "CompressedKVCache":
        """An independent copy (e.g. to branch a rollout after a shared prefill); codecs are shared."""
        other = CompressedKVCache.__new__(CompressedKVCache)
        other.__dict__.update(self.__dict__)
        other.layers = [layer.fork() for layer in self.layers]
        return other

    def replay(self, native: "CompressedKVCache") -> None:
        """Append to this empty cache, layer by layer, what ``native`` holds: a native cache after a
        first step computed elsewhere (one append per layer, [B, Hkv, t, d]; a shared first step,
        :mod:`adapters.cache.shared_prefill`). Each layer then holds and encodes exactly what that step,
        run through it, would have left (its reads of an empty layer are plain attention)."""
        for i, (layer, src) in enumerate(zip(self.layers, native.layers)):
            if layer.columns:
                raise RuntimeError(f"layer {i}: replay needs an empty cache layer")
            if src.window_k is not None:
                layer.append(src.window_k, src.window_v)

    def nbytes(self, seq: int | None = None) -> dict[str, int]:
        """Bytes held for sequence ``seq`` (default: the whole batch), by kind, and their ``total``."""
        tot: dict[str, int] = {}
        for layer in self.layers:
            for k, v in layer.nbytes(seq).items():
                tot[k] = tot.get(k, 0) + v
        tot["total"] = tot["compressed"] + tot["window"] + tot["native_layers"]
        return tot

    def stats(self, seq: int | None = None) -> dict[str, float | int]:
        """Rate figures for a report row, all from stored bytes: sequence ``seq``'s, or (default)
        the whole batch's (byte counts summed; ``committed_tokens`` the mean per sequence).

        ``cache_bytes``: everything the cache holds (codec states + native windows + native
        layers); ``uncompressed_bytes``: what a native cache of the same tokens holds;
        ``bits_per_coord``: true bits per key coordinate of the committed (codec) tokens;
        ``value_bits_per_coord`` likewise for values; ``cache_bits_per_coord``: 8 * cache_bytes
        over every cached key and value coordinate (window and protected layers included).
        Codec 'none' reports the native dtype's bits. Padding is never counted.
        """
        def count(xs: list[int]) -> int:
            return sum(xs) if seq is None else (xs[seq] if xs else 0)

        for i, layer in enumerate(self.layers):  # what the decode steps noted without a sync
            layer.finite.raise_if_any(f" of layer {i}")
        b = self.nbytes(seq)
        codec_layers = [layer for layer in self.layers if layer.codec is not None]
        committed = sum(count(layer.seq_committed) for layer in codec_layers)
        tokens = sum(count(layer.seq_lengths) for layer in self.layers)
        coords = committed * self.num_kv_heads * self.head_dim
        all_coords = 2 * tokens * self.num_kv_heads * self.head_dim
        native_bits = 8.0 * b["uncompressed"] / max(all_coords, 1)
        sequences = self.batch_size() if seq is None else 1
        return {
            "cache_bytes": b["total"],
            "uncompressed_bytes": b["uncompressed"],
            "compressed_bytes": b["compressed"],
            "committed_tokens": committed // max(1, len(codec_layers) * sequences),
            "bits_per_coord": 8.0 * b["compressed_keys"] / coords if coords else native_bits,
            "value_bits_per_coord": 8.0 * b["compressed_values"] / coords if coords else native_bits,
            "cache_bits_per_coord": 8.0 * b["total"] / max(all_coords, 1),
        }

    def batch_size(self) -> int:
        """B of the cached [B, Hkv, T, d] (1 while empty)."""
        return max((len(layer.seq_window) for layer in self.layers), default=1) or 1

    def repeat_batch(self, n: int) -> None:
        """Each sequence repeated ``n`` times in place: a batch-1 cache made a batch of n."""
        for layer in self.layers:
            layer.repeat_batch(n)

    def assert_compressed(self, seq: int | None = None) -> None:
        """Fail loudly if a compressing codec did not actually shrink what the cache holds (for
        sequence ``seq``, or the whole batch)."""
        if self.config.codec == "none":
            return
        b = self.nbytes(seq)
        if not any(layer.committed if seq is None else layer.seq_committed[seq]
                   for layer in self.layers if layer.codec is not None and layer.seq_committed):
            raise RuntimeError(
                f"cache for {self.config.label} committed no token to the codec (window {self.config.residual} "
                f"{self.config.residual_unit}s covers the whole sequence): lower --residual or use a longer context"
            )
        if b["total"] >= b["uncompressed"]:
            raise RuntimeError(f"cache for {self.config.label} holds {b['total']} bytes, not fewer than the "
                               f"{b['uncompressed']} bytes of the native cache: compression did not happen")
