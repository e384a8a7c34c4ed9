"""registry/: one registry for codecs, models, tasks and metrics: a name registers once (both
definers named), an unknown name lists what exists, discovery imports a package's modules once
and records the ones missing an optional dependency; MODALITIES is defined once."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from registry import MODALITIES, NO_MODEL, OURS, Registry, declare_modality

ROOT = Path(__file__).resolve().parents[2]


def first():
    pass


def second():
    pass


def test_a_duplicate_name_is_rejected_naming_both_definers():
    r = Registry("widget")
    assert r.add("a", first) is first
    with pytest.raises(ValueError, match=r"^widget 'a' registered twice: by (\w+\.)*test_registry\.first and by "
                                         r"(\w+\.)*test_registry\.second$"):
        r.add("a", second)
    with pytest.raises(ValueError, match=r"^widget 'a' registered twice: by (\w+\.)*test_registry\.first and "
                                         r"by mod\.x$"):
        r.add("a", object(), by="mod.x")
    assert r.entries == {"a": first}


def test_an_unknown_name_lists_what_exists_sorted():
    r = Registry("widget")
    with pytest.raises(ValueError, match=r"^Unknown widget 'x'. Available: \(none\)$"):
        r.get("x")
    r.add("b", second)
    r.add("a", first)
    assert r.get("a") is first and list(r.all()) == ["a", "b"]
    with pytest.raises(ValueError, match=r"^Unknown widget 'x'. Available: a, b$"):
        r.get("x")


@pytest.fixture
def toy_package(tmp_path, monkeypatch):
    """A package ``toy_widgets`` in tmp_path whose modules register into its ``REGISTRY``."""
    pkg = tmp_path / "toy_widgets"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from registry import Registry\n\nREGISTRY = Registry('widget', __name__)\n")
    (pkg / "alpha.py").write_text("from . import REGISTRY\n\n\ndef alpha():\n    pass\n\n\n"
                                  "REGISTRY.add('alpha', alpha)\n")
    (pkg / "sub" / "__init__.py").write_text("from .. import REGISTRY\n\nREGISTRY.add('sub', 1, by='sub')\n")
    (pkg / "_private.py").write_text("raise RuntimeError('modules named _* are not imported')\n")
    (pkg / "needs_missing_dep.py").write_text("import a_package_that_is_not_installed_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield pkg
    for m in [m for m in sys.modules if m.split(".")[0] == "toy_widgets"]:
        del sys.modules[m]


def test_discovery_imports_every_module_once_and_records_a_missing_dependency(toy_package):
    import toy_widgets

    r = toy_widgets.REGISTRY
    assert r.entries == {}  # nothing is imported before the first lookup
    assert list(r.all()) == ["alpha", "sub"]  # modules and subpackages, not _private
    assert "a_package_that_is_not_installed_xyz" in r.unavailable["needs_missing_dep"]
    with pytest.raises(ValueError, match=r"^Unknown widget 'x'. Available: alpha, sub; 'needs_missing_dep' is "
                                         r"unavailable: needs 'a_package_that_is_not_installed_xyz' \("):
        r.get("x")
    (toy_package / "late.py").write_text("from . import REGISTRY\n\nREGISTRY.add('late', 2, by='late')\n")
    assert "late" not in r.all()  # discovered once: a later lookup imports nothing again
    assert Registry("widget").all() == {}  # no package: registered by hand only


def test_discovery_skips_subpackages_when_asked(toy_package):
    import toy_widgets

    r = Registry("widget", "toy_widgets", subpackages=False)
    r.discover()
    assert "toy_widgets.sub" not in sys.modules and "toy_widgets.alpha" in sys.modules
    assert set(r.unavailable) == {"needs_missing_dep"}
    assert toy_widgets.REGISTRY.entries == {"alpha": toy_widgets.alpha.alpha}


@pytest.mark.parametrize("body", ["import toy_widgets.no_such_module\n", "from kernels import no_such_name\n"])
def test_an_import_error_in_our_own_code_raises(toy_package, body):
    (toy_package / "buggy.py").write_text(body)
    r = Registry("widget", "toy_widgets")
    with pytest.raises(ImportError):
        r.all()
    with pytest.raises(ImportError):  # and again at the next lookup: the bug is not hidden
        r.get("alpha")
    assert "buggy" not in r.unavailable


def test_modalities_are_declared_once_by_their_metrics_modules():
    from adapters import list_models
    from harness.run.folder import RunFolder
    from metrics import modalities as declared
    from metrics.registry import REGISTRY as METRICS

    modalities = {m for metric in METRICS.all().values() for m in metric.modalities}
    assert sorted(MODALITIES) == sorted(modalities) == ["audio", "probe", "text", "video"]
    assert len(MODALITIES) == len(set(MODALITIES))  # each once, whoever declares it again
    # a task files its media under its modality's folder: one for each that metrics.modalities() gives the runner
    assert set(MODALITIES) <= set(RunFolder.dirs(declared()))
    assert {s.modality for s in list_models().values()} == set(MODALITIES) - {NO_MODEL}  # no model is a probe
    import metrics.audio

    assert metrics.audio.MODALITY == "audio" and declare_modality("audio") == "audio" and MODALITIES.count("audio") == 1


def test_the_registry_imports_nothing_of_ours():
    code = ("import sys, registry; bad = sorted(m for m in sys.modules if m.split('.')[0] in registry.OURS "
            "and m != 'registry'); print(bad); sys.exit(bool(bad))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert set(OURS) >= {"kernels", "adapters", "harness", "metrics", "registry"}
