"""kernels/registry.py: discovery of codec modules, duplicate names, the Options declaration."""
from __future__ import annotations

import importlib
import inspect
import pkgutil
from dataclasses import dataclass

import pytest

from kernels import CODECS, Codec, register_codec


def test_every_codec_class_in_the_package_is_registered():
    import kernels.codecs
    import kernels.engines

    defined = []  # the kernels' own subpackages (triton, cuda) hold kernels, not codecs
    modules = [info.name for package in (kernels, kernels.codecs, kernels.engines)
               for info in pkgutil.iter_modules(package.__path__, f"{package.__name__}.") if not info.ispkg]
    for name in modules:
        mod = importlib.import_module(name)
        # a base that shares code between codecs (private, or declaring no bit widths) is not one
        defined += [cls for _, cls in inspect.getmembers(mod, inspect.isclass)
                    if issubclass(cls, Codec) and cls is not Codec and cls.__module__ == mod.__name__
                    and not cls.__name__.startswith("_") and cls.bits_supported]
    assert len(defined) >= 10
    assert {CODECS[c.name] for c in defined} == set(defined) == set(CODECS.values())


def test_duplicate_name_is_rejected_and_leaves_the_registry_alone():
    before = dict(CODECS)

    class Again(Codec):
        bits_supported = (2,)

    with pytest.raises(ValueError, match=r"codec 'octopus' registered twice: by kernels\.codecs\.octopus\.Octopus and by "):
        register_codec("octopus")(Again)
    assert CODECS == before and Again.name == "base"


def test_options_must_be_a_frozen_dataclass():
    class Loose(Codec):
        @dataclass
        class Options:
            x: int = 1

    with pytest.raises(TypeError, match="frozen dataclass"):
        register_codec("loose-options")(Loose)
    assert "loose-options" not in CODECS
