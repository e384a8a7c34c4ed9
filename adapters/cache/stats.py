"""The one path from a rollout's cache to a report row's rate fields."""
from __future__ import annotations

from adapters.cache.kv_cache import CompressedKVCache

BYTE_FIELDS = ("cache_bytes", "uncompressed_bytes", "compressed_bytes")


def cache_row_stats(cache: CompressedKVCache, sequence: int | None = None) -> dict[str, float | int]:
    """Check that a compressing codec really shrank ``cache`` (raises RuntimeError otherwise), then
    return the row's rate fields: :meth:`CompressedKVCache.stats` (cache_bytes, uncompressed_bytes,
    compressed_bytes, committed_tokens, bits_per_coord, value_bits_per_coord, cache_bits_per_coord).

    Every task calls it once per row, on the cache of the rollout the row scores. ``sequence``:
    the row's sequence in a batch; its own real tokens only (a padded batch's sequences differ in
    length, and its pads are never counted), so a row's figures do not depend on its batch.
    Without it, a batch of B sequences of one length gives each row its share: the byte counts
    divided by B (the bits per coordinate are ratios already).
    """
    if not isinstance(cache, CompressedKVCache):
        raise TypeError(f"cache_row_stats needs a CompressedKVCache, got {type(cache).__name__}")
    if sequence is not None:
        cache.assert_compressed(sequence)
        return cache.stats(sequence)
    if any(len(set(layer.seq_lengths)) > 1 for layer in cache.layers):
        raise RuntimeError("the sequences of this batch differ in length: pass the row's sequence=")
    cache.assert_compressed()
    stats, batch = cache.stats(), cache.batch_size()
    for name in BYTE_FIELDS:
        if stats[name] % batch:
            raise RuntimeError(f"{name} {stats[name]} is not a whole number of bytes per sequence of the "
                               f"batch of {batch}")
        stats[name] //= batch
    return stats
