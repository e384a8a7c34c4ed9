"""Hostile files for the safety tests: a pickle whose unpickling would create a marker file."""
from __future__ import annotations

import pathlib

import torch


class TouchOnLoad:
    """Unpickling this object calls ``pathlib.Path(marker).touch()``: what a hostile checkpoint does."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return pathlib.Path.touch, (pathlib.Path(self.marker),)


def save_hostile(obj: dict, path, marker) -> pathlib.Path:
    """``torch.save`` of ``obj`` plus an entry whose unpickling touches ``marker``; returns ``path``."""
    torch.save({**obj, "payload": TouchOnLoad(marker)}, path)
    assert not pathlib.Path(marker).exists()
    return pathlib.Path(path)
