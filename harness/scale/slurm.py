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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

from tyro.conf import arg

from registry.versioned import VersionedJSON

from harness.run.config import RunConfig, RunError
from harness.run.flags import values
from harness.run.folder import RunFolder
from harness.run.rows import atomic_write, dumps
from harness.scale.shard import Shard

SLURM_CONFIG_VERSION = 1
EXECUTORS = ("slurm", "local")


@dataclass
class SlurmConfig(VersionedJSON, what="slurm config", version=SLURM_CONFIG_VERSION, versionless=True):
    """Where and how the array runs (each field's annotation declares its flag); round-trips to JSON
    (:class:`registry.versioned.VersionedJSON`)."""

    executor: Annotated[Literal[EXECUTORS], arg(
        help="'slurm', or 'local': the array on this machine (submitit's LocalExecutor; tests)")] = "slurm"
    partition: Annotated[str | None, arg(help="Slurm partition")] = None
    time_min: Annotated[int, arg(help="minutes per task; a task that runs out is requeued and resumes its rows")] = 240
    gpus_per_task: Annotated[int, arg(help="GPUs per task (more than 1 with the run's --device-map auto)")] = 1
    cpus_per_task: Annotated[int, arg(help="CPU cores per task")] = 8
    mem_gb: Annotated[int | None, arg(
        help="memory per task, GB", help_behavior_hint="(default: the partition's)")] = None
    account: Annotated[str | None, arg(help="Slurm account")] = None
    qos: Annotated[str | None, arg(help="Slurm QOS")] = None
    constraint: Annotated[str | None, arg(help="Slurm constraint (e.g. h100)")] = None
    array_parallelism: Annotated[int | None, arg(
        help="at most this many tasks at once", help_behavior_hint="(default: all)")] = None
    max_timeouts: Annotated[int, arg(help="requeues after a time-out (preemptions requeue regardless)")] = 3
    setup: Annotated[list[str], values(str, "--setup", "LINE"), arg(
        help="shell lines each task runs first (e.g. 'module load cuda')")] = field(default_factory=list)

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
    """What each array task runs: shard ``index`` of ``count`` of the run in ``out``, by ``run`` (the run
    loop, :func:`harness.runner.run`, given by the launcher; pickled by reference). Checkpointable:
    submitit requeues it unchanged after a preemption or time-out, and the shard resumes its rows."""

    def __init__(self, config: dict, out: str, run):
        self.config, self.out, self.run = config, out, run  # JSON and a function's name: data, no state

    def __call__(self, index: int, count: int) -> str:
        self.run(RunConfig.from_json(self.config), out=Path(self.out), shard=Shard(index, count, "slurm array"),
                 progress=False)
        return f"shard {index} of {count} done"

    def checkpoint(self, *args, **kwargs):
        """submitit's hook at preemption/time-out: resubmit the same call (rows already stored are kept)."""
        return _submitit().helpers.DelayedSubmission(self, *args, **kwargs)


def executor(out: Path, slurm: SlurmConfig):
    submitit = _submitit()
    ex = submitit.AutoExecutor(folder=RunFolder(out).slurm_dir / "%j", cluster=slurm.executor,
                               slurm_max_num_timeout=slurm.max_timeouts, local_max_num_timeout=slurm.max_timeouts)
    ex.update_parameters(**slurm.parameters())
    return ex


def submit(config: dict, out: Path, todo: list[int], count: int, slurm: SlurmConfig, run) -> dict:
    """Submit shards ``todo`` of ``count`` of the run in ``out`` (``config``: its config.json) as one array
    of ``run`` (:class:`ShardJob`; the options kept in ``out/slurm.json``): shard index -> its submitit job,
    for :func:`job_status` and :func:`job_failure`."""
    atomic_write(RunFolder(out).slurm_json, dumps(slurm.to_json(), indent=2) + "\n")
    ex = executor(out, slurm)
    job = ShardJob(config, str(out), run)
    jobs = ex.map_array(job, todo, [count] * len(todo)) if todo else []
    ids = ", ".join(j.job_id for j in jobs)
    print(f"submitted {len(jobs)} of {count} shards ({ids or 'all were complete'}); logs in {RunFolder(out).slurm_dir}",
          file=sys.stderr)
    return dict(zip(todo, jobs))


def job_error(job) -> str | None:
    """Why a finished job failed (its exception, on one line), or None where it succeeded."""
    try:
        e = job.exception()
    except Exception as e_:  # submitit: the job never completed (killed, cancelled)
        e = e_
    return None if e is None else " ".join(str(e).split())[-300:]


def job_status(job) -> int | None:
    """A job's exit status for the launcher's wait: None while it runs, 0 done, 1 failed."""
    return None if not job.done() else 0 if job_error(job) is None else 1


def job_failure(index: int, job) -> str:
    """A failed job in one line, with where its log is."""
    return f"{job_error(job)} (logs: {job.paths.stderr})"
