"""``harness launch --slurm``: the shards of a run as a submitit job array (one task per shard).

The cluster options are a :class:`SlurmConfig` (JSON round trip), kept beside the run in
``RUN/slurm.json``; they say where the run goes, not what it computes, so they are not part of
config.json or the run's hash. submitit's files (the pickled job, logs) are under ``RUN/slurm/``.

A preempted or timed-out task is requeued by submitit through :meth:`ShardJob.checkpoint`, which
resubmits the same shard unchanged: the shard resumes from the rows it stored (row-level resume),
so nothing needs saving at the signal. submitit pickles the job function (our own code and the
RunConfig, with cloudpickle) and the tasks unpickle it: that is code we wrote, running on a cluster
we submit to, not input from elsewhere; the run's prompts and options stay data. The nodes must see
the run folder and this Python environment at the same paths (a shared file system).

``executor='local'`` runs the array on this machine (submitit's LocalExecutor), for tests.
"""
from __future__ import annotations

import sys
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from .config import RunConfig, RunError, cli
from .rows import atomic_write, dumps

SLURM_CONFIG_VERSION = 1
EXECUTORS = ("slurm", "local")


@dataclass
class SlurmConfig:
    """Where and how the array runs; round-trips to JSON."""

    executor: str = field(default="slurm", metadata=cli(
        "'slurm', or 'local': the array on this machine (submitit's LocalExecutor; tests)", choices=EXECUTORS))
    partition: str | None = field(default=None, metadata=cli("Slurm partition"))
    time_min: int = field(default=240, metadata=cli(
        "minutes per task; a task that runs out is requeued and resumes its rows"))
    gpus_per_task: int = field(default=1, metadata=cli("GPUs per task (more than 1 with the run's --device-map auto)"))
    cpus_per_task: int = field(default=8, metadata=cli("CPU cores per task"))
    mem_gb: int | None = field(default=None, metadata=cli("memory per task, GB", default_note="the partition's"))
    account: str | None = field(default=None, metadata=cli("Slurm account"))
    qos: str | None = field(default=None, metadata=cli("Slurm QOS"))
    constraint: str | None = field(default=None, metadata=cli("Slurm constraint (e.g. h100)"))
    array_parallelism: int | None = field(default=None, metadata=cli(
        "at most this many tasks at once", default_note="all"))
    max_timeouts: int = field(default=3, metadata=cli(
        "requeues after a time-out (preemptions requeue regardless)"))
    setup: list[str] = field(default_factory=list, metadata=cli(
        "shell lines each task runs first (e.g. 'module load cuda')"))

    def to_json(self) -> dict:
        return {"version": SLURM_CONFIG_VERSION, **asdict(self)}

    @classmethod
    def from_json(cls, d: dict) -> "SlurmConfig":
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known - {"version"}
        if unknown:
            raise ValueError(f"unknown SlurmConfig field(s) {sorted(unknown)}; known: {sorted(known)}")
        return cls(**{k: v for k, v in d.items() if k in known})

    def validate(self) -> None:
        if self.executor not in EXECUTORS:
            raise RunError(f"--executor '{self.executor}' is not one of {', '.join(EXECUTORS)}")
        for name in ("time_min", "cpus_per_task", "array_parallelism", "mem_gb"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise RunError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
        if self.gpus_per_task < 0 or self.max_timeouts < 0:
            raise RunError("--gpus-per-task and --max-timeouts must be >= 0")

    def parameters(self) -> dict:
        """submitit AutoExecutor parameters (``slurm_`` ones are ignored by the local executor)."""
        p = {"timeout_min": self.time_min, "gpus_per_node": self.gpus_per_task, "tasks_per_node": 1, "nodes": 1,
             "cpus_per_task": self.cpus_per_task, "name": "harness"}
        if self.mem_gb is not None:
            p["mem_gb"] = self.mem_gb
        for name in ("partition", "account", "qos", "constraint", "array_parallelism"):
            if getattr(self, name) is not None:
                p[f"slurm_{name}"] = getattr(self, name)
        if self.setup:
            p["slurm_setup" if self.executor == "slurm" else "local_setup"] = list(self.setup)
        return p


def _submitit():
    try:
        import submitit
    except ModuleNotFoundError:
        raise RunError("harness launch --slurm needs submitit: pip install '.[scale]'") from None
    return submitit


class ShardJob:
    """What each array task runs: shard ``index`` of ``count`` of the run in ``out``. Checkpointable:
    submitit requeues it unchanged after a preemption or time-out, and the shard resumes its rows."""

    def __init__(self, config: dict, out: str):
        self.config, self.out = config, out  # JSON, so the pickle holds data and a reference to this class

    def __call__(self, index: int, count: int) -> str:
        from .runner import run
        from .shard import Shard

        run(RunConfig.from_json(self.config), out=Path(self.out), shard=Shard(index, count, "slurm array"),
            progress=False)
        return f"shard {index} of {count} done"

    def checkpoint(self, *args, **kwargs):
        """submitit's hook at preemption/time-out: resubmit the same call (rows already stored are kept)."""
        return _submitit().helpers.DelayedSubmission(self, *args, **kwargs)


def executor(out: Path, slurm: SlurmConfig):
    submitit = _submitit()
    ex = submitit.AutoExecutor(folder=out / "slurm" / "%j", cluster=slurm.executor,
                               slurm_max_num_timeout=slurm.max_timeouts, local_max_num_timeout=slurm.max_timeouts)
    ex.update_parameters(**slurm.parameters())
    return ex


def submit(config: RunConfig, out: Path, count: int, slurm: SlurmConfig, detach: bool = False,
           quiet: bool = False) -> int:
    """Submit the shards of ``out`` not yet complete as one array; wait (with one progress line) unless
    ``detach``. Returns launch's exit status."""
    from .launch import complete_shards, wait_all

    atomic_write(out / "slurm.json", dumps(slurm.to_json(), indent=2) + "\n")
    todo = [i for i in range(count) if i not in complete_shards(out, count)]
    ex = executor(out, slurm)
    job = ShardJob(config.to_json(), str(out))
    jobs = ex.map_array(job, todo, [count] * len(todo)) if todo else []
    ids = ", ".join(j.job_id for j in jobs)
    print(f"submitted {len(jobs)} of {count} shards ({ids or 'all were complete'}); logs in {out / 'slurm'}",
          file=sys.stderr)
    if detach:
        print(f"follow with: harness report {out}")
        return 0

    def error(j) -> str | None:
        try:
            e = j.exception()
        except Exception as e_:  # submitit: the job never completed (killed, cancelled)
            e = e_
        return None if e is None else " ".join(str(e).split())[-300:]

    def poll(j):
        return None if not j.done() else 0 if error(j) is None else 1

    def failure(i, j):
        return f"{error(j)} (logs: {j.paths.stderr})"

    return wait_all(out, dict(zip(todo, jobs)), count, quiet, poll, failure)
