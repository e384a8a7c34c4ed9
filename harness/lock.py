"""One writer per run folder: ``out/.lock`` holds the owner's pid and host.

Created with O_CREAT | O_EXCL, so of two processes starting on one folder exactly one gets it; the
other stops with :class:`RunLocked`. A lock left by a killed process (its pid is not alive on
this host) is stale and taken over. The lock is removed on exit, exceptions included.
"""
from __future__ import annotations

import os
import socket
from pathlib import Path

LOCK_NAME = ".lock"


class RunLocked(ValueError):
    """Another live process writes this run folder."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _owner(path: Path) -> tuple[int, str] | None:
    """(pid, host) written in the lock file; None where it is unreadable or empty."""
    try:
        pid, host = path.read_text().split()[:2]
        return int(pid), host
    except (OSError, ValueError):
        return None


class RunLock:
    """``with RunLock(out):`` holds ``out/.lock`` for the block (``out`` must exist)."""

    def __init__(self, out: Path):
        self.path = Path(out) / LOCK_NAME
        self.mine = f"{os.getpid()} {socket.gethostname()}\n"

    def acquire(self) -> None:
        for _ in range(3):  # create; else take over a stale lock and create again
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                owner = _owner(self.path)
                here = socket.gethostname()
                if owner is not None and owner[1] == here and not _alive(owner[0]):
                    self.path.unlink(missing_ok=True)  # a killed run's lock
                    continue
                who = f"process {owner[0]} on {owner[1]}" if owner else "another process"
                raise RunLocked(f"{self.path.parent} is being written by {who} (lock {self.path}); wait for "
                                f"it to finish or pass another --out (delete the lock only if that process "
                                f"is gone)") from None
            with os.fdopen(fd, "w") as f:
                f.write(self.mine)
            return
        raise RunLocked(f"could not take the lock {self.path}: it keeps being recreated; pass another --out")

    def release(self) -> None:
        try:
            if self.path.read_text() == self.mine:
                self.path.unlink()
        except FileNotFoundError:
            pass

    def __enter__(self) -> "RunLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
