"""Model adapters by name. A new model is one module that registers a loader with
``@register_model(name, modality=..., description=...)`` and is listed in ``_MODULES``.

A loader is ``load(path: str | None, device: str, dtype: torch.dtype) -> object``; the
returned object is what that modality's tasks drive (see ``harness/tasks``).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

_MODULES = ("adapters.hf_causal_lm", "adapters.causal_wan", "adapters.aar")


@dataclass(frozen=True)
class ModelSpec:
    name: str
    modality: str  # "text", "video", "audio"
    load: Callable
    description: str = ""
    default_task: str = ""


MODELS: dict[str, ModelSpec] = {}


def register_model(name: str, modality: str, description: str = "", default_task: str = ""):
    def wrap(fn):
        MODELS[name] = ModelSpec(name, modality, fn, description, default_task)
        return fn

    return wrap


def _import_all() -> None:
    for mod in _MODULES:
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name != mod:  # a missing optional dependency of an existing adapter is a real error
                raise


def get_model(name: str) -> ModelSpec:
    _import_all()
    if name not in MODELS:
        raise ValueError(f"Unknown model '{name}'. Available: {', '.join(sorted(MODELS)) or '(none)'}")
    return MODELS[name]


def list_models() -> dict[str, ModelSpec]:
    _import_all()
    return dict(sorted(MODELS.items()))
