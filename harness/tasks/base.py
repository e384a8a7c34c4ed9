"""The task contract the runner drives. A new task is one module in ``harness/tasks/`` that
subclasses :class:`Task` and decorates it with ``@register_task(name)``; ``harness/tasks/__init__.py``
imports every module of the package.

The runner, per batch of prompts (``task.batches(model, prompts)``; by default one prompt per
batch): ``baselines = task.baseline_batch(model, prompts, seed)`` once (uncompressed, reused for
every codec), then for each cache configuration (one per codec seed of a randomized codec)
``rows = task.evaluate_batch(model, prompts, cache_config, seed, baselines, out_dir)``: per
prompt a flat dict of metric name -> float (plus optional 'artifacts': {label: relative path})
and the rate fields of the scored rollout's cache, from
:func:`adapters.cache.stats.cache_row_stats` (called once per rollout: it also checks that a
codec really compressed), plus optional 'speed': the timed rollout's
:meth:`adapters.cache.rollout_clock.RolloutClock.record`, one dict shared by the rows it scored (the
runner writes it to speed.jsonl, not to the row: :mod:`harness.report.speed`). A task implements ``baseline``/``evaluate`` for one prompt, or the
batch methods where running prompts together is faster.
Rollouts must be byte-identical for a (prompt, seed) and batch: every random draw comes from a
private generator derived from (prompt id, seed); ``seed`` is the prompt seed, the codec's own
draws come from ``cache_config.seed`` (the codec seed).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, fields
from itertools import islice
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterable

from registry import Registry
from registry.options import NoOptions, allowed, options_json, read_options

from harness.run.config import RunError, batch_size_for
from harness.run.rows import dumps


@dataclass
class Prompt:
    id: str  # stable, unique within a task: rows are keyed by it for resume
    data: Any = None
    meta: dict = field(default_factory=dict)


class Task:
    name: ClassVar[str] = ""
    modality: ClassVar[str] = ""  # "text", "video", "audio"
    #: names in the metrics registry, in report order; each must have an implementation for
    #: ``modality`` (checked by :func:`register_task`); compute them with :meth:`metric`
    metrics: ClassVar[tuple[str, ...]] = ()
    #: the metric that ranks configurations in the summary and reports (None: the first of ``metrics``)
    headline: ClassVar[str | None] = None
    #: the task's own score (what its benchmark reports, e.g. RULER's), one of ``metrics``: over a sweep of
    #: context lengths (rows' ``prompt_meta.context``) the summary finds each configuration's effective length
    score_metric: ClassVar[str | None] = None
    #: prompt_meta keys the report breaks ``score_metric`` down by, the first averaged over (RULER's task,
    #: then context length: its per-task table and its average per length); rows carry prompt_meta["repeat"]
    breakdown: ClassVar[tuple[str, ...]] = ()
    #: the media its rows' ``artifacts`` carry, for report.html: {kind: {role: artifact key}}, the kinds and
    #: their roles those of :mod:`harness.report.html.media` (e.g. ``{"audio": {"player": "wav", ...}}``)
    media: ClassVar[dict[str, dict[str, str]]] = {}
    #: the task's options: a frozen dataclass of typed fields, each an :func:`registry.options.option` with its
    #: help and where it may lie (:class:`registry.options.Allowed`). ``harness list`` shows them; ``--task-opt
    #: NAME=VALUE`` values are read by the field types and checked before any model loads, as codecs' are.
    Options: ClassVar[type] = NoOptions

    @classmethod
    def check_options(cls, options) -> None:
        """Checks across options (an ``Options`` instance, every value in its range); raise ValueError."""

    def __init__(self, **options):
        #: the task's ``Options`` (values given as strings or JSON are read here, where they enter)
        self.opts = read_options("task", self.name, self.Options, options)

    def metric(self, name: str) -> Callable:
        """The registry's implementation of metric ``name`` for this task's modality."""
        from metrics import get_metric

        return get_metric(name).impl(self.modality)

    #: the dataclasses a baseline of this task may hold (the only classes read back from disk)
    baseline_types: ClassVar[tuple[type, ...]] = ()

    # The runner stores each prompt's baseline on disk so a resumed run reuses it: safetensors
    # (tensors) with the rest as JSON in its header, never a pickle (see harness/tasks/baseline_io.py).
    def save_baseline(self, baseline: Any, path: Path, key: str | None = None) -> None:
        """``key``: the prompt's :meth:`content_key`, stored in the file's header."""
        from harness.tasks.baseline_io import save_tree

        save_tree(baseline, path, key)

    def load_baseline(self, path: Path) -> Any:
        from harness.tasks.baseline_io import load_tree

        return load_tree(path, self.baseline_types)

    def stored_key(self, path: Path) -> str | None:
        """The content key a stored baseline holds ('' for a file stored without one; None where it is no
        readable baseline), read from its header alone."""
        from harness.tasks.baseline_io import read_key

        return read_key(path)

    def prompts(self, source: str | None = None, limit: int | None = None) -> list[Prompt]:
        raise NotImplementedError

    def content_key(self, prompt: Prompt) -> str:
        """A digest of what ``prompt``'s baseline is made from, computed without the model: stored with the baseline,
        it stops a resumed run from scoring against a baseline whose prompt has changed since
        (:mod:`harness.run.baselines`). Default: the prompt's data as JSON; a task whose data names a file hashes
        the file. What else makes the baseline (model, seed, options) is the run's configuration, checked apart."""
        return hashlib.sha256(dumps(prompt.data).encode()).hexdigest()

    def baseline(self, model, prompt: Prompt, seed: int) -> Any:
        raise NotImplementedError

    def evaluate(self, model, prompt: Prompt, cache_config, seed: int, baseline: Any, out_dir: Path) -> dict:
        raise NotImplementedError

    # --- batches: a task that runs prompts together overrides these --------------------------
    #: the run's ``--batch-size`` (None: chosen for the model's device); the runner sets it
    batch_size: int | None = None

    def prompts_per_batch(self, model) -> int:
        """How many prompts a batch holds: ``batch_size``, or the model's device's default (1 for a
        model with sliding-window layers)."""
        if self.batch_size is None and getattr(model, "sliding_layers", ()):
            return 1  # sliding-window layers take no padded batch (adapters.hf.arch.refuse_padding)
        return batch_size_for(self.batch_size, getattr(model, "device", "cpu"))

    def batches(self, model, prompts: list[Prompt]) -> list[list[Prompt]]:
        """The prompts grouped as the runner should run them, in order (default: one by one)."""
        return [[p] for p in prompts]

    #: whether a rollout teacher-forces the baseline's answer on a fork of its cache (the memory plan)
    forks_cache: ClassVar[bool] = False

    def memory_shape(self, prompts: list[Prompt], batch: int):
        """Its longest batch for the memory plan (:class:`harness.run.memory.TaskShape`), from its options
        alone (no tokenizer): the longest of the options counted in tokens of context, ``batch`` prompts of it
        (or as many as it has), ``max_new_tokens`` after it; None where no option gives a context."""
        from harness.run.memory import TaskShape

        sizes = [v for f in fields(self.opts) if allowed(f).positions
                 for v in (getattr(self.opts, f.name) if isinstance(getattr(self.opts, f.name), tuple)
                           else (getattr(self.opts, f.name),)) if isinstance(v, int) and v > 0]
        if not sizes:
            return None
        longest = max(sizes)
        at = [p for p in prompts if isinstance(p.data, dict) and p.data.get("context") == longest] or prompts
        return TaskShape(batch=max(1, min(batch, len(at))), context=longest,
                         new_tokens=int(getattr(self.opts, "max_new_tokens", 0) or 0), forced=self.forks_cache)

    def baseline_batch(self, model, prompts: list[Prompt], seed: int) -> list[Any]:
        return [self.baseline(model, p, seed) for p in prompts]

    def evaluate_batch(self, model, prompts: list[Prompt], cache_config, seed: int, baselines: list[Any],
                       out_dir: Path) -> list[dict]:
        return [self.evaluate(model, p, cache_config, seed, b, out_dir) for p, b in zip(prompts, baselines)]


def first(prompts: Iterable[Prompt], limit: int | None) -> list[Prompt]:
    """The first ``limit`` prompts (all where None) of a generator: a task's prompts are made lazily, so that
    an option that multiplies them past any run (repeats=10^12) with ``--limit`` makes only what runs."""
    return list(islice(prompts, limit))


def artifact_label(cache_config) -> str:
    """The name a rollout's artifacts (videos, sheets, WAVs) are filed under: the config's label,
    plus its codec seed where the codec draws at random (each seed's rollout is another file)."""
    from kernels import codec_class

    label = cache_config.label
    return f"{label}.seed{cache_config.seed}" if codec_class(cache_config.codec).randomized else label


#: the tasks of this package's modules (:mod:`harness.tasks` looks them up)
REGISTRY: Registry[type[Task]] = Registry("task", "harness.tasks")
TASKS = REGISTRY.entries


def register_task(name: str):
    """Class decorator: register a :class:`Task` under ``name``; a second task of the same name
    raises, as does a declared metric the registry does not implement for the task's modality."""
    def wrap(cls):
        if cls.modality:
            from metrics import get_metric

            for m in cls.metrics:
                get_metric(m).impl(cls.modality)  # unknown name or modality -> a one-line error
        REGISTRY.add(name, cls)
        cls.name = name
        return cls

    return wrap


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
