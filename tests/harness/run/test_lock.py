"""harness/run/lock.py with a real process holding the lock: a second writer on its run folder stops with one
line and exit code 2; the lock left by the holder, killed, is taken over; the lock goes on exit, errors
included. The writers run in process (``harness.cli.main.main``): the lock's subject is the other process."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers.checkout_env import checkout_env
from helpers.tiny_lm import save_tiny_checkpoint

from harness.cli.main import main
from harness.run.lock import RunLock, RunLocked
from harness.run.folder import RunFolder

ROOT = Path(__file__).resolve().parents[3]
HOLD = "import sys; from harness.run.lock import RunLock\nwith RunLock(sys.argv[1]):\n    print('held', flush=True)\n    sys.stdin.read()\n"


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return save_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny")


def _run_args(ckpt, text, out):
    return ["run", "--model", "hf", "--model-path", str(ckpt), "--codec", "octopus", "--bits", "2", "--task",
            "perplexity", "--prompts", str(text), "--limit", "1", "--residual", "8", "--quiet", "--task-opt",
            "perplexity.context=100", "--task-opt", "perplexity.prefix=40", "--task-opt", "perplexity.chunk=20", "--codec-seeds", "0",
            "--out", str(out)]


def test_second_writer_is_refused_and_a_stale_lock_taken_over(ckpt, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("HARNESS_DEBUG", raising=False)
    text = tmp_path / "t.txt"
    text.write_text("The cat sat on the mat and looked at the dog. " * 30)
    out = tmp_path / "run"
    out.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], cwd=ROOT, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=checkout_env())
    try:
        assert holder.stdout.readline().strip() == "held"
        capsys.readouterr()
        assert main(_run_args(ckpt, text, out)) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and f"is being written by process {holder.pid}" in lines[0], lines
        assert sorted(p.name for p in out.iterdir()) == [RunFolder.LOCK]  # nothing written by the second
    finally:
        holder.kill()  # killed: its lock stays behind, stale
        holder.wait()
    assert (out / RunFolder.LOCK).read_text().split()[0] == str(holder.pid)
    assert main(_run_args(ckpt, text, out)) == 0
    assert f"note: took over the lock {out / RunFolder.LOCK}: process {holder.pid} on" in capsys.readouterr().err
    assert len((out / "rows.jsonl").read_text().splitlines()) == 2 and not (out / RunFolder.LOCK).exists()


@pytest.mark.parametrize("text", ["", "garbage here\n", "\0\0\0"])
def test_a_lock_without_an_owner_line_is_taken_over_once_it_is_old(text, ckpt, tmp_path, capsys, monkeypatch):
    """Issue 41: an empty lock (a full disk between its creation and its line) made run and report wait 600 s
    in silence. Made UNWRITTEN_S ago or longer it is taken over at once, with a line; one made this instant is
    being written (its maker writes the line right after creating it) and is waited for as before."""
    import os
    import time

    from harness.run.lock import UNWRITTEN_S

    monkeypatch.delenv("HARNESS_DEBUG", raising=False)
    (tmp_path / "t.txt").write_text("The cat sat on the mat and looked at the dog. " * 30)
    out = tmp_path / "run"
    out.mkdir()
    lock = out / RunFolder.LOCK
    lock.write_text(text)
    ahead = time.time() + 60  # made 'now' by a host whose clock leads ours: never judged older than it is
    os.utime(lock, (ahead, ahead))
    with pytest.raises(RunLocked, match="is being written by another process"):
        RunLock(out).acquire()  # this instant: its maker may be writing it
    past = time.time() - 2 * UNWRITTEN_S
    os.utime(lock, (past, past))
    assert main(_run_args(ckpt, tmp_path / "t.txt", out)) == 0
    assert f"note: took over the lock {lock}: it held no owner" in capsys.readouterr().err
    lock.write_text(text)
    os.utime(lock, (past, past))
    assert main(["report", str(out)]) == 0
    assert "note: took over the lock" in capsys.readouterr().err and not lock.exists()


def test_lock_is_released_on_errors(tmp_path):
    with pytest.raises(KeyError):
        with RunLock(tmp_path):
            assert (tmp_path / RunFolder.LOCK).exists()
            with pytest.raises(RunLocked, match="is being written by process"):
                RunLock(tmp_path).acquire()  # a live pid (this one) on this host
            raise KeyError("boom")
    assert not (tmp_path / RunFolder.LOCK).exists()


def test_two_processes_taking_over_one_stale_lock_leave_one_owner(tmp_path, monkeypatch):
    """Issue #40: A and B both read a stale lock; A takes it over and holds its own; B, acting on what it read
    before, must not remove A's lock and take one too (both would run: rows repeated)."""
    import harness.run.lock as lock_mod

    path = tmp_path / RunFolder.LOCK
    a = RunLock(tmp_path)
    path.write_text("999999999 " + __import__("socket").gethostname() + " run\n")  # a pid that is gone: stale
    seen = lock_mod.owner(path)
    assert lock_mod.stale(path, seen)
    a.acquire()  # A took the stale lock over
    try:
        real = lock_mod.owner
        calls = []

        def late(p):  # B's first read of the lock is the stale owner it saw before A took it over
            calls.append(p)
            return seen if len(calls) == 1 else real(p)

        monkeypatch.setattr(lock_mod, "owner", late)
        who = RunLock(tmp_path).try_acquire()
        monkeypatch.setattr(lock_mod, "owner", real)
        assert who is not None and who[0] == __import__("os").getpid()  # B found A's lock, live
        assert path.read_text() == a.mine and sorted(p.name for p in tmp_path.iterdir()) == [RunFolder.LOCK]
    finally:
        a.release()
    assert not path.exists()
