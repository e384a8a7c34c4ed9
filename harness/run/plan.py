"""The plan of a run: what it computes, in the order one process computes it (``plan.json``).

Every process of a run (one, or N shards: :mod:`harness.scale.shard`) writes the same plan, and rows
are merged back into its order, so a run's rows.jsonl does not depend on how many processes wrote it.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from harness.run.folder import RunFolder
from harness.run.rows import atomic_write, dumps, row_key
from harness.run.input_files import read_text

PLAN_VERSION = 1

Key = tuple[str, str, str, int]  # (task, prompt, label, codec seed): harness.run.rows.row_key


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

    def shard_keys(self, shard) -> list[Key]:
        """The row keys of ``shard`` (a :class:`harness.scale.shard.Shard`: its index of its count), in plan order."""
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
    path = RunFolder(out).plan
    text = dumps(plan.to_json(), indent=2) + "\n"
    try:
        old = read_text(path, "plan.json")
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
    log(f"note: keeping the batches of {RunFolder(out).plan} (written by a process that batched prompts "
        f"otherwise, e.g. on another device), so every process of this run runs the same batches")
    return stored


def read_plan(out: Path) -> Plan | None:
    """The run's plan; None where there is none (a folder written before plans, or before any
    process loaded the model) or it is unreadable."""
    try:
        return Plan.from_json(json.loads(read_text(RunFolder(out).plan, "plan.json")))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # AttributeError: not an object
        return None
