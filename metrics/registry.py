"""Metrics by name, each with its direction so reports sort and colour them correctly."""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

_MODULES = ("metrics.text", "metrics.video", "metrics.audio", "metrics.probe")


@dataclass(frozen=True)
class Metric:
    name: str
    fn: Callable
    higher_is_better: bool
    modality: str
    description: str = ""


METRICS: dict[str, Metric] = {}


def register_metric(name: str, higher_is_better: bool, modality: str, description: str = ""):
    def wrap(fn):
        METRICS[name] = Metric(name, fn, higher_is_better, modality, description)
        return fn

    return wrap


def _import_all() -> None:
    for mod in _MODULES:
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name != mod:
                raise


def get_metric(name: str) -> Metric:
    _import_all()
    if name not in METRICS:
        raise ValueError(f"Unknown metric '{name}'. Available: {', '.join(sorted(METRICS))}")
    return METRICS[name]


def list_metrics() -> dict[str, Metric]:
    _import_all()
    return dict(sorted(METRICS.items()))
