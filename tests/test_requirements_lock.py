"""requirements.lock: what scripts/setup installs is what the suite passed on, and pyproject.toml's
ranges admit it. A venv built without the lock (scripts/check-latest sets KVCODEC_UNLOCKED=1) skips
the installed-versions check; KVCODEC_LOCK_EXEMPT names packages a machine cannot take from the lock
(scripts/gpu-test: the GPU image's own compiled builds)."""
from __future__ import annotations

import os
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from adapters.hf.compat import TESTED

ROOT = Path(__file__).resolve().parent.parent


def _lock() -> dict[str, str]:
    out = {}
    for line in (ROOT / "requirements.lock").read_text(encoding="utf-8").splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, sep, version = line.partition("==")
            assert sep and version, f"requirements.lock: '{line}' is not NAME==VERSION"
            out[canonicalize_name(name)] = version
    return out


@pytest.mark.skipif(os.environ.get("KVCODEC_UNLOCKED") == "1", reason="a venv built without the lock (check-latest)")
def test_installed_versions_are_the_locked_ones():
    exempt = {canonicalize_name(n) for n in os.environ.get("KVCODEC_LOCK_EXEMPT", "").split()}
    wrong = []
    for name, version in _lock().items():
        if name in exempt:
            continue
        try:
            have = metadata.version(name)
        except metadata.PackageNotFoundError:
            have = "missing"
        if have == "missing" or Version(have) != Version(version):
            wrong.append(f"{name} {have} (locked {version})")
    assert not wrong, f"installed versions differ from requirements.lock: {', '.join(wrong)}; run bash scripts/setup"


def _requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    reqs = list(project["dependencies"])
    for name, extra in project["optional-dependencies"].items():
        if name != "cuda":  # GPU only: never in the CPU lock
            reqs += extra
    return [Requirement(r) for r in reqs]


def test_pyproject_ranges_admit_the_lock():
    lock = _lock()
    for req in _requirements():
        name = canonicalize_name(req.name)
        if name == "torch":  # scripts/setup installs TORCH_SPEC, not the lock
            continue
        assert name in lock, f"{req.name} is a dependency but not in requirements.lock: regenerate it"
        assert req.specifier.contains(lock[name], prereleases=True), \
            f"pyproject.toml asks {req} but requirements.lock has {lock[name]}"


def test_the_tested_transformers_range_is_the_lock_and_the_floor():
    transformers = next(r for r in _requirements() if canonicalize_name(r.name) == "transformers")
    assert str(transformers.specifier) == f">={TESTED[0]}"
    assert _lock()["transformers"] == TESTED[1]
