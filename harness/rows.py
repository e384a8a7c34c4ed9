"""Deterministic JSON and the row files of a run folder.

Rows hold no timestamps and floats are written with 7 significant digits, so the same command
gives byte-identical rows.jsonl and summary.json. A row is keyed by (task, prompt, label, codec
seed); rows written before codec seeds have none and count as seed 0. The baseline's label is
``BASELINE_LABEL``.
"""
from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

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


def cut_torn_line(path: Path) -> bytes:
    """Cut a torn last line (a crash mid-write) off ``path`` before a process appends to it; returns
    the complete lines' bytes (b'' where there is no file)."""
    if not path.exists():
        return b""
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if end != len(data):
        with open(path, "r+b") as f:
            f.truncate(end)
    return data[:end]


def read_rows(path: Path, repair: bool = False) -> list[dict]:
    """Complete rows of ``path``; with ``repair`` a torn last line (a crash mid-write) is cut off.
    Any other line that is not a JSON object raises :class:`CorruptRows` naming the file and line."""
    if not path.exists():
        return []
    data = cut_torn_line(path) if repair else path.read_bytes()
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
        rows.append(row)
    return rows


def append_line(path: Path, line: str) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


class UnsafePath(ValueError):
    """A path built from input that would leave the run folder."""


def safe_name(s: str) -> str:
    """One path component from any string: runs of characters other than letters, digits, '.', '_'
    and '-' become '_' (slashes, NUL and the rest); '', '.' and '..' become '_', '_.' and '_..'."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", str(s))
    return "_" + name if name in ("", ".", "..") else name


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


def atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all (the temporary name is per process: shards of
    one run write the same files)."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
