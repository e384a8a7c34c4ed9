"""Model adapters: every model behind one compressed-cache interface. ``adapters.cache`` is the cache
every adapter drives (its configuration is :class:`adapters.cache.config.CacheConfig`), ``adapters.hf``
any transformers decoder, ``adapters.wan`` and ``adapters.aar`` the video and audio generators; each
loaded model is an :class:`adapters.protocol.ModelAdapter`, found by name in :mod:`adapters.registry`."""
from adapters.protocol import CachePolicy, Geometry, ModelAdapter
from adapters.registry import MODELS, get_model, list_models, register_model

__all__ = ["CachePolicy", "Geometry", "ModelAdapter", "MODELS", "get_model", "list_models", "register_model"]
