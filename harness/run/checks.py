"""The checks of a run's options against a model's limits, made before the model loads (from the limits its
checkpoint declares) and again after: :func:`check_limits` (protected layers and task options counted in
tokens against the layers and positions a model has). Each task option's own range is checked where it is
read (:func:`harness.tasks.base.task_options`); and :func:`check_modality`, that a model's modality has metrics."""
from __future__ import annotations

from dataclasses import fields

from adapters.cache.config import check_protect
from metrics import modalities
from registry.options import allowed

from harness.run.config import RunConfig, RunError


def check_limits(config: RunConfig, options: dict[str, type], layers: int | None, positions: int | None,
                 source: str) -> None:
    """The run's options against the model's limits (``source`` says where they were read): protected
    layer indices within its layers, and task options counted in tokens within its positions (``options``:
    each of the run's tasks' ``Options`` class)."""
    if layers is not None:
        try:
            check_protect(config.protect, layers)
        except ValueError as e:
            raise RunError(f"--protect {','.join(map(str, config.protect))}: {e} ({source})") from None
    for t in config.tasks:
        for f in fields(options[t]):
            try:
                allowed(f).check_positions(config.task_options.get(t, {}).get(f.name, f.default), positions)
            except ValueError as e:
                raise RunError(f"task option {t}.{f.name}: {e} ({source}); give a shorter context") from None


def check_modality(spec) -> None:
    """A model's modality must be one a metrics module declares (registry.MODALITIES), and not the probe's."""
    from metrics.registry import REGISTRY as METRICS
    from registry import NO_MODEL

    declared = [m for m in modalities() if m != NO_MODEL]
    if spec.modality not in declared:
        missing = f"; metrics modules not importable here: {METRICS.unavailable}" if METRICS.unavailable else ""
        raise RunError(f"model '{spec.name}' has modality '{spec.modality}', which no metrics module declares "
                       f"(declared: {', '.join(declared)}){missing}")
