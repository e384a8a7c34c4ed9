"""Shards: one run folder written by N processes, each running the prompts assigned to it.

A shard (``harness run --shard I/N``, I in 0..N-1, or from ``RANK``/``WORLD_SIZE`` as torchrun and
accelerate set them, or ``SLURM_ARRAY_TASK_ID``/``SLURM_ARRAY_TASK_COUNT``) is a property of the
process, not of the run: config.json, the run's hash and its rows are the same whether one process
or N wrote them, and a folder started one way resumes the other.

The unit of work is a *batch* (what ``task.batches`` groups: one prompt, or a few perplexity prompts
of one token length), so a prompt's baseline is computed once, in one process, and every batch is
the one a single process would run (rows do not depend on sharding). ``plan.json``
(:mod:`harness.run.plan`) records the batches and the cache configurations in the order a single
process runs them (the *plan order* the merge restores, :mod:`harness.scale.merge`). Batches go to
shards by a hash of (task, first prompt id): within each task the batches are ranked by that hash and
dealt round robin, so shards get equal counts (±1) and the assignment depends only on the run's own
prompts and N.

Shard I of N appends to ``rows.shard-I-of-N.jsonl``, ``speed.shard-I-of-N.jsonl`` and
``timings.shard-I-of-N.jsonl`` and holds ``.lock.shard-I-of-N`` (:mod:`harness.run.lock`); no two
processes append to one file.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from harness.run.config import RunError
from harness.run.folder import RunFolder


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
        return RunFolder.shard_tag(self.index, self.count)

    def file_name(self, stem: str) -> str:
        """This shard's line file of ``stem`` (:attr:`RunFolder.LINE_STEMS`)."""
        return RunFolder.lines_name(stem, self.tag)

    @property
    def rows_name(self) -> str:
        return self.file_name(RunFolder.ROWS)

    @property
    def lock_name(self) -> str:
        return RunFolder.lock_name(self.tag)

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


def shard_files(out: Path, stem: str = RunFolder.ROWS) -> dict[Shard, Path]:
    """The shard files ``STEM.shard-I-of-N.jsonl`` (rows by default) of a run folder, ordered by
    (count, index)."""
    return {Shard(i, n): p for (i, n), p in RunFolder(out).shard_files(stem).items()}
