"""Model adapters: per-model hooks that put a model's KV cache behind :mod:`adapters.kv_cache`."""
from .kv_cache import DEFAULT_RESIDUAL, CacheConfig, CompressedKVCache, LayerKV
from .registry import MODELS, get_model, list_models, register_model

__all__ = ["CacheConfig", "CompressedKVCache", "LayerKV", "DEFAULT_RESIDUAL", "MODELS", "get_model",
           "list_models", "register_model"]
