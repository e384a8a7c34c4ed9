"""Tasks by name. Every module in this package that registers a :class:`Task` is imported here;
a module whose optional dependencies are missing is recorded in ``UNAVAILABLE`` (shown by
``harness list`` and by the unknown-task error) instead of breaking every other task."""
from __future__ import annotations

import importlib
import pkgutil

from .base import TASKS, Prompt, Task, register_task

#: module name -> why it could not be imported (a missing optional dependency)
UNAVAILABLE: dict[str, str] = {}


def _import_all() -> None:
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_") or info.name == "base":
            continue
        name = f"{__name__}.{info.name}"
        try:
            importlib.import_module(name)
        except ImportError as e:  # a missing third-party package; a bug in our own code still raises
            missing = getattr(e, "name", None) or ""
            if missing.split(".")[0] in ("harness", "adapters", "kernels", "metrics"):
                raise
            UNAVAILABLE[info.name] = f"needs '{missing or e}' ({e})"


def get_task(name: str) -> type[Task]:
    _import_all()
    if name not in TASKS:
        extra = "".join(f"; '{m}' is unavailable: {why}" for m, why in sorted(UNAVAILABLE.items()))
        raise ValueError(f"Unknown task '{name}'. Available: {', '.join(sorted(TASKS)) or '(none)'}{extra}")
    return TASKS[name]


def list_tasks() -> dict[str, type[Task]]:
    _import_all()
    return dict(sorted(TASKS.items()))


__all__ = ["TASKS", "UNAVAILABLE", "Prompt", "Task", "get_task", "list_tasks", "register_task"]
