"""harness/scale/launch.py with real processes on the CPU: `harness launch --procs 2` runs two shards and
merges to the single process's bytes; a shard killed midway fails the launch (exit 1, the shard and
its log named, the report naming what is missing) and the same command resumes it; torchrun's
RANK/WORLD_SIZE shard `harness run` the same way; bad launches stop with one line."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.checkout_env import checkout_env
from helpers.run_folder import run_bytes
from helpers.tiny_lm import save_tiny_checkpoint

from harness.cli.main import main
from harness.cli.launch import split
from harness.scale.launch import gpu_list
from harness.run.config import RunError
from harness.run.lock import owner
from harness.run.rows import read_rows
from harness.scale.shard import Shard

ROOT = Path(__file__).resolve().parents[3]
FILES = ("rows.jsonl", "summary.json", "report.md", "config.json")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return save_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny")


@pytest.fixture(scope="module")
def args(ckpt, tmp_path_factory):
    text = tmp_path_factory.mktemp("text") / "t.txt"
    text.write_text("The cat sat on the mat and looked at the dog. " * 100)
    # 4 perplexity prompts one by one (4 batches, 2 a shard) x 3 configurations: a shard runs for seconds;
    # on the CPU, where --procs puts its shards, also on a GPU machine (the single run too)
    return ["--model", "hf", "--model-path", str(ckpt), "--device", "cpu", "--task", "perplexity", "--prompts", str(text),
            "--limit", "4",
            "--codec", "octopus", "--bits", "2", "3", "--codec-seeds", "0", "--residual", "8",
            *(x for o in ("context=100", "prefix=40", "chunk=20", "batch=1") for x in ("--task-opt", f"perplexity.{o}"))]


@pytest.fixture(scope="module")
def single(args, tmp_path_factory):
    out = tmp_path_factory.mktemp("single") / "run"
    assert main(["run", *args, "--quiet", "--out", str(out)]) == 0
    return out


def _bytes(out):
    return run_bytes(out, FILES)


def _env():
    return checkout_env()


def test_two_processes_merge_and_a_killed_shard_resumes(args, single, tmp_path, capsys, monkeypatch):
    """The shards are processes; the launcher runs in a thread here (what it prints is the same)."""
    import threading

    monkeypatch.delenv("HARNESS_DEBUG", raising=False)
    out = tmp_path / "run"
    result = {}
    first = threading.Thread(target=lambda: result.setdefault("rc", main(
        ["launch", "--procs", "2", "--quiet", "--", *args, "--out", str(out)])))
    first.start()
    victim = Shard(1, 2)
    deadline = time.monotonic() + 240  # a condition polled, with a generous deadline
    while not read_rows(out / victim.rows_name):  # shard 1 has stored a row: kill it mid-run
        assert first.is_alive() and time.monotonic() < deadline, capsys.readouterr().err
        time.sleep(0.05)
    pid = owner(out / victim.lock_name)[0]
    os.kill(pid, signal.SIGKILL)
    first.join(timeout=240)
    err = capsys.readouterr().err
    assert not first.is_alive() and result.get("rc") == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("harness launch: shard 1 of 2 failed: exit -9") and \
        f"log: {out / 'logs' / 'shard-1-of-2.log'}" in lines[0] and "rerun the same command" in lines[0], err
    md = (out / "report.md").read_text()
    assert "**Incomplete**" in md and "shard 1 of 2 has" in md and "(stopped)" in md
    assert (out / victim.lock_name).exists()  # left by the killed process, stale: taken over below

    assert main(["launch", "--procs", "2", "--quiet", "--", *args, "--out", str(out)]) == 0  # the same command
    assert f"report: {out / 'report.md'}" in capsys.readouterr().out
    assert _bytes(out) == _bytes(single)
    assert sorted(p.name for p in out.glob("rows*")) == ["rows.jsonl"] and not list(out.glob(".lock*"))
    # the complete shard 0 was not started again; shard 1 resumed (its log holds both attempts)
    assert (out / "logs" / "shard-0-of-2.log").read_text().count("loading hf") == 1
    assert (out / "logs" / "shard-1-of-2.log").read_text().count("loading hf") == 2


def test_torchrun_shards_harness_run(args, single, tmp_path):
    """The documented `torchrun --nproc-per-node 2 -m harness.cli run ...`: RANK/WORLD_SIZE pick the shards."""
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                        "-m", "harness.cli", "run", *args, "--quiet", "--out", str(out)], cwd=ROOT, env=_env(),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert _bytes(out) == _bytes(single)


def test_bad_launches_stop_with_one_line(args, tmp_path, capsys):
    for argv, message in (
        (["--procs", "2"], "needs the run's arguments after '--'"),
        (["--procs", "2", "--", *args, "--shard", "0/2"], "--shard is set per process by harness launch"),
        (["--procs", "0", "--", *args], "--procs must be >= 1"),
        (["--procs", "100000", "--", *args], "--procs 100000 is more than the .* CPU cores here; use at most"),
        (["--procs", "2", "--", *args, "--device", "cuda"], "CUDA is not available|--procs runs on the CPU"),
        (["--procs", "2", "--shards", "3", "--", *args], "--shards and --detach go with --slurm"),
        (["--slurm", "--", *args], "--slurm needs --shards N"),
        (["--procs", "2", "--", *args, "--codec", "nope"], "Unknown codec 'nope'"),
    ):
        assert main(["launch", *argv, "--out", str(tmp_path / "x")]) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("harness launch: error:") and re.search(message, err[0]), err
    assert not (tmp_path / "x").exists()  # nothing started, nothing written


def _plant_logs(run: Path, outside: Path, how: str) -> None:
    """A link where `harness launch` writes its shards' logs: the logs folder, or a log, linked outside."""
    if how == "folder-link":
        outside.mkdir()
        os.symlink(outside, run / "logs")
        return
    outside.write_text("the user's own file\n")
    (run / "logs").mkdir(exist_ok=True)
    (os.symlink if how == "log-link" else os.link)(outside, run / "logs" / "shard-0-of-2.log")


@pytest.mark.parametrize("how, says", [("folder-link", "logs is a symbolic link"),
                                       ("log-link", "shard-0-of-2.log is a symbolic link"),
                                       ("log-hard-link", "shard-0-of-2.log has 2 hard links")])
def test_a_link_where_launch_logs_is_refused_before_a_shard_starts(how, says, args, single, tmp_path, capsys):
    """Issue 41: the shards' logs were appended through any link (a plain open(..., "a")): now one line, exit
    code 2, no process started and the outside file or folder as it was."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(single, run)
    (run / "rows.jsonl").write_text("")  # rows to compute: a launch would start its shards
    outside = tmp_path / "outside"
    _plant_logs(run, outside, how)
    assert main(["launch", "--procs", "2", "--", *args, "--out", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0] and err[0].startswith("harness launch: error:"), err
    assert (not any(outside.iterdir())) if outside.is_dir() else outside.read_text() == "the user's own file\n"
    assert (run / "rows.jsonl").read_text() == ""


def test_gpu_lists():
    env = {"CUDA_VISIBLE_DEVICES": "3,5,7"}
    assert gpu_list("2", env) == ["3", "5"] and gpu_list("0,2", env) == ["3", "7"] and gpu_list("1,", env) == ["5"]
    for spec, message in (("4", "3 GPU\\(s\\) are visible"), ("0,0", "each used once"), ("a", "indices"),
                          ("0", "no GPU named")):
        with pytest.raises(RunError, match=message):
            gpu_list(spec, env)
    with pytest.raises(RunError, match="no CUDA device is visible here; use --procs"):
        gpu_list("1", {"CUDA_VISIBLE_DEVICES": ""})
    assert split(["--procs", "2", "--", "--model", "hf", "--", "x"]) == (["--procs", "2"], ["--model", "hf", "--", "x"])


def test_launch_options_come_from_their_dataclasses():
    from harness.cli.launch import parse_launch
    from harness.scale.slurm import SlurmConfig

    a = parse_launch(["--slurm", "--shards", "4", "--partition", "gpu", "--time-min", "60", "--setup",
                      "module load cuda", "--executor", "local"])
    assert a.slurm and a.shards == 4 and a.gpus is None and a.procs is None
    assert a.cluster == SlurmConfig(executor="local", partition="gpu", time_min=60, setup=["module load cuda"])
    assert parse_launch(["--procs", "2"]).cluster == SlurmConfig()
    for argv in ([], ["--procs", "2", "--gpus", "0,1"], ["--slurm", "--procs", "2"], ["--procs", "2", "--executor",
                                                                                      "pbs"]):
        with pytest.raises(SystemExit) as e:  # exactly one of --gpus / --procs / --slurm; choices closed
            parse_launch(argv)
        assert e.value.code == 2, argv
