"""The checks of a run's options against a model's limits, made before the model loads (from the limits its
checkpoint declares) and again after: :func:`check_limits` (protected layers and task options counted in
tokens against the layers and positions a model has, and the native window within its positions). Each task option's own range is checked where it is
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
    if positions is not None and any(c.codec != "none" for c in config.cache_configs()):
        check_window(config.residual, positions, source, "--residual ")
    for t in config.tasks:
        for f in fields(options[t]):
            try:
                allowed(f).check_positions(config.task_options.get(t, {}).get(f.name, f.default), positions)
            except ValueError as e:
                raise RunError(f"task option {t}.{f.name}: {e} ({source}); give a shorter context") from None


def check_window(residual: int, positions: int, source: str, name: str) -> None:
    """A native window of ``residual`` tokens must leave room for a token to reach the codec in a sequence of the
    model's ``positions``: a larger one compresses nothing, and every row would measure the native cache under
    the codec's name. ``name``: the option as its caller spells it (``--residual `` or ``residual=``)."""
    if residual >= positions:
        raise RunError(f"{name}{residual}: the native window would hold all of the model's {positions} positions, "
                       f"so no token ever reaches the codec ({source}); pass {name.strip()} below {positions}")


def check_modality(spec) -> None:
    """A model's modality must be one a metrics module declares (registry.MODALITIES), and not the probe's."""
    from metrics.registry import REGISTRY as METRICS
    from registry import NO_MODEL

    declared = [m for m in modalities() if m != NO_MODEL]
    if spec.modality not in declared:
        missing = f"; metrics modules not importable here: {METRICS.unavailable}" if METRICS.unavailable else ""
        raise RunError(f"model '{spec.name}' has modality '{spec.modality}', which no metrics module declares "
                       f"(declared: {', '.join(declared)}){missing}")
