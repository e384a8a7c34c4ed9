"""harness/scale/slurm.py: the cluster options round-trip; `harness launch --slurm` runs the shards as a
job array through submitit's local executor, a task preempted midway (SIGUSR2, as Slurm sends it)
is requeued through the checkpoint hook and resumes its rows, and the merge is the single process's
bytes."""
from __future__ import annotations

import json
import os
import pickle
import signal
import threading
import time
from pathlib import Path

import pytest
from helpers.checkout_env import pythonpath
from helpers.run_folder import run_bytes

from harness.cli.main import main
from harness.run.config import RunError
from harness.run.lock import holder
from harness.run.rows import read_rows
from harness.scale.shard import Shard
from harness.scale.slurm import ShardJob, SlurmConfig

ROOT = Path(__file__).resolve().parents[3]
FILES = ("rows.jsonl", "summary.json", "report.md", "config.json")


def test_slurm_config_round_trip_and_parameters():
    c = SlurmConfig(partition="gpu", time_min=90, gpus_per_task=2, mem_gb=64, qos="high", array_parallelism=4,
                    setup=["module load cuda"])
    assert SlurmConfig.from_json(json.loads(json.dumps(c.to_json()))) == c
    assert c.parameters() == {"timeout_min": 90, "gpus_per_node": 2, "tasks_per_node": 1, "nodes": 1,
                              "cpus_per_task": 8, "name": "harness", "mem_gb": 64, "slurm_partition": "gpu",
                              "slurm_qos": "high", "slurm_array_parallelism": 4, "slurm_setup": ["module load cuda"]}
    with pytest.raises(ValueError, match="unknown SlurmConfig field"):
        SlurmConfig.from_json({**c.to_json(), "nodes": 3})
    for bad in (dict(time_min=0), dict(executor="pbs"), dict(gpus_per_task=-1), dict(mem_gb=0)):
        with pytest.raises(RunError):
            SlurmConfig(**bad).validate()


def test_the_checkpoint_hook_resubmits_the_same_shard():
    from harness.runner import run

    job = ShardJob({"model": "hf"}, "/runs/x", run)
    again = job.checkpoint(1, 3)
    assert again.function is job and again.args == (1, 3) and again.kwargs == {}
    assert pickle.loads(pickle.dumps(job)).run is run  # the run loop travels by reference, as data


@pytest.mark.slow
def test_a_local_array_with_a_preempted_task_merges_to_the_single_process(tmp_path, monkeypatch, capsys):
    pytest.importorskip("submitit")
    from helpers.tiny_lm import save_tiny_checkpoint

    ckpt = save_tiny_checkpoint(tmp_path / "ckpt")
    text = tmp_path / "t.txt"
    text.write_text("The cat sat on the mat and looked at the dog. " * 100)
    args = ["--model", "hf", "--model-path", str(ckpt), "--task", "perplexity", "--prompts", str(text), "--limit", "4",
            "--codec", "octopus", "--bits", "2", "3", "--codec-seeds", "0", "--residual", "8",
            *(x for o in ("context=100", "prefix=40", "chunk=20", "batch=1") for x in ("--task-opt", f"perplexity.{o}"))]
    single = tmp_path / "single"
    assert main(["run", *args, "--quiet", "--out", str(single)]) == 0

    monkeypatch.setenv("PYTHONPATH", pythonpath())  # the tasks import this checkout's harness
    out = tmp_path / "run"
    result = {}
    launcher = threading.Thread(target=lambda: result.setdefault("rc", main(
        ["launch", "--slurm", "--executor", "local", "--shards", "2", "--time-min", "60", "--quiet", "--", *args,
         "--out", str(out)])))
    launcher.start()
    victim = Shard(1, 2)
    deadline = time.monotonic() + 300  # a condition polled, with a generous deadline
    while not read_rows(out / victim.rows_name):  # the task has stored a row: preempt it
        assert launcher.is_alive() and time.monotonic() < deadline
        time.sleep(0.05)
    who = holder(out / victim.lock_name)
    assert who is not None, "shard 1 ended before it could be preempted"
    os.kill(who[0], signal.SIGUSR2)
    launcher.join(timeout=300)
    assert result.get("rc") == 0, capsys.readouterr().err
    assert run_bytes(out, FILES) == run_bytes(single, FILES)
    assert SlurmConfig.from_json(json.loads((out / "slurm.json").read_text())) == SlurmConfig(executor="local",
                                                                                             time_min=60)
    logs = {p: p.read_text() for p in (out / "slurm").rglob("*_log.*")}
    preempted = [p for p, t in logs.items() if p.name.endswith("_log.err") and "this job is preempted" in t]
    assert len(preempted) == 1, logs.keys()
    both = logs[preempted[0]] + logs[Path(str(preempted[0]).replace("_log.err", "_log.out"))]
    # requeued by the checkpoint hook, loaded again, and only the rows it had not stored were run
    assert "Calling checkpoint method" in both and "Requeued job" in both and both.count("loading hf") == 2
