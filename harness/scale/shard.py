"""Shards: one run folder written by N processes, each running the prompts assigned to it.

A shard (``harness run --shard I/N``, I in 0..N-1, or from ``RANK``/``WORLD_SIZE`` as torchrun and
accelerate set them, or ``SLURM_ARRAY_TASK_ID``/``SLURM_ARRAY_TASK_COUNT``) is a property of the
process, not of the run: config.json, the run's hash and its rows are the same whether one process
or N wrote them, and a folder started one way resumes the other.

The unit of work is a *batch* (what ``task.batches`` groups: one prompt, or a few perplexity prompts
of one token length), so a prompt's baseline is computed once, in one process, and every batch is
the one a single process would run (rows do not depend on sharding). ``plan.json`` records the
batches and the cache configurations in the order a single process runs them (the *plan order*
the merge restores, :mod:`harness.scale.merge`). Batches go to shards by a hash of (task, first prompt
id): within each task the batches are ranked by that hash and dealt round robin, so shards get
equal counts (±1) and the assignment depends only on the run's own prompts and N.

Shard I of N appends to ``rows.shard-I-of-N.jsonl``, ``speed.shard-I-of-N.jsonl`` and
``timings.shard-I-of-N.jsonl`` and holds ``.lock.shard-I-of-N`` (:mod:`harness.run.lock`); no two
processes append to one file.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from harness.run.config import RunError
from harness.run.lock import LOCK_NAME
from harness.run.rows import atomic_write, dumps, read_rows, row_key

PLAN_NAME = "plan.json"
PLAN_VERSION = 1
ROWS_NAME = "rows.jsonl"
#: the keyed line files of a run (one line per row key): rows, and each row's rollout speed (harness.report.speed)
ROWS_STEM, SPEED_STEM = "rows", "speed"

Key = tuple[str, str, str, int]  # (task, prompt, label, codec seed): harness.run.rows.row_key


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` (0-based) of ``count``; ``source`` says where it came from (for messages)."""

    index: int
    count: int
    source: str = field(default="--shard", compare=False)

    def __post_init__(self):
        if self.count < 1 or not 0 <= self.index < self.count:
            raise RunError(f"{self.source}: shard {self.index} of {self.count} does not exist; shards are "
                           f"numbered 0..N-1 (e.g. --shard 0/2 and --shard 1/2)")

    @property
    def tag(self) -> str:
        return f"shard-{self.index}-of-{self.count}"

    @property
    def rows_name(self) -> str:
        return self.file_name(ROWS_STEM)

    @property
    def speed_name(self) -> str:
        return self.file_name(SPEED_STEM)

    def file_name(self, stem: str) -> str:
        return f"{stem}.{self.tag}.jsonl"

    @property
    def timings_name(self) -> str:
        return f"timings.{self.tag}.jsonl"

    @property
    def lock_name(self) -> str:
        return f"{LOCK_NAME}.{self.tag}"

    def __str__(self) -> str:
        return f"shard {self.index} of {self.count}"

    @classmethod
    def parse(cls, text: str) -> "Shard":
        """'I/N' -> Shard(I, N)."""
        m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
        if not m:
            raise RunError(f"--shard takes I/N (shard I of N, I in 0..N-1, e.g. 0/2), got '{text}'")
        return cls(int(m[1]), int(m[2]))

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "Shard | None":
        """The shard the launcher's environment names: RANK/WORLD_SIZE (torchrun, accelerate), else
        SLURM_ARRAY_TASK_ID/SLURM_ARRAY_TASK_COUNT (a dense array, e.g. --array=0-7); None where
        neither is set."""
        for index, count, low in (("RANK", "WORLD_SIZE", None),
                                  ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_MIN")):
            if index in env and count in env:
                source = f"{index}={env[index]} {count}={env[count]}"
                try:
                    i, n = int(env[index]) - int(env.get(low, 0) if low else 0), int(env[count])
                except ValueError:
                    raise RunError(f"{source}: not integers; unset them or pass --shard I/N") from None
                if not 0 <= i < n:
                    raise RunError(f"{source}: task {i} is not in 0..{n - 1}; use a dense array "
                                   f"(--array=0-{n - 1}) or pass --shard I/N")
                return cls(i, n, source)
        return None


def shard_files(out: Path, stem: str = ROWS_STEM) -> dict[Shard, Path]:
    """The shard files ``STEM.shard-I-of-N.jsonl`` (rows by default) of a run folder, ordered by
    (count, index)."""
    found, pattern = {}, re.compile(re.escape(stem) + r"\.shard-(\d+)-of-(\d+)\.jsonl")
    for p in Path(out).glob(f"{stem}.shard-*.jsonl"):
        m = pattern.fullmatch(p.name)
        if m and 0 <= int(m[1]) < int(m[2]):
            found[Shard(int(m[1]), int(m[2]))] = p
    return dict(sorted(found.items(), key=lambda kv: (kv[0].count, kv[0].index)))


def stored_lines(out: Path, stem: str = ROWS_STEM, repair: Path | None = None, last: bool = False) -> list[dict]:
    """Every complete line of ``STEM.jsonl`` and its shard files, one per row key: its first
    occurrence (``last``: its latest, in its first occurrence's place). ``repair``: the one file this
    process writes, whose torn last line (a crash) is cut off; the others may be mid-append by their
    own process, and their partial last line is only skipped."""
    out = Path(out)
    found: dict = {}
    for path in [out / f"{stem}.jsonl", *shard_files(out, stem).values()]:
        for r in read_rows(path, repair=path == repair):
            key = row_key(r)
            if last or key not in found:
                found[key] = r
    return list(found.values())


def pin_local_gpu(env: dict) -> str | None:
    """Under torchrun / accelerate (LOCAL_RANK set, several processes per node, no single GPU
    given), narrow CUDA_VISIBLE_DEVICES in ``env`` to this process's GPU, so that 'cuda' (and
    --device auto) means that GPU without changing config.json. Must run before CUDA initializes.
    Returns the value set, or None where nothing changed."""
    if "LOCAL_RANK" not in env or int(env.get("LOCAL_WORLD_SIZE", env.get("WORLD_SIZE", "1"))) < 2:
        return None
    visible = [d for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()] \
        if "CUDA_VISIBLE_DEVICES" in env else None
    rank = int(env["LOCAL_RANK"])
    if visible is None:
        chosen = str(rank)
    elif len(visible) > 1:
        chosen = visible[rank % len(visible)]
    else:
        return None  # one GPU (or none) already: the launcher pinned it
    env["CUDA_VISIBLE_DEVICES"] = chosen
    return chosen


# --- the plan ---------------------------------------------------------------------------------------
@dataclass
class Plan:
    """What a run computes, in the order one process computes it: per task its batches (prompt ids),
    and the cache configurations (label, codec seed). Row order: task, batch, configuration, prompt."""

    tasks: list[tuple[str, list[list[str]]]]
    runs: list[tuple[str, int]]

    def to_json(self) -> dict:
        return {"version": PLAN_VERSION, "tasks": [{"task": t, "batches": b} for t, b in self.tasks],
                "runs": [list(r) for r in self.runs]}

    @classmethod
    def from_json(cls, d: dict) -> "Plan":
        if d.get("version") != PLAN_VERSION:
            raise ValueError(f"plan version {d.get('version')}; expected {PLAN_VERSION}")
        return cls([(t["task"], [list(map(str, b)) for b in t["batches"]]) for t in d["tasks"]],
                   [(str(label), int(seed)) for label, seed in d["runs"]])

    def batch_keys(self, task: str, batch: list[str]) -> list[Key]:
        return [(task, p, label, seed) for label, seed in self.runs for p in batch]

    def keys(self) -> list[Key]:
        """Every row key in plan order."""
        return [k for task, batches in self.tasks for b in batches for k in self.batch_keys(task, b)]

    def owners(self, count: int) -> list[list[int]]:
        """The shard of each batch, per task: batches ranked by sha256(task, first prompt id) and
        dealt round robin, continuing across tasks so that no shard gets every task's extra one."""
        out, start = [], 0
        for task, batches in self.tasks:
            rank = sorted(range(len(batches)), key=lambda b: (_digest(task, batches[b][0]), b))
            owner = [0] * len(batches)
            for r, b in enumerate(rank):
                owner[b] = (start + r) % count
            out.append(owner)
            start += len(batches)
        return out

    def shard_keys(self, shard: Shard) -> list[Key]:
        """The row keys of ``shard``, in plan order."""
        owners = self.owners(shard.count)
        return [k for (task, batches), owner in zip(self.tasks, owners)
                for b, o in zip(batches, owner) if o == shard.index for k in self.batch_keys(task, b)]


def in_plan_order(rows: list[dict], plan: Plan | None) -> list[dict]:
    """``rows`` sorted into plan order; rows the plan does not name keep their order, at the end."""
    if plan is None:
        return rows
    pos = {k: i for i, k in enumerate(plan.keys())}
    end = len(pos)
    return [r for _, _, r in sorted((pos.get(row_key(r), end), i, r) for i, r in enumerate(rows))]


def _digest(task: str, prompt: str) -> str:
    return hashlib.sha256(f"{task}\0{prompt}".encode()).hexdigest()


def write_plan(out: Path, plan: Plan, log=print) -> None:
    """plan.json (every process of a run writes the same bytes; a different stored plan is noted)."""
    path = Path(out) / PLAN_NAME
    text = dumps(plan.to_json(), indent=2) + "\n"
    try:
        old = path.read_text(encoding="utf-8")
    except OSError:
        old = None
    if old is not None and old != text:
        log(f"note: {path} changes (another model or tokenizer than the rows already stored?); "
            f"rows are merged in the new plan's order")
    if old != text:
        atomic_write(path, text)


def adopt_plan(out: Path, plan: Plan, log=print) -> Plan:
    """The plan this process runs: the stored plan where it holds the same rows batched otherwise
    (processes of one run on other devices, whose automatic ``--batch-size`` differs, must agree on
    the batches, or shards would deal different batches and a prompt's stored baseline would be
    recomputed with another batch); else ``plan``."""
    stored = read_plan(out)
    if stored is None or stored == plan or stored.runs != plan.runs or sorted(stored.keys()) != sorted(plan.keys()):
        return plan
    log(f"note: keeping the batches of {Path(out) / PLAN_NAME} (written by a process that batched prompts "
        f"otherwise, e.g. on another device), so every process of this run runs the same batches")
    return stored


def read_plan(out: Path) -> Plan | None:
    """The run's plan; None where there is none (a folder written before plans, or before any
    process loaded the model) or it is unreadable."""
    try:
        return Plan.from_json(json.loads((Path(out) / PLAN_NAME).read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # AttributeError: not an object
        return None
