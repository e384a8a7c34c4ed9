"""The checks of a run's options against a model's limits, made before the model loads (from the limits its
checkpoint declares) and again after: :func:`check_limits` (protected layers and task options counted in
tokens against the layers and positions a model has). Each task option's own range is checked where it is
read (:func:`harness.tasks.base.task_options`)."""
from __future__ import annotations

from dataclasses import fields

from adapters.cache.config import check_protect
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
