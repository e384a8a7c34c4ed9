"""The tasks, by name: one module each (a modality's task among them).

Every module in this package that registers a :class:`Task` is imported on the
first lookup (:meth:`registry.Registry.discover`); a module whose optional dependencies are missing
is recorded in ``UNAVAILABLE`` (shown by ``harness list`` and by the unknown-task error) instead of
breaking every other task."""
from __future__ import annotations

from harness.tasks.base import REGISTRY, TASKS, Prompt, Task, register_task, task_options

#: module name -> why it could not be imported (a missing optional dependency)
UNAVAILABLE = REGISTRY.unavailable


def get_task(name: str) -> type[Task]:
    return REGISTRY.get(name)


def list_tasks() -> dict[str, type[Task]]:
    return REGISTRY.all()


__all__ = ["TASKS", "UNAVAILABLE", "Prompt", "Task", "get_task", "list_tasks", "register_task", "task_options"]
