"""Who writes a run folder: lock files holding the owner's pid, host and role.

``out/.lock`` is the folder's lock: a single-process run holds it for its whole length (role
``run``); the start of a shard, a merge and ``harness report`` hold it for moments (roles ``start``,
``merge``, ``report``) and other processes wait for those. Shard I of N holds ``out/.lock.shard-I-of-N``
while it runs (:mod:`harness.scale.shard`).

Created with O_CREAT | O_EXCL, so of two processes exactly one gets a lock; the other waits (a
brief role, up to ``wait`` seconds) or stops with :class:`RunLocked`. A held lock's modification
time is refreshed every ``HEARTBEAT_S`` seconds. A lock is stale, and taken over with a line on stderr,
when its owner is gone: on this host its pid is not alive; on another host (shards on several nodes
sharing the folder) its file has not been refreshed for ``STALE_S`` seconds; a lock without an owner
line (empty: a full disk) after ``UNWRITTEN_S``. Locks are removed on exit, exceptions included.
"""
from __future__ import annotations

import os
import socket
import stat
import sys
import threading
import time
from pathlib import Path

from harness.run.folder import RunFolder

BRIEF_ROLES = ("start", "merge", "report")
HEARTBEAT_S = 30.0
#: a lock from another host is stale after this long without a heartbeat (generous: clocks of two
#: hosts differ, and a file server may set the time)
STALE_S = 600.0
#: a lock file still without its owner line this long after it was made is left over (its maker writes the line
#: right after creating it): taken over, where it was waited on for the whole MERGE_WAIT_S in silence
UNWRITTEN_S = 5.0


def _pause(seconds: float) -> None:
    """How :meth:`RunLock.acquire` waits between tries (tests inject one that acts instead of sleeping)."""
    time.sleep(seconds)


def _next_beat(stop: threading.Event, seconds: float) -> bool:
    """Wait for the next heartbeat; True once the lock is released (tests inject one driven by events)."""
    return stop.wait(seconds)


class RunLocked(ValueError):
    """Another live process writes this run folder."""


class NotALock(RunLocked):
    """A file in a lock's place that the harness did not make (a link, a pipe): named, never waited on."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def owner(path: Path) -> tuple[int, str, str] | None:
    """(pid, host, role) written in the lock file; None where it is absent, unreadable or empty.
    Locks written before roles existed are role 'run'."""
    try:  # a lock is a short line in a regular file: a link, a pipe or a device in its place is never read
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        try:
            text = os.read(fd, 512) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
        finally:
            os.close(fd)
        parts = text.decode("utf-8").split()
        return int(parts[0]), parts[1], parts[2] if len(parts) > 2 else "run"
    except PermissionError:  # another user's lock: theirs, judged by its heartbeat as another host's is
        return 0, "?", "run"
    except (OSError, ValueError, IndexError):
        return None


def stale(path: Path, who: tuple[int, str, str] | None) -> bool:
    """Whether the lock at ``path`` held by ``who`` is left over from a process that is gone. A lock with no owner
    line (``who`` None: empty, or not the harness's words) is being written this instant, by a process that
    writes its line right after creating the file; older than ``UNWRITTEN_S`` it never will be (a full disk, a
    crash between the two), and it is stale."""
    if who is None:
        try:
            return time.time() - path.stat().st_mtime > UNWRITTEN_S  # a time ahead of ours (another host's): not yet
        except FileNotFoundError:
            return False
    pid, host, _ = who
    if host == socket.gethostname():
        return not _alive(pid)
    try:
        return time.time() - path.stat().st_mtime > STALE_S
    except FileNotFoundError:
        return False


def holder(path: Path) -> tuple[int, str, str] | None:
    """The live owner of the lock at ``path``; None where it is free or stale."""
    who = owner(path)
    return None if who is None or stale(Path(path), who) else who


def _take_over(path: Path, who: tuple[int, str, str]) -> None:
    """Remove the stale lock at ``path`` held by ``who``, and only that one: it is moved aside by an atomic
    rename first, and put back where it turns out to be another process's lock, made since ``who`` was read
    (two processes finding one stale lock: the first to take it over must not lose its new lock to the second)."""
    aside = path.with_name(f"{path.name}.{os.getpid()}.stale")
    try:
        os.rename(path, aside)
    except FileNotFoundError:  # another process took it over first
        return
    if owner(aside) != who:  # a live lock made since: back in place (unless a third process has one there now)
        try:
            os.link(aside, path)
        except FileExistsError:
            pass
        except OSError:  # a file system without hard links: a rename, where nothing has taken the place since
            if not path.exists():
                os.rename(aside, path)
    aside.unlink(missing_ok=True)


def describe(who: tuple[int, str, str] | None) -> str:
    return f"process {who[0]} on {who[1]}" if who and who[0] else "another process"


class RunLock:
    """``with RunLock(out):`` holds ``out/NAME`` for the block (``out`` must exist). ``role``: what
    the holder does (``run`` for a whole single-process run); ``wait``: seconds to wait for a
    holder in a brief role (BRIEF_ROLES) before giving up."""

    def __init__(self, out: Path, name: str = RunFolder.LOCK, role: str = "run", wait: float = 0.0):
        self.path = Path(out) / name
        self.mine = f"{os.getpid()} {socket.gethostname()} {role}\n"
        self.wait = wait
        self._stop: threading.Event | None = None

    def try_acquire(self) -> tuple[int, str, str] | None:
        """Take the lock if it is free or stale: None when taken, else its live owner."""
        for _ in range(3):  # create; else take over a stale lock and create again
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                if self.path.is_symlink() or not self.path.is_file():  # no lock of the harness's: never waited on
                    raise NotALock(f"{self.path} is not a lock the harness made (a symbolic link, or no regular "
                                    f"file); delete it, or pass another --out") from None
                who = owner(self.path)
                if stale(self.path, who):
                    _take_over(self.path, who)
                    why = f"{describe(who)} is gone" if who else "it held no owner (left empty: a full disk, a crash)"
                    print(f"note: took over the lock {self.path}: {why}", file=sys.stderr)
                    continue
                if who is None:  # created, not yet written by its owner: busy for a moment
                    return 0, "?", "start"
                return who
            with os.fdopen(fd, "w") as f:
                f.write(self.mine)
            self._beat()
            return None
        raise RunLocked(f"could not take the lock {self.path}: it keeps being recreated; pass another --out")

    def acquire(self) -> None:
        deadline = time.monotonic() + self.wait
        while True:
            who = self.try_acquire()
            if who is None:
                return
            if who[2] not in BRIEF_ROLES or time.monotonic() >= deadline:
                break
            _pause(0.05)
        raise RunLocked(f"{self.path.parent} is being written by {describe(who)} (lock "
                        f"{self.path}); wait for it to finish or pass another --out (delete the lock only if "
                        f"that process is gone)")

    def _beat(self) -> None:
        """Refresh the lock's time while held, so hosts that cannot see our pid know we live."""
        self._stop = stop = threading.Event()

        def beat():
            while not _next_beat(stop, HEARTBEAT_S):
                try:
                    os.utime(self.path)
                except OSError:
                    return

        threading.Thread(target=beat, name=f"heartbeat {self.path.name}", daemon=True).start()

    def release(self) -> None:
        if self._stop is not None:
            self._stop.set()
            self._stop = None
        mine = tuple(self.mine.split()[:2])
        if (who := owner(self.path)) is not None and tuple(map(str, who[:2])) == mine:  # owner(): no link, no pipe
            self.path.unlink(missing_ok=True)

    def __enter__(self) -> "RunLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
