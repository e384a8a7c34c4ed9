"""Claiming a run folder: it must be new, empty, or a harness run of the same configuration; and
starting it over (``--fresh``). The files themselves are named in :mod:`harness.run.folder`."""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path


from harness.run.config import RunConfig, RunError
from harness.run.folder import RunFolder
from harness.run.lock import RunLocked, holder
from harness.run.rows import NOT_A_BASELINE, NOT_REGULAR, UnsafePath, atomic_write, dumps, open_file
from harness.run.input_files import read_text

def check_out(out: Path) -> None:
    """``out`` is a folder, or can be created as one, and can be written."""
    if out.exists() and not out.is_dir():
        raise RunError(f"--out {out} is a file, not a folder; pass a folder path")
    parent = out
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise RunError(f"--out {out}: {parent} is a file, not a folder; pass another --out")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise RunError(f"--out {out}: {parent} is not writable; pass a folder you can write")


def make_out(out: Path) -> bool:
    """Check ``out`` and create it; True where this call created it."""
    check_out(out)
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RunError(f"--out {out}: cannot create it ({e.strerror}); pass another --out") from None
    return created


def _run_config(path: Path) -> dict | None:
    """The RunConfig JSON of a harness run folder's config.json; None where it is not one."""
    try:
        d = json.loads(read_text(path, "config.json"))
        RunConfig.from_json(d)
    except (OSError, UnicodeDecodeError, ValueError, TypeError, AttributeError):  # AttributeError: not an object
        return None
    return d if isinstance(d, dict) and "version" in d else None


def claim_out(config: RunConfig, out: Path, fresh: bool) -> None:
    """Under the folder's lock, before anything is written (and before the model loads): ``out`` must be empty
    or a harness run folder (by its config.json) of this configuration, or of any configuration with ``fresh``
    (which deletes its run files, links included); without it, no link stands where the run appends or files
    (:func:`refuse_links`)."""
    entries = sorted(p.name for p in out.iterdir() if not p.name.startswith(RunFolder.LOCK))
    if not entries:
        return
    refuse_not_regular(out)
    if not fresh:
        refuse_links(out)
    old = _run_config(RunFolder(out).config)
    if old is None:
        shown = ", ".join(entries[:5]) + (", ..." if len(entries) > 5 else "")
        raise RunError(f"--out {out} holds files that are not a harness run ({shown}); pass a new or "
                       f"empty folder (--fresh only starts over a harness run folder)")
    try:  # a folder written before a field was added: that field takes its default
        old = json.loads(dumps(RunConfig.from_json(old).to_json()))
    except (TypeError, ValueError):
        pass  # an unreadable config is reported as differing below
    new = json.loads(dumps(config.to_json()))
    if old != new and not fresh:
        diff = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
        raise RunError(f"{out} holds a run with another configuration (differs in: {', '.join(diff)}); "
                       f"pass another --out, or --fresh to start it over")


def refuse_links(out: Path) -> None:
    """:class:`UnsafePath` for a link in ``out`` where a run appends (the line files: rows, speed, timings and
    their shards' files; the shards' logs), a symbolic one or a hard one (a file of more than one name), or a
    symbolic link in place of a folder it files into (baselines, each modality's media, the logs). The line files
    are opened by the writes' own opener (:func:`harness.run.rows.open_file`), which refuses them as the run would,
    after the model has loaded; the files it
    rewrites whole (config.json, registry.json, the reports, ...) replace a link with the file
    (:func:`harness.run.rows.write_via`)."""
    from metrics import modalities

    folder = RunFolder(out)
    appended = re.compile(rf"({'|'.join(RunFolder.LINE_STEMS)})(\.shard-\d+-of-\d+)?\.jsonl")
    dirs = (*RunFolder.dirs(modalities()), RunFolder.LOGS)
    logs = sorted(folder.logs.iterdir()) if folder.logs.is_dir() and not folder.logs.is_symlink() else []
    for p in [*sorted(out.iterdir()), *logs]:
        if appended.fullmatch(p.name) or re.fullmatch(RunFolder.LOG_PATTERN, p.name):
            os.close(open_file(p, os.O_RDONLY))  # the writes' own opener: its refusals, now rather than after loading
        elif p.is_symlink() and p.name in dirs and p.parent == out:
            raise UnsafePath(f"{p} is a symbolic link; the harness writes only regular files and folders in a run "
                             f"folder: delete the link (or put what it names in its place), or start over with "
                             f"--fresh")


def refuse_not_regular(out: Path) -> None:
    """:class:`UnsafePath` for a file of the harness's in ``out`` that is no regular file (a device, a pipe: its
    reading would never end), before it is read (:meth:`RunFolder.not_regular`), and for a stored baseline that is
    not a regular file of its own name (:func:`harness.tasks.baseline_io.load_tree` refuses it as it reads)."""
    for p in RunFolder(out).not_regular():
        raise UnsafePath(NOT_REGULAR.format(path=p))
    baselines = out / RunFolder.BASELINES
    if baselines.is_dir() and not baselines.is_symlink():  # a link in its place: refuse_links names it
        for p in sorted(baselines.glob("*/*")):
            if not (p.is_file() and not p.is_symlink()) and not p.name.endswith(".tmp"):
                raise UnsafePath(NOT_A_BASELINE.format(path=p))


def live_shards(out: Path) -> dict[str, tuple[int, str, str]]:
    """{lock file name: its live owner} of the shards running on ``out``."""
    found = {}
    for p in RunFolder(out).shard_locks():
        who = holder(p)
        if who is not None:
            found[p.name] = who
    return found


def refuse_live_shards(out: Path, allowed_count: int | None = None) -> None:
    """Raise :class:`RunLocked` where shards run on ``out`` (of another shard count than
    ``allowed_count``): their rows would be computed twice."""
    busy = {n: w for n, w in live_shards(out).items() if allowed_count is None
            or not n.endswith(f"-of-{allowed_count}")}
    if busy:
        who = ", ".join(f"{n.removeprefix(RunFolder.LOCK + '.').replace('-', ' ')} (process {w[0]} on {w[1]})"
                        for n, w in busy.items())
        raise RunLocked(f"{out} is being written by {who}; wait for them to finish (or stop them), or run "
                        f"the same shards (shard count {next(iter(busy)).rpartition('-of-')[2]})")


def wipe(out: Path, plots: set[str], modalities: list[str]) -> None:
    """--fresh: delete the run files of ``out`` (claimed by ``claim_out``; live writers refused): the
    files the harness writes, by exact name or pattern (``plots``: the reports' plot names), and its own
    folders (``modalities``' media among them); never another file."""
    folder = RunFolder(out)
    for p in out.iterdir():
        if (p.is_file() or p.is_symlink()) and folder.is_run_file(p.name, plots):
            p.unlink(missing_ok=True)
    for name in RunFolder.dirs(modalities):
        if (out / name).is_symlink():  # a link is removed, never followed
            (out / name).unlink()
        else:
            shutil.rmtree(out / name, ignore_errors=True)
    logs = folder.logs
    if logs.is_dir() and not logs.is_symlink():
        for f in logs.iterdir():
            if re.fullmatch(RunFolder.LOG_PATTERN, f.name) and (f.is_file() or f.is_symlink()):
                f.unlink()
        if not any(logs.iterdir()):
            logs.rmdir()


def start_out(config: RunConfig, out: Path, fresh: bool, plots: set[str], modalities: list[str]) -> None:
    """Once the model has loaded: with ``fresh`` delete the run files of ``out`` (:func:`wipe`), then write
    config.json."""
    if fresh:
        wipe(out, plots, modalities)
    write_config(config, out)


def write_config(config: RunConfig, out: Path) -> None:
    atomic_write(RunFolder(out).config, dumps(config.to_json(), indent=2) + "\n")
