"""The checks of a run's options that need a task's declarations or a model's limits, made before the
model loads (and the limits again after): :func:`task_options` (every option of a task read by the types of its
``Options`` and checked against where each may lie, then the task's own cross-option checks) and
:func:`check_limits` (protected layers and context lengths against the layers and positions a model has)."""
from __future__ import annotations

from dataclasses import fields

from registry.options import allowed, options_json, read_options

from harness.run.config import RunConfig, RunError


def task_options(cls, given: dict) -> dict:
    """Every option of a task, given values read by the types of its ``Options`` and checked where they may
    lie, then the task's own cross-option checks; as JSON, so config.json names each value the run used."""
    try:
        options = read_options("task", cls.name, cls.Options, given)
    except ValueError as e:
        raise RunError(f"{e} (harness list shows every task option)") from None
    try:
        cls.check_options(options)
    except ValueError as e:
        raise RunError(f"task options of '{cls.name}': {e}") from None
    return options_json(options)


def check_limits(config: RunConfig, layers: int | None, positions: int | None, source: str) -> None:
    """The run's options against the model's limits (``source`` says where they were read): protected
    layer indices within its layers, and task options counted in tokens within its positions."""
    from adapters.cache.config import check_protect
    from harness.tasks import get_task

    if layers is not None:
        try:
            check_protect(config.protect, layers)
        except ValueError as e:
            raise RunError(f"--protect {','.join(map(str, config.protect))}: {e} ({source})") from None
    for t in config.tasks:
        for f in fields(get_task(t).Options):
            try:
                allowed(f).check_positions(config.task_options.get(t, {}).get(f.name, f.default), positions)
            except ValueError as e:
                raise RunError(f"task option {t}.{f.name}: {e} ({source}); give a shorter context") from None
