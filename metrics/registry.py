"""Metrics by name. A :class:`Metric` is one quantity: its direction, scale and display name are
declared once, so summaries and reports sort, plot and label it the same way in every modality;
each modality registers its own implementation of it (text reads logits, audio pooled logits,
video frames).

An implementation returns a float, or one value per position / frame (a tensor [N]) that the
task reduces by its mean. A new metric is one function decorated with
``@register_metric(name, modality, higher_is_better=..., scale=..., display=...)`` in the
modality's module; a quantity measured in several modalities is defined once in
:mod:`metrics.shared` and each modality adds ``@register_metric(name, modality)``.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Callable

from registry import MODALITIES, Registry, definer

SCALES = ("linear", "log", "dB")  # "log": plotted on a log axis; "dB": already logarithmic


@dataclass(frozen=True)
class Metric:
    name: str
    higher_is_better: bool | None  # None: no better direction (e.g. a signed bias)
    scale: str = "linear"
    display: str = ""
    description: str = ""
    impls: dict[str, Callable] = field(default_factory=dict)  # modality -> implementation

    @property
    def modalities(self) -> tuple[str, ...]:
        return tuple(self.impls)

    def impl(self, modality: str) -> Callable:
        if modality not in self.impls:
            raise ValueError(f"metric '{self.name}' has no {modality!r} implementation. "
                             f"Available: {', '.join(self.impls) or '(none)'}")
        return self.impls[modality]


REGISTRY: Registry[Metric] = Registry("metric", "metrics")
METRICS = REGISTRY.entries


def define_metric(name: str, *, higher_is_better: bool | None, scale: str = "linear", display: str = "",
                  description: str = "", by: str | None = None) -> Metric:
    """Declare a quantity (no implementation yet); a second definition of ``name`` raises, naming
    both definers (``by``; default: the calling module, as :func:`collections.namedtuple` finds it)."""
    if scale not in SCALES:
        raise ValueError(f"metric '{name}': unknown scale '{scale}'. Allowed: {', '.join(SCALES)}")
    by = by or sys._getframe(1).f_globals.get("__name__", "?")
    return REGISTRY.add(name, Metric(name, higher_is_better, scale, display or name, description), by=by)


def register_metric(name: str, modality: str, **definition):
    """Decorator: ``fn`` computes metric ``name`` for ``modality``. With ``definition`` (the
    keywords of :func:`define_metric`) it also declares the metric; without, the metric must
    already be defined (by :mod:`metrics.shared`). One implementation per (name, modality)."""
    if modality not in MODALITIES:
        raise ValueError(f"metric '{name}': unknown modality '{modality}'. Declared (by the metrics modules): "
                         f"{', '.join(sorted(MODALITIES))}")
    if not definition and name not in METRICS:
        raise ValueError(f"metric '{name}' is not defined; pass higher_is_better=... (and scale, display) "
                         f"or define it in metrics/shared.py. Defined: {', '.join(sorted(METRICS))}")

    def wrap(fn):
        metric = define_metric(name, **definition, by=definer(fn)) if definition else METRICS[name]
        if modality in metric.impls:
            raise ValueError(f"metric '{name}' already has a {modality} implementation "
                             f"({metric.impls[modality].__qualname__})")
        metric.impls[modality] = fn
        return fn

    return wrap


def get_metric(name: str) -> Metric:
    return REGISTRY.get(name)


def list_metrics() -> dict[str, Metric]:
    return REGISTRY.all()


def modalities() -> list[str]:
    """Every modality, sorted: each is declared by its metrics module, so every module is imported first."""
    REGISTRY.all()
    return sorted(MODALITIES)
