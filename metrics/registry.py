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

import importlib
import pkgutil
from dataclasses import dataclass, field
from typing import Callable

MODALITIES = ("text", "video", "audio", "probe")
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


METRICS: dict[str, Metric] = {}


def define_metric(name: str, *, higher_is_better: bool | None, scale: str = "linear", display: str = "",
                  description: str = "") -> Metric:
    """Declare a quantity (no implementation yet); a second definition of ``name`` raises."""
    if name in METRICS:
        raise ValueError(f"metric '{name}' is already defined")
    if scale not in SCALES:
        raise ValueError(f"metric '{name}': unknown scale '{scale}'. Allowed: {', '.join(SCALES)}")
    METRICS[name] = Metric(name, higher_is_better, scale, display or name, description)
    return METRICS[name]


def register_metric(name: str, modality: str, **definition):
    """Decorator: ``fn`` computes metric ``name`` for ``modality``. With ``definition`` (the
    keywords of :func:`define_metric`) it also declares the metric; without, the metric must
    already be defined (by :mod:`metrics.shared`). One implementation per (name, modality)."""
    if modality not in MODALITIES:
        raise ValueError(f"metric '{name}': unknown modality '{modality}'. Allowed: {', '.join(MODALITIES)}")
    if definition:
        define_metric(name, **definition)
    elif name not in METRICS:
        raise ValueError(f"metric '{name}' is not defined; pass higher_is_better=... (and scale, display) "
                         f"or define it in metrics/shared.py. Defined: {', '.join(sorted(METRICS))}")

    def wrap(fn):
        if modality in METRICS[name].impls:
            raise ValueError(f"metric '{name}' already has a {modality} implementation "
                             f"({METRICS[name].impls[modality].__qualname__})")
        METRICS[name].impls[modality] = fn
        return fn

    return wrap


#: module name -> why it could not be imported (a missing optional dependency)
UNAVAILABLE: dict[str, str] = {}


def _import_all() -> None:
    """Import every module of the ``metrics`` package (each registers its metrics), the shared
    definitions first; a module whose third-party dependency is missing is recorded, not fatal."""
    import metrics

    names = ["shared"] + sorted(i.name for i in pkgutil.iter_modules(metrics.__path__)
                                if not i.name.startswith("_") and i.name not in ("registry", "shared"))
    for name in names:
        try:
            importlib.import_module(f"metrics.{name}")
        except ImportError as e:
            missing = getattr(e, "name", None) or ""
            if missing.split(".")[0] == "metrics":  # a bug in our own code still raises
                raise
            UNAVAILABLE[name] = f"needs '{missing or e}' ({e})"


def get_metric(name: str) -> Metric:
    _import_all()
    if name not in METRICS:
        extra = "".join(f"; 'metrics.{m}' is unavailable: {why}" for m, why in sorted(UNAVAILABLE.items()))
        raise ValueError(f"Unknown metric '{name}'. Available: {', '.join(sorted(METRICS))}{extra}")
    return METRICS[name]


def list_metrics() -> dict[str, Metric]:
    _import_all()
    return dict(sorted(METRICS.items()))
