"""Model adapters by name. A new model is one module (or package) in ``adapters/`` that registers
a loader with ``@register_model(name, modality=..., description=...)``; every module of the
package is imported on first use, so nothing else needs editing. A module whose optional
dependencies are missing is recorded in ``UNAVAILABLE`` (shown by the unknown-model error)
instead of breaking every other model.

A loader is ``load(path: str | None, device: str, dtype) -> ModelAdapter`` (see
:mod:`adapters.protocol`); the returned object is what that modality's tasks drive.
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .protocol import MODALITIES

PACKAGE = "adapters"
OUR_PACKAGES = ("harness", "adapters", "kernels", "metrics")


@dataclass(frozen=True)
class ModelSpec:
    name: str
    modality: str  # "text", "video", "audio"
    load: Callable
    description: str = ""
    default_task: str = ""


MODELS: dict[str, ModelSpec] = {}
#: module name -> why it could not be imported (a missing optional dependency)
UNAVAILABLE: dict[str, str] = {}


def register_model(name: str, modality: str, description: str = "", default_task: str = ""):
    if modality not in MODALITIES:
        raise ValueError(f"model '{name}': unknown modality '{modality}'. Available: {', '.join(MODALITIES)}")

    def wrap(fn):
        if name in MODELS:
            old = MODELS[name].load
            raise ValueError(f"model '{name}' registered twice: by {old.__module__}.{old.__qualname__} "
                             f"and by {fn.__module__}.{fn.__qualname__}")
        MODELS[name] = ModelSpec(name, modality, fn, description, default_task)
        return fn

    return wrap


def discover(package: str, folder: str | Path) -> None:
    """Import every module and subpackage of ``package`` (found in ``folder``) not named ``_*``:
    their ``@register_model`` decorators run."""
    for info in pkgutil.iter_modules([str(folder)]):
        if info.name.startswith("_"):
            continue
        try:
            importlib.import_module(f"{package}.{info.name}")
        except ImportError as e:  # a missing third-party package; a bug in our own code still raises
            missing = getattr(e, "name", None) or ""
            if missing.split(".")[0] in OUR_PACKAGES + (package.split(".")[0],):
                raise
            UNAVAILABLE[info.name] = f"needs '{missing or e}' ({e})"


def _import_all() -> None:
    discover(PACKAGE, Path(__file__).parent)


def get_model(name: str) -> ModelSpec:
    _import_all()
    if name not in MODELS:
        extra = "".join(f"; '{m}' is unavailable: {why}" for m, why in sorted(UNAVAILABLE.items()))
        raise ValueError(f"Unknown model '{name}'. Available: {', '.join(sorted(MODELS)) or '(none)'}{extra}")
    return MODELS[name]


def list_models() -> dict[str, ModelSpec]:
    _import_all()
    return dict(sorted(MODELS.items()))
