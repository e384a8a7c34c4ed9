"""The one path from a rollout's cache to a report row's rate fields."""
from __future__ import annotations

from .kv_cache import CompressedKVCache

BYTE_FIELDS = ("cache_bytes", "uncompressed_bytes", "compressed_bytes")


def cache_row_stats(cache: CompressedKVCache) -> dict[str, float | int]:
    """Check that a compressing codec really shrank ``cache`` (raises RuntimeError otherwise), then
    return the row's rate fields: :meth:`CompressedKVCache.stats` (cache_bytes, uncompressed_bytes,
    compressed_bytes, committed_tokens, bits_per_coord, value_bits_per_coord, cache_bits_per_coord).

    Every task calls it once per row, on the cache of the rollout the row scores. A cache of a
    batch of B sequences (one length, so each holds the same bytes) gives each row its own
    sequence's bytes: the byte counts divided by B; the bits per coordinate are ratios already.
    """
    if not isinstance(cache, CompressedKVCache):
        raise TypeError(f"cache_row_stats needs a CompressedKVCache, got {type(cache).__name__}")
    cache.assert_compressed()
    stats, batch = cache.stats(), cache.batch_size()
    for name in BYTE_FIELDS:
        if stats[name] % batch:
            raise RuntimeError(f"{name} {stats[name]} is not a whole number of bytes per sequence of the "
                               f"batch of {batch}: were the sequences of different lengths?")
        stats[name] //= batch
    return stats
