"""The task contract the runner drives. A new task is one module in ``harness/tasks/`` that
subclasses :class:`Task`, decorates it with ``@register_task(name)`` and is listed in
``harness/tasks/__init__.py``.

The runner, per prompt: ``baseline = task.baseline(model, prompt, seed)`` once (uncompressed,
reused for every codec), then for each cache configuration
``row = task.evaluate(model, prompt, cache_config, seed, baseline, out_dir)`` which returns
a flat dict of metric name -> float (plus optional 'artifacts': {label: relative path}) and
the cache's byte counts ('cache_bytes', 'uncompressed_bytes', 'bits_per_coord').
Rollouts must be byte-identical for a (prompt, seed): every random draw comes from a
private generator derived from (prompt id, seed).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar


@dataclass
class Prompt:
    id: str  # stable, unique within a task: rows are keyed by it for resume
    data: Any = None
    meta: dict = field(default_factory=dict)


class Task:
    name: ClassVar[str] = ""
    modality: ClassVar[str] = ""  # "text", "video", "audio"
    metrics: ClassVar[tuple[str, ...]] = ()  # names in the metrics registry, in report order

    def __init__(self, **options):
        self.options = options

    def prompts(self, source: str | None = None, limit: int | None = None) -> list[Prompt]:
        raise NotImplementedError

    def baseline(self, model, prompt: Prompt, seed: int) -> Any:
        raise NotImplementedError

    def evaluate(self, model, prompt: Prompt, cache_config, seed: int, baseline: Any, out_dir: Path) -> dict:
        raise NotImplementedError


TASKS: dict[str, type[Task]] = {}


def register_task(name: str):
    def wrap(cls):
        cls.name = name
        TASKS[name] = cls
        return cls

    return wrap
