"""Deterministic JSON and the row files of a run folder.

Rows hold no timestamps and floats are written with 7 significant digits, so the same command
gives byte-identical rows.jsonl and summary.json. A row is keyed by (task, prompt, label); the
baseline's label is ``BASELINE_LABEL``.
"""
from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

BASELINE_LABEL = "none"
ID_FIELDS = ("task", "prompt", "codec", "bits", "label")


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
def row_key(row: dict) -> tuple[str, str, str]:
    return row["task"], row["prompt"], row["label"]


def read_rows(path: Path, repair: bool = False) -> list[dict]:
    """Complete rows of ``path``; with ``repair`` a torn last line (a crash mid-write) is cut off."""
    if not path.exists():
        return []
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if repair and end != len(data):
        with open(path, "r+b") as f:
            f.truncate(end)
    return [json.loads(line) for line in data[:end].decode().splitlines() if line.strip()]


def append_line(path: Path, line: str) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def safe_name(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", s)


def atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
