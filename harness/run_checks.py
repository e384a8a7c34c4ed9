"""The checks of a run's options that need a task's declarations or a model's limits, made before the
model loads (and the limits again after): :func:`task_options` (every option of a task parsed by type and
checked against its :class:`harness.tasks.base.Allowed`, then the task's own cross-option checks) and
:func:`check_limits` (protected layers and context lengths against the layers and positions a model has)."""
from __future__ import annotations

from .config import RunConfig, RunError


def task_options(cls, given: dict) -> dict:
    """Every option of a task that declares ``option_defaults``, given values parsed by type, so
    config.json names each value the run used (a task without declared options gets ``given``)."""
    from harness.tasks.base import option_allowed, parse_option

    defaults = getattr(cls, "option_defaults", {})
    if not defaults:
        return dict(given)
    bad = set(given) - set(defaults)
    if bad:
        raise RunError(f"unknown option(s) {sorted(bad)} for task '{cls.name}'. Available: {', '.join(defaults)}")
    out = {}
    for name, spec in defaults.items():
        default = spec[0]
        try:
            value = parse_option(given[name], default) if name in given else default
            option_allowed(spec).check(value)
        except (ValueError, TypeError) as e:
            shown = given.get(name, default)
            raise RunError(f"task option {cls.name}.{name}={shown}: {e} (harness list shows every task "
                           f"option)") from None
        out[name] = list(value) if isinstance(value, tuple) else value
    try:
        cls.check_options(out)
    except ValueError as e:
        raise RunError(f"task options of '{cls.name}': {e}") from None
    return out


def check_limits(config: RunConfig, layers: int | None, positions: int | None, source: str) -> None:
    """The run's options against the model's limits (``source`` says where they were read): protected
    layer indices within its layers, and task options counted in tokens within its positions."""
    from adapters.cache_config import check_protect
    from harness.tasks import get_task
    from harness.tasks.base import option_allowed

    if layers is not None:
        try:
            check_protect(config.protect, layers)
        except ValueError as e:
            raise RunError(f"--protect {','.join(map(str, config.protect))}: {e} ({source})") from None
    for t in config.tasks:
        for name, spec in getattr(get_task(t), "option_defaults", {}).items():
            try:
                option_allowed(spec).check_positions(config.task_options.get(t, {}).get(name, spec[0]), positions)
            except ValueError as e:
                raise RunError(f"task option {t}.{name}: {e} ({source}); give a shorter context") from None
