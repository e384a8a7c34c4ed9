"""What stands in a run folder where the harness writes or reads (issues #40, #41): a link, symbolic or hard,
where a run appends; a pipe, a device or a folder in place of a lock, a file or a stored baseline; a file larger
than any the harness writes. Each is answered with one line naming it and the fix, before the model loads where
the folder shows it, and nothing outside the folder is written or read."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from helpers.bad_input import one_line, tiny_run_argv

from harness.run.folder import RunFolder


# --- links where a run appends ----------------------------------------------------------------------------
LINKS = ["rows.jsonl", "speed.jsonl", "timings.jsonl", "rows.shard-1-of-2.jsonl", "speed.shard-0-of-2.jsonl",
         "timings.shard-0-of-2.jsonl", "baselines", "video"]


@pytest.mark.parametrize("name", LINKS)
def test_a_link_where_a_run_appends_is_refused_before_the_model_loads(name, finished_run, tmp_path, capsys,
                                                                      no_model_loads, monkeypatch):
    monkeypatch.delenv("HARNESS_DEBUG", raising=False)
    run = tmp_path / "run"
    shutil.copytree(finished_run, run, symlinks=True)
    outside = tmp_path / "outside"
    if "." in name:
        outside.write_text("the user's own file\n")
    else:
        outside.mkdir()
    if (run / name).is_dir():
        shutil.rmtree(run / name)
    (run / name).unlink(missing_ok=True)
    os.symlink(outside, run / name)
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file() and not p.is_symlink()}
    config = json.loads((run / "config.json").read_text())
    line = one_line(capsys, tiny_run_argv(config["model_path"], config["prompts"], run))
    assert f"{run / name} is a symbolic link" in line and "delete the link" in line
    assert (outside.read_text() == "the user's own file\n") if "." in name else not any(outside.iterdir())
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file() and not p.is_symlink()} == before


@pytest.mark.parametrize("name", [n for n in LINKS if n.endswith(".jsonl")])
def test_a_hard_link_where_a_run_appends_is_refused_before_the_model_loads(name, finished_run, tmp_path, capsys,
                                                                           no_model_loads, monkeypatch):
    """Issue 41: O_NOFOLLOW stops symbolic links only; a hard link at rows.jsonl (an outside file's second name)
    was cut and appended to on resume. Now one line, and the outside file as it was."""
    monkeypatch.delenv("HARNESS_DEBUG", raising=False)
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    outside = tmp_path / "outside"
    outside.write_text("the user's own file\na torn line")
    (run / name).unlink(missing_ok=True)
    os.link(outside, run / name)
    config = json.loads((run / "config.json").read_text())
    line = one_line(capsys, tiny_run_argv(config["model_path"], config["prompts"], run))
    assert f"{run / name} has 2 hard links" in line and "give it a copy of its own" in line, line
    assert outside.read_text() == "the user's own file\na torn line"


def test_what_a_run_writes_in_place_is_a_regular_file_of_one_name(tmp_path):
    """The one opener of every in-place write (rows.open_file: append_line, the torn-line cut, the shards'
    logs) refuses a symbolic link, a hard link and a pipe, without blocking on the pipe."""
    from harness.run.rows import UnsafePath, append_line, cut_torn_line

    outside = tmp_path / "outside"
    outside.write_text("mine\npartial")
    os.symlink(outside, tmp_path / "sym.jsonl")
    os.link(outside, tmp_path / "hard.jsonl")
    os.mkfifo(tmp_path / "pipe.jsonl")
    for name, says in (("sym.jsonl", "is a symbolic link"), ("hard.jsonl", "has 2 hard links"),
                       ("pipe.jsonl", "is not a regular file")):
        for write in (lambda p: append_line(p, "{}"), cut_torn_line):
            with pytest.raises(UnsafePath, match=says):
                write(tmp_path / name)
    assert outside.read_text() == "mine\npartial"
    append_line(tmp_path / "own.jsonl", "{}")  # a new file of one name is written
    assert (tmp_path / "own.jsonl").read_text() == "{}\n"


@pytest.mark.parametrize("plant", ["pipe", "dev-zero", "folder"])
def test_a_baseline_that_is_no_file_gets_one_line_on_resume(plant, finished_run, tmp_path, capsys, no_model_loads,
                                                            monkeypatch):
    """Issue 41: a pipe at a stored baseline hung a resumed run, and a link to /dev/zero read until memory ran out.
    Now one line naming the file before the model loads (and baseline_io reads only a regular file of its own
    name)."""
    monkeypatch.delenv("HARNESS_DEBUG", raising=False)
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    [baseline] = (run / "baselines").rglob("*.safetensors")
    baseline.unlink()
    {"pipe": os.mkfifo, "dev-zero": lambda p: os.symlink("/dev/zero", p), "folder": os.mkdir}[plant](baseline)
    rows = (run / "rows.jsonl").read_text().splitlines()
    (run / "rows.jsonl").write_text(rows[0] + "\n")  # rows left to compute: the baseline is read back
    config = json.loads((run / "config.json").read_text())
    line = one_line(capsys, tiny_run_argv(config["model_path"], config["prompts"], run))
    assert f"baseline {baseline} is not a regular file" in line and "delete it" in line, line
    from harness.tasks.baseline_io import BaselineFormatError, load_tree

    with pytest.raises(BaselineFormatError, match="is not a regular file"):
        load_tree(baseline)  # as it reads, where a file is planted after the claim


def test_a_run_file_too_large_to_be_the_harness_s_is_refused(finished_run, tmp_path, capsys, no_model_loads,
                                                             monkeypatch):
    """A sparse giant in place of rows.jsonl (or any JSON the harness reads) is refused from its size, not read."""
    from harness.run.input_files import FILE_LIMIT

    monkeypatch.delenv("HARNESS_DEBUG", raising=False)
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    for name in ("rows.jsonl", "registry.json"):
        with open(run / name, "r+b") as f:
            f.truncate(FILE_LIMIT + 1)  # sparse: no disk used
    assert "rows.jsonl: over 1024 MiB, larger than any rows file" in one_line(capsys, ["report", str(run)])
    (run / "rows.jsonl").write_bytes((finished_run / "rows.jsonl").read_bytes())
    assert "registry.json: over 64 MiB, larger than any registry.json" in one_line(capsys, ["report", str(run)])


# found beyond the list: what stands in a run folder in place of a lock or a file the harness reads
def _fifo(path: Path) -> None:
    os.mkfifo(path)  # a reader blocks until a writer comes: a read of it never ends


def _link_out(path: Path) -> None:
    outside = path.parent.parent / "outside"
    outside.write_text("the user's own file\n")
    os.symlink(outside, path)


PLANTED = [  # (id, name, how it is planted, the commands, what the one line says)
    ("lock-a-link", ".lock", _link_out, ("run", "report"), "/.lock is not a lock the harness made"),
    ("lock-a-pipe", ".lock", _fifo, ("run", "report"), "/.lock is not a "),  # a lock the harness made; regular file
    ("registry-a-pipe", "registry.json", _fifo, ("run", "report", "compare"),
     "/registry.json is not a regular file (a device, a pipe or a folder, or a link to one)"),
    ("config-a-pipe", "config.json", _fifo, ("run",), "/config.json is not a regular file"),
    ("summary-a-folder", "summary.json", lambda p: p.mkdir(), ("report", "compare"),
     "/summary.json is not a regular file"),
]


def _identity(path: Path) -> tuple:
    """What a write or a replacement changes of a file or link (not its access time, which reading a link may
    move on this filesystem's relatime rule: a whole-stat comparison failed only now and then)."""
    st = path.lstat()
    return st.st_ino, st.st_mode, st.st_nlink, st.st_size, st.st_mtime_ns


@pytest.mark.parametrize("name, plant, commands, says", [c[1:] for c in PLANTED], ids=[c[0] for c in PLANTED])
def test_a_planted_lock_or_file_gets_one_line_and_is_left(name, plant, commands, says, finished_run, tmp_path,
                                                          capsys, no_model_loads, monkeypatch):
    """Never waited on (a lock no process holds), never read (a pipe blocks; a device never ends), never written
    through: one line for `harness run` (before the model loads), `harness report` and `harness compare`."""
    monkeypatch.delenv("HARNESS_DEBUG", raising=False)
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    (run / name).unlink(missing_ok=True)
    plant(run / name)
    planted = _identity(run / name)
    config = json.loads(RunFolder(finished_run).config.read_text())
    argv = {"run": tiny_run_argv(config["model_path"], config["prompts"], run), "report": ["report", str(run)],
            "compare": ["compare", str(finished_run), str(run)]}
    for command in commands:
        assert says in one_line(capsys, argv[command]), command
    assert _identity(run / name) == planted  # left as it was planted: not replaced, nothing written through it
    if (run / name).is_symlink():
        assert (tmp_path / "outside").read_text() == "the user's own file\n"
