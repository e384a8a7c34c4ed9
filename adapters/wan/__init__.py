"""Causal Wan 2.1 generators (CausVid, Causal Forcing) on diffusers' Wan modules, with the
self-attention KV cache behind :mod:`adapters.cache.kv_cache`. See docs/video.md."""
from adapters.wan.build import build_random, load_released, tiny_spec
from adapters.wan.model import CAUSAL_FORCING, CAUSVID, CausalWan, CausalWanSpec
from adapters.wan.schedule import FlowSchedule

__all__ = ["CAUSVID", "CAUSAL_FORCING", "CausalWan", "CausalWanSpec", "FlowSchedule", "build_random",
           "load_released", "tiny_spec"]
