"""Model adapters: per-model hooks that put a model's KV cache behind :mod:`adapters.kv_cache`;
every adapter is a :class:`adapters.protocol.ModelAdapter`."""
from .cache_stats import cache_row_stats
from .kv_cache import DEFAULT_RESIDUAL, CacheConfig, CompressedKVCache, LayerKV
from .protocol import CachePolicy, Geometry, ModelAdapter
from .registry import MODELS, get_model, list_models, register_model

__all__ = ["CacheConfig", "CompressedKVCache", "LayerKV", "DEFAULT_RESIDUAL", "CachePolicy", "Geometry",
           "ModelAdapter", "cache_row_stats", "MODELS", "get_model", "list_models", "register_model"]
