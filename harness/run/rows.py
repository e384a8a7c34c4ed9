"""Deterministic JSON and the row files of a run folder.

Rows hold no timestamps and floats are written with 7 significant digits, so the same command
gives byte-identical rows.jsonl and summary.json. A row is keyed by (task, prompt, label, codec
seed); rows written before codec seeds have none and count as seed 0. The baseline's label is
``BASELINE_LABEL``.
"""
from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import re
import stat
from pathlib import Path

from harness.run.input_files import FILE_LIMIT, read_bytes

BASELINE_LABEL = "none"
ID_FIELDS = ("task", "prompt", "codec", "bits", "label", "codec_seed")


# --- deterministic JSON ------------------------------------------------------------------------
def _clean(x):
    """Floats to 7 significant digits; non-finite floats to strings (strict JSON); tensors to lists."""
    if isinstance(x, bool) or x is None or isinstance(x, (int, str)):
        return x
    if isinstance(x, float):
        if math.isnan(x):
            return "nan"
        if math.isinf(x):
            return "inf" if x > 0 else "-inf"
        return float(f"{x:.7g}")
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if hasattr(x, "tolist"):  # numpy / torch scalars and arrays
        return _clean(x.tolist())
    return str(x)


def dumps(obj, indent: int | None = None) -> str:
    return json.dumps(_clean(obj), indent=indent, sort_keys=indent is not None, ensure_ascii=False)


def num(x) -> float | None:
    """A row value as a float ('inf' strings included), None where it is not a number."""
    if isinstance(x, bool):
        return float(x)
    if isinstance(x, (int, float)):
        return float(x)
    if isinstance(x, str) and x in ("inf", "-inf", "nan"):
        return float(x)
    return None


# --- rows -----------------------------------------------------------------------------------------
def codec_seed(row: dict) -> int:
    """The row's codec seed; rows written before codec seeds existed ran seed 0."""
    return int(row.get("codec_seed", 0))


def row_key(row: dict) -> tuple[str, str, str, int]:
    """(task, prompt, label, codec seed)."""
    return row["task"], row["prompt"], row["label"], codec_seed(row)


class CorruptRows(ValueError):
    """A line inside rows.jsonl that is not a JSON row (a torn last line is not: it is repaired)."""


def _check_key(row: dict, where: str) -> None:
    """A row's key fields are there and typed (task, prompt and label strings; codec_seed an integer)."""
    fix = "delete or fix that line (the run recomputes a missing row), or start over with --fresh"
    for k in ("task", "prompt", "label"):
        value = row.get(k)
        # a prompt id may be a number (prompt files give them so)
        if not (isinstance(value, str) or k == "prompt" and isinstance(value, int) and not isinstance(value, bool)):
            raise CorruptRows(f"{where}: a row needs '{k}' (a string), found {value!r:.40}; {fix}")
    seed = row.get("codec_seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise CorruptRows(f"{where}: 'codec_seed' must be an integer, found {seed!r:.40}; {fix}")


def cut_torn_line(path: Path) -> bytes:
    """Cut a torn last line (a crash mid-write) off ``path`` before a process appends to it; returns
    the complete lines' bytes (b'' where there is no file). Only in a file of one name (:func:`open_file`)."""
    if not path.exists() and not path.is_symlink():
        return b""
    with os.fdopen(open_file(path, os.O_RDWR), "r+b") as f:
        data = f.read(FILE_LIMIT + 1) if os.fstat(f.fileno()).st_size <= FILE_LIMIT else None
        if data is None or len(data) > FILE_LIMIT:
            raise CorruptRows(f"{path}: over {FILE_LIMIT >> 20} MiB, larger than any rows file the harness reads or "
                              f"writes; delete it, or start over with --fresh")
        end = data.rfind(b"\n") + 1
        if end != len(data):
            f.truncate(end)
    return data[:end]


def read_rows(path: Path, repair: bool = False, keyed: bool = True) -> list[dict]:
    """Complete rows of ``path``; with ``repair`` a torn last line (a crash mid-write) is cut off.
    Any other line that is not a JSON object (``keyed``: with a row's key, :func:`row_key`) raises
    :class:`CorruptRows` naming the file and line."""
    if not path.exists():
        return []
    data = cut_torn_line(path) if repair else read_bytes(path, "rows file")
    end = data.rfind(b"\n") + 1
    rows = []
    for i, line in enumerate(data[:end].split(b"\n"), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CorruptRows(f"{path}:{i}: not a JSON row ({e}); delete or fix that line (the run "
                              f"recomputes a missing row), or start over with --fresh") from None
        if not isinstance(row, dict):
            raise CorruptRows(f"{path}:{i}: not a JSON object; delete or fix that line, or start over with --fresh")
        if keyed:
            _check_key(row, f"{path}:{i}")
        rows.append(row)
    return rows


def append_line(path: Path, line: str) -> None:
    """Append ``line`` to ``path`` (created if missing; only a file of one name: :func:`open_file`) and sync it."""
    with open_append(path) as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


class UnsafePath(ValueError):
    """A path built from input that would leave the run folder, or a link where a run file belongs."""


def open_file(path: Path, flags: int) -> int:
    """os.open of a regular file with one name, refusing anything else in its place: a symbolic link
    (O_NOFOLLOW), a file with other hard links (st_nlink > 1: an in-place write would change the outside name's
    file too), a pipe or a device (opened without blocking, then refused by its fstat). A run folder is something
    users copy and share, and what is planted in one must not make the harness write outside it or hang."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0), 0o644)
    except OSError as e:
        if Path(path).is_symlink():
            raise UnsafePath(f"{path} is a symbolic link; the harness writes only regular files in a run "
                             f"folder: delete the link (or put the file it names in its place)") from None
        if e.errno == errno.ENXIO:  # a pipe that no process reads, opened for writing
            raise UnsafePath(NOT_REGULAR.format(path=path)) from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
        os.close(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePath(NOT_REGULAR.format(path=path))
        raise UnsafePath(HARD_LINKED.format(path=path, n=st.st_nlink))
    os.set_blocking(fd, True)
    return fd


HARD_LINKED = ("{path} has {n} hard links, so writing it in place would change a file outside the run folder too "
               "(a folder copied with cp -al shares its files); the harness writes only files of one name: give it "
               "a copy of its own (cp {path} {path}.copy && mv {path}.copy {path}), or start over with --fresh")
NOT_A_BASELINE = ("baseline {path} is not a regular file (a link, a device, a pipe or a folder); the harness writes "
                  "each baseline as a file of its own: delete it and it is computed again, or start over with --fresh")
NOT_REGULAR = ("{path} is not a regular file (a device, a pipe or a folder, or a link to one); the harness reads "
                "and writes only regular files in a run folder: delete it (or put the file it names in its place)")


def open_append(path: Path):
    """``path`` opened to append text (created if missing), through :func:`open_file`'s refusals."""
    return os.fdopen(open_file(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "a", encoding="utf-8")


#: the longest file-name component made from input: a file system takes 255 bytes, and a name is suffixed (a
#: baseline's '.safetensors.<pid>.tmp', a video's '.<label>.sheet.png')
NAME_LIMIT = 120


def safe_name(s: str) -> str:
    """One path component from any string: runs of characters other than letters, digits, '.', '_'
    and '-' become '_' (slashes, NUL and the rest); '', '.' and '..' become '_', '_.' and '_..'; a name over
    ``NAME_LIMIT`` characters or more keeps its start and ends in a hash of the whole string (two long ids stay two
    names, and no shorter name is one of them)."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", str(s))
    name = "_" + name if name in ("", ".", "..") else name
    if len(name) >= NAME_LIMIT:  # >=: a name of exactly NAME_LIMIT is hashed too, so no plain name is a hashed one
        digest = hashlib.sha256(str(s).encode("utf-8", "surrogatepass")).hexdigest()[:16]
        name = f"{name[:NAME_LIMIT - 17]}-{digest}"
    return name


def within(root: Path, rel) -> Path | None:
    """``root / rel`` for a path read from a row (data, not trusted) that names a place inside ``root``
    once resolved (links followed); None for a non-string, an absolute path, '..' out of it or a link out."""
    if not isinstance(rel, str) or not rel:
        return None
    path = Path(root) / rel
    return path if path.resolve().is_relative_to(Path(root).resolve()) else None


def inside(root: Path, *parts) -> Path:
    """``root / parts...``, refused (:class:`UnsafePath`) unless it resolves to a path inside ``root``
    (symbolic links followed). Build ``parts`` with :func:`safe_name` where they come from input."""
    root = Path(root)
    path = root.joinpath(*map(str, parts))
    top = root.resolve()
    if not path.resolve().is_relative_to(top) or path.resolve() == top and parts:
        raise UnsafePath(f"refusing to write {path}: it is not inside the run folder {root}; "
                         f"rename the prompt or label that names it")
    return path


def atomic_write(path: Path, data: str | bytes) -> None:
    """Write ``data`` (text as UTF-8) to ``path`` whole or not at all (the temporary name is per
    process: shards of one run write the same files). A symbolic link at ``path`` is replaced by the
    file, never written through."""
    def write(tmp: Path) -> None:
        with os.fdopen(open_file(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL), "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)

    write_via(path, write, path.with_name(f"{path.name}.{os.getpid()}.tmp"))


def is_regular(path: Path) -> bool:
    """A regular file (not a symbolic link, which an artifact written once is rewritten over)."""
    return Path(path).is_file() and not Path(path).is_symlink()


def write_via(path: Path, write, tmp: Path | None = None) -> None:
    """``write(tmp)`` then rename ``tmp`` over ``path``: for writers that open files by name (a plot, a
    video, a wav). A rename replaces a symbolic link at ``path`` itself, so nothing outside the run
    folder is written whatever stands there; ``tmp`` (default: a hidden per-process name with
    ``path``'s suffix, which writers read the format from) is cleared first, a link included."""
    path = Path(path)
    tmp = tmp or path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if tmp.is_symlink() or tmp.exists():
            tmp.unlink()
