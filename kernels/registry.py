"""Codecs by name, and by the class of their options. A new codec is one new module in ``kernels/codecs/`` (an
engine's deployed cache: ``kernels/engines/``) that decorates its class with ``@register_codec("name")``; the
first lookup imports every module of the two packages (:meth:`registry.Registry.discover`).

Every codec has an ``Options`` class of its own (one that declares none, or inherits its parent's, gets
its own empty subclass here), so an options instance names the codec it configures: :func:`codec_for`
is the dispatch ``make_codec`` uses (as torchao's configs are the key to their transforms).
"""
from __future__ import annotations

from dataclasses import is_dataclass, make_dataclass
from registry import Registry

#: the research codecs (kernels/codecs/) and the engines' deployed caches (kernels/engines/)
REGISTRY: Registry[type] = Registry("codec", "kernels.codecs", "kernels.engines")
CODECS = REGISTRY.entries
_BY_OPTIONS: dict[type, type] = {}


def register_codec(name: str):
    def wrap(cls: type) -> type:
        if not (is_dataclass(cls.Options) and cls.Options.__dataclass_params__.frozen):
            raise TypeError(f"codec '{name}': {cls.__qualname__}.Options must be a frozen dataclass")
        if "Options" not in vars(cls):  # the parent's (or the base's empty) options: a class of its own
            own = make_dataclass("Options", [], bases=(cls.Options,), frozen=True)
            own.__qualname__, own.__module__ = f"{cls.__qualname__}.Options", cls.__module__
            cls.Options = own
        REGISTRY.add(name, cls)
        cls.name = name
        _BY_OPTIONS[cls.Options] = cls
        return cls

    return wrap


def codec_class(name: str) -> type:
    return REGISTRY.get(name)


def codec_for(options) -> type:
    """The codec an ``Options`` instance configures (its class is that codec's own)."""
    try:
        return _BY_OPTIONS[type(options)]
    except KeyError:
        raise ValueError(f"{options!r} is no codec's Options; a codec's are Codec.Options "
                         f"(e.g. codec_class('octopus').Options(split=(4, 2)))") from None


def list_codecs() -> dict[str, tuple[int, ...]]:
    """name -> supported bit widths."""
    return {n: c.bits_supported for n, c in REGISTRY.all().items()}
