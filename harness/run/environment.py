"""What a run ran on, for model.json's ``environment`` (``harness compare`` warns where two differ).

:func:`environment` reads versions through ``importlib.metadata`` (nothing is imported for its
version), the device, and the project's git commit when its source folder is a git checkout.
Anything it cannot find is None, never an error: a run must not fail over its own description.
"""
from __future__ import annotations

import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

PROJECT = "kvcodec-harness"  # the distribution name in pyproject.toml
PACKAGES = ("torch", "transformers", "triton", "diffusers", "numpy", PROJECT)
GIT_TIMEOUT_S = 5


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _cpu_name() -> str | None:
    """/proc/cpuinfo's model name (Linux), else platform.processor() (often '' on Linux)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _torch():
    """torch (a dependency of every run, so importing it costs nothing new), None if missing."""
    try:
        import torch
    except ImportError:
        return None
    return torch


def _device_name(device) -> str | None:
    """A CUDA device's name (torch is loaded wherever a device is), else the CPU's."""
    if device is not None and str(device).startswith("cuda"):
        torch = _torch()
        try:
            return torch.cuda.get_device_name(device) if torch is not None else None
        except (RuntimeError, AssertionError, ValueError):  # no driver, or no such device
            return None
    return _cpu_name()


def _git(root: Path, *args: str) -> str | None:
    try:
        r = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=GIT_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout if r.returncode == 0 else None


def project_git(root: Path | None = None) -> dict:
    """{"commit", "dirty"} of the checkout the harness runs from (None, None where it is not one:
    an installed copy inside some other repository does not count, hence the toplevel check)."""
    import harness

    root = Path(root or Path(harness.__file__).resolve().parent.parent)
    top = _git(root, "rev-parse", "--show-toplevel")
    if top is None or Path(top.strip()).resolve() != root.resolve():
        return {"commit": None, "dirty": None}
    commit, status = _git(root, "rev-parse", "HEAD"), _git(root, "status", "--porcelain")
    return {"commit": commit.strip() if commit else None, "dirty": bool(status.strip()) if status is not None else None}


def environment(device=None) -> dict:
    """{python, platform, packages: {dist: version | None}, cuda (torch.version.cuda), device,
    device_name, cpu, cpu_count, git: {commit, dirty}}. ``device``: the run's device (a
    torch.device or string such as "cuda:0"); None or a CPU describes the CPU."""
    torch = _torch()
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": {name: _version(name) for name in PACKAGES},
        "cuda": getattr(getattr(torch, "version", None), "cuda", None),
        "device": None if device is None else str(device),
        "device_name": _device_name(device),
        "cpu": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "git": project_git(),
    }


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def environment_diff(a: dict, b: dict) -> list[str]:
    """The fields (dotted: ``packages.torch``, ``git.commit``) in which two environments differ."""
    fa, fb = _flat(a), _flat(b)
    return sorted(k for k in fa.keys() | fb.keys() if fa.get(k) != fb.get(k))
