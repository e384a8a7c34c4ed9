"""The environment of a subprocess that imports this checkout: its root first on PYTHONPATH, and
what was there kept (packages installed beside the interpreter's own: scripts/gpu-test)."""
from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def pythonpath() -> str:
    return os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))


def checkout_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": pythonpath()}
