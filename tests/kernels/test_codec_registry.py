"""kernels/registry.py: discovery of codec modules, duplicate names, the Options declaration and where each
numeric option may lie."""
from __future__ import annotations

import importlib
import inspect
import pkgutil
import types
import typing
from dataclasses import dataclass, fields

import pytest

from kernels import CODECS, Codec, register_codec
from kernels.registry import REGISTRY
from registry.options import Allowed, allowed, option


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


def _numeric(tp) -> bool:
    """An int or float annotation, optional or in a tuple (bool and Literal fields are closed by their type)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType, tuple):
        return any(_numeric(a) for a in typing.get_args(tp) if a is not Ellipsis)
    return tp in (int, float)


def _unranged(options_cls: type) -> list[str]:
    """The numeric fields of ``options_cls`` that declare no lower bound and no choices."""
    hints = typing.get_type_hints(options_cls)
    return [f.name for f in fields(options_cls)
            if _numeric(hints[f.name]) and allowed(f).lo is None and not allowed(f).choices]


def test_every_numeric_codec_option_declares_where_it_may_lie():
    """Issue #41: an option without a range failed only as its codec was built, after the model had loaded, and
    beside another codec as a skip; every number a codec takes is bounded where it is read."""
    @dataclass(frozen=True)
    class Loose:
        ranged: int = option(1, "", Allowed(lo=1))
        pair: tuple[int, int] | None = None
        scale: float = 1.0
        flag: bool = False

    assert _unranged(Loose) == ["pair", "scale"]  # what the check below finds
    assert {name: _unranged(cls.Options) for name, cls in REGISTRY.all().items() if _unranged(cls.Options)} == {}
