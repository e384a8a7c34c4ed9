"""Model adapters: per-model hooks that put a model's KV cache behind :mod:`adapters.cache.kv_cache`;
every adapter is a :class:`adapters.protocol.ModelAdapter`."""
from adapters.cache.stats import cache_row_stats
from adapters.cache.config import DEFAULT_RESIDUAL, CacheConfig
from adapters.cache.kv_cache import CompressedKVCache
from adapters.cache.layer_kv import LayerKV
from adapters.protocol import CachePolicy, Geometry, ModelAdapter
from adapters.registry import MODELS, get_model, list_models, register_model

__all__ = ["CacheConfig", "CompressedKVCache", "LayerKV", "DEFAULT_RESIDUAL", "CachePolicy", "Geometry",
           "ModelAdapter", "cache_row_stats", "MODELS", "get_model", "list_models", "register_model"]
