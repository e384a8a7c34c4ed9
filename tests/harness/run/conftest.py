"""Fixtures of the bad-input tables (test_bad_input.py, test_hostile_input.py): the tiny checkpoint, a finished
run on it, and a guard that fails a case as soon as any model loads."""
from __future__ import annotations

from pathlib import Path

import pytest
from helpers.bad_input import tiny_run_argv
from helpers.tiny_lm import FOX, save_tiny_checkpoint

from harness.cli.main import main


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return save_tiny_checkpoint(tmp_path_factory.mktemp("ck") / "tiny")


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, checkpoint) -> Path:
    d = tmp_path_factory.mktemp("run")
    (d / "fox.txt").write_text(FOX)
    assert main(tiny_run_argv(checkpoint, d / "fox.txt", d / "run")) == 0
    return d / "run"


@pytest.fixture
def no_model_loads(monkeypatch):
    """Any model load fails the case: its checks must come first (every registered loader replaced,
    its signature kept: the runner reads it)."""
    import dataclasses
    import functools

    from adapters.registry import MODELS, list_models

    def loaded(*a, **k):
        raise AssertionError("a model loaded")

    for name, spec in list_models().items():  # discovered before the patch, so no module keeps it
        monkeypatch.setitem(MODELS, name, dataclasses.replace(spec, load=functools.wraps(spec.load)(loaded)))
