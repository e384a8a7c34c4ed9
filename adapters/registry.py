"""Model adapters by name. A new model is one module (or package) in ``adapters/`` that registers
a loader with ``@register_model(name, modality=..., description=..., default_task=...)``; every
module of the package is imported on first use (:meth:`registry.Registry.discover`), so nothing
else needs editing. A module whose optional dependencies are missing is recorded (and named by
the unknown-model error) instead of breaking every other model.

A loader is ``load(path: str | None, device: str, dtype) -> ModelAdapter`` (see
:mod:`adapters.protocol`); the returned object is what that modality's tasks drive. ``declared(path) ->
DeclaredShape | None`` (optional) tells the model's shape without loading its weights (a config file, a GGUF
header, the architecture's constants), so that a run's options are checked against it first; it raises the
loader's own one-line error for a path the loader would refuse.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from registry import NO_MODEL, Registry, definer


@dataclass(frozen=True)
class ModelSpec:
    name: str
    modality: str  # one its metrics module declares (registry.MODALITIES; checked when a run resolves)
    load: Callable
    description: str = ""
    default_task: str = ""  # the task `harness run` runs when --task is left out
    declared: Callable | None = None  # path -> adapters.protocol.DeclaredShape | None, read without the weights


REGISTRY: Registry[ModelSpec] = Registry("model", "adapters")
MODELS = REGISTRY.entries


def register_model(name: str, modality: str, description: str = "", default_task: str = "",
                   declared: Callable | None = None):
    if modality == NO_MODEL:
        raise ValueError(f"model '{name}': '{NO_MODEL}' measures a codec alone; a model generates something")

    def wrap(fn):
        REGISTRY.add(name, ModelSpec(name, modality, fn, description, default_task, declared), by=definer(fn))
        return fn

    return wrap


def get_model(name: str) -> ModelSpec:
    return REGISTRY.get(name)


def list_models() -> dict[str, ModelSpec]:
    return REGISTRY.all()
