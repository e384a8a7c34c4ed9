"""harness/run/environment.py: what a run ran on (versions, device, git commit of the checkout), and
which fields two environments differ in."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from importlib import metadata

import numpy
import pytest

import harness
from harness.run import environment as env_mod
from harness.run.environment import environment, environment_diff, project_git

ROOT = Path(harness.__file__).resolve().parent.parent


def test_environment_fields():
    import torch

    e = environment("cpu")
    assert set(e) == {"python", "platform", "packages", "cuda", "device", "device_name", "cpu", "cpu_count", "git"}
    assert e["python"] == ".".join(map(str, sys.version_info[:3]))
    assert e["packages"]["numpy"] == numpy.__version__ and e["packages"]["torch"] == metadata.version("torch")
    assert set(e["packages"]) >= {"torch", "transformers", "triton", "diffusers", "numpy", "kvcodec-harness"}
    assert e["cuda"] == torch.version.cuda and e["device"] == "cpu" and e["cpu_count"] == os.cpu_count()
    assert e["device_name"] == e["cpu"]  # on a CPU the device is the CPU
    json.dumps(e)  # model.json takes it as is


def test_missing_package_is_none(monkeypatch):
    monkeypatch.setattr(env_mod, "PACKAGES", ("numpy", "surely-not-an-installed-dist"))
    assert environment()["packages"] == {"numpy": numpy.__version__, "surely-not-an-installed-dist": None}


def test_versions_are_read_without_importing_the_packages():
    code = ("import sys; from harness.run.environment import environment; e = environment('cpu'); "
            "print([m for m in ('transformers', 'diffusers', 'triton') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


def test_git_commit_and_dirty(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "a.py").write_text("x = 1\n")
    _git(repo, "add", "a.py")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    assert project_git(repo) == {"commit": _git(repo, "rev-parse", "HEAD"), "dirty": False}
    (repo / "a.py").write_text("x = 2\n")
    assert project_git(repo)["dirty"] is True
    # a folder inside some other checkout (an installed copy in a venv under a repo) is not the project's
    (repo / "site").mkdir()
    assert project_git(repo / "site") == {"commit": None, "dirty": None}
    assert project_git(tmp_path / "none") == {"commit": None, "dirty": None}  # no such folder: None, no error


def test_this_checkout_is_recorded():
    if _git(ROOT, "rev-parse", "--show-toplevel") != str(ROOT):
        pytest.skip("the harness is not run from its own checkout here")
    assert environment()["git"]["commit"] == _git(ROOT, "rev-parse", "HEAD")


def test_environment_diff_names_dotted_fields():
    a = {"python": "3.11", "packages": {"torch": "2.4", "numpy": "2.0"}, "git": {"commit": "x", "dirty": False}}
    b = {"python": "3.11", "packages": {"torch": "2.5", "numpy": "2.0"}, "git": {"commit": "y", "dirty": False},
         "cuda": "12.4"}
    assert environment_diff(a, b) == ["cuda", "git.commit", "packages.torch"]
    assert environment_diff(a, json.loads(json.dumps(a))) == []
