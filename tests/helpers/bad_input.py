"""What the bad-input tables share (tests/harness/run/test_bad_input.py, test_hostile_input.py): a command run
in process that must answer with one line and exit code 2, argv templates filled in, and the command of a
small finished run on the tiny checkpoint."""
from __future__ import annotations

from pathlib import Path

from harness.cli.main import main


def one_line(capsys, argv) -> str:
    """``harness ARGV`` in process: exit code 2 and one line on stderr, no traceback; returns that line."""
    rc = main(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 2, (rc, err)
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def fill(argv, **where) -> list[str]:
    return [a.format(**where) for a in argv]


def tiny_run_argv(checkpoint: Path, prompts: Path | str, out: Path) -> list[str]:
    """A perplexity run of one prompt of ``prompts`` with kivi at 2 bits on the tiny checkpoint, into ``out``."""
    return ["run", "--model", "hf", "--model-path", str(checkpoint), "--task", "perplexity", "--codec", "kivi",
            "--bits", "2", "--prompts", str(prompts), "--limit", "1", "--residual", "8", "--device", "cpu",
            "--task-opt", "perplexity.context=140", "--task-opt", "perplexity.prefix=60",
            "--task-opt", "perplexity.chunk=20", "--out", str(out)]
