"""harness/lock.py with real processes: a second writer on a run folder stops with one line and
exit code 2; a lock left by a killed process is taken over; the lock goes on exit, errors included."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from checkout_env import checkout_env
from tiny_lm import save_tiny_checkpoint

from harness.lock import LOCK_NAME, RunLock, RunLocked

ROOT = Path(__file__).resolve().parents[2]
HOLD = "import sys; from harness.lock import RunLock\nwith RunLock(sys.argv[1]):\n    print('held', flush=True)\n    sys.stdin.read()\n"


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return save_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny")


def _cli(*args) -> subprocess.CompletedProcess:
    env = checkout_env()
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)


def _run_args(ckpt, text, out):
    return ["run", "--model", "hf", "--model-path", str(ckpt), "--codec", "octopus", "--bits", "2", "--task",
            "perplexity", "--prompts", str(text), "--limit", "1", "--residual", "8", "--quiet", "--task-opt",
            "perplexity.context=100", "--task-opt", "perplexity.prefix=40", "--task-opt", "perplexity.chunk=20", "--codec-seeds", "0",
            "--out", str(out)]


def test_second_writer_is_refused_and_a_stale_lock_taken_over(ckpt, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("The cat sat on the mat and looked at the dog. " * 30)
    out = tmp_path / "run"
    out.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], cwd=ROOT, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=checkout_env())
    try:
        assert holder.stdout.readline().strip() == "held"
        second = _cli(*_run_args(ckpt, text, out))
        assert second.returncode == 2, second.stderr
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1 and f"is being written by process {holder.pid}" in lines[0], second.stderr
        assert sorted(p.name for p in out.iterdir()) == [LOCK_NAME]  # nothing written by the second
    finally:
        holder.kill()  # killed: its lock stays behind, stale
        holder.wait()
    assert (out / LOCK_NAME).read_text().split()[0] == str(holder.pid)
    third = _cli(*_run_args(ckpt, text, out))
    assert third.returncode == 0, third.stderr
    assert len((out / "rows.jsonl").read_text().splitlines()) == 2 and not (out / LOCK_NAME).exists()


def test_lock_is_released_on_errors(tmp_path):
    with pytest.raises(KeyError):
        with RunLock(tmp_path):
            assert (tmp_path / LOCK_NAME).exists()
            with pytest.raises(RunLocked, match="is being written by process"):
                RunLock(tmp_path).acquire()  # a live pid (this one) on this host
            raise KeyError("boom")
    assert not (tmp_path / LOCK_NAME).exists()
