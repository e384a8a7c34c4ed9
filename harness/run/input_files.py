"""Reading files a user hands the harness (prompt files, manifests, a run folder's JSON): every problem
is one :class:`InputError` naming the file, the line where there is one, and what to do.

    read_json(path, dict, "video prompts")      -> the parsed object, refused unless it is a JSON object
    read_jsonl(path, "text prompts")            -> [(line number, object)] of the non-blank lines
    field(record, "prompt", str, where)         -> a required field of the given type
"""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

_KINDS = {dict: "a JSON object", list: "a JSON list", str: "a string", int: "an integer", float: "a number",
          bool: "true or false"}


class InputError(ValueError):
    """A file or record handed to the harness that it cannot use; the message says where and why."""


def kind_name(kind) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(_KINDS.get(k, k.__name__) for k in kinds)


def _found(value) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), f"the {type(value).__name__} {value!r}"[:60])


def is_kind(value, kind) -> bool:
    """``isinstance`` as JSON means it: a boolean is not a number, an integer is a number."""
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool):
        return bool in kinds
    if isinstance(value, int) and float in kinds:
        return True
    return isinstance(value, kinds)


def parse_json(text: str, where: str, fix: str = "", line: int | None = None) -> Any:
    """``text`` parsed; ``where`` names it in an error (``line``: the file's line that ``text`` is)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        line = f"{where}:{line or e.lineno}:{e.colno}" if text.strip() else where
        what = "is empty" if not text.strip() else f"is not valid JSON ({e.msg})"
        raise InputError(f"{line}: {what}" + (f"; {fix}" if fix else "")) from None


#: the most a file the harness reads may hold: a run folder's rows of a million prompts x configurations are a
#: fraction of it; a larger file (a planted sparse giant) is refused rather than read into memory
FILE_LIMIT = 1 << 30
#: the most a JSON document of a run folder (config, model, plan, registry, summary) may hold: a summary of
#: thousands of prompts x configurations is a few MiB, and parsing a document takes a few times its size
RUN_JSON_LIMIT = 64 << 20


def read_bytes(path: Path, what: str, limit: int = FILE_LIMIT) -> bytes:
    """The bytes of ``path``, read only from a regular file (a link to one is read as that file) of at most
    ``limit`` bytes: a pipe would block the read and a device (``/dev/zero``) never end it, so both are refused
    from the open file's fstat, opened without blocking. OSError where it cannot be opened (missing)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InputError(f"{path}: {what} is not a regular file (a device, a pipe or a folder, or a link to "
                             f"one); pass a file, or delete it where the harness writes it")
        # refused from its size where it says it (a sparse giant costs no read), and cut where it grows as it is read
        data = f.read(limit + 1) if st.st_size <= limit else None
    if data is None or len(data) > limit:
        raise InputError(f"{path}: over {limit >> 20} MiB, larger than any {what} the harness reads or writes; pass "
                         f"a smaller file, or delete it where the harness writes it")
    return data


def read_text(path: Path, what: str, limit: int = FILE_LIMIT) -> str:
    """:func:`read_bytes` as UTF-8 text."""
    data = read_bytes(path, what, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: {what} is not UTF-8 text (byte {e.start})") from None


def read_json(path: Path, expect=dict, what: str = "file", fix: str = "", limit: int = FILE_LIMIT) -> Any:
    """The JSON value in ``path``, which must be of ``expect`` (e.g. ``dict``, or ``(dict, list)``)."""
    value = parse_json(read_text(path, what, limit), str(path), fix)
    if not is_kind(value, expect):
        raise InputError(f"{path}: {what} must be {kind_name(expect)}, found {_found(value)}" + (f"; {fix}" if fix else ""))
    return value


def read_jsonl(path: Path, what: str = "file", expect=dict) -> list[tuple[int, Any]]:
    """[(line number, value)] of the non-blank lines of ``path``, each a JSON value of ``expect``."""
    out = []
    for i, line in enumerate(read_text(path, what).splitlines(), 1):
        if not line.strip():
            continue
        value = parse_json(line, str(path), line=i)
        if not is_kind(value, expect):
            raise InputError(f"{path}:{i}: each line of {what} must be {kind_name(expect)}, found {_found(value)}")
        out.append((i, value))
    return out


_MISSING = object()


def field(record: dict, key: str, kind, where: str, default: Any = _MISSING) -> Any:
    """``record[key]`` checked to be of ``kind``; ``default`` where it may be missing (or null)."""
    value = record.get(key) if isinstance(record, dict) else None
    if value is None:
        if default is not _MISSING:
            return default
        raise InputError(f"{where}: needs '{key}' ({kind_name(kind)})")
    if not is_kind(value, kind):
        raise InputError(f"{where}: '{key}' must be {kind_name(kind)}, found {_found(value)}")
    return value


def read_run_json(path: Path, default: Any = _MISSING) -> dict:
    """A JSON object the harness wrote into a run folder (config.json, model.json, plan.json,
    summary.json); ``default`` where the file may be missing."""
    if default is not _MISSING and not Path(path).exists():
        return default
    return read_json(path, dict, Path(path).name, limit=RUN_JSON_LIMIT,
                     fix="the harness writes this file: restore it, or run again with --fresh")
