"""Codecs by name. A new codec is one new module that decorates its class with
``@register_codec("name")`` and is imported in ``kernels/__init__.py``."""
from __future__ import annotations

from .base import Codec

CODECS: dict[str, type[Codec]] = {}


def register_codec(name: str):
    def wrap(cls: type[Codec]) -> type[Codec]:
        if name in CODECS:
            raise ValueError(f"codec '{name}' registered twice")
        cls.name = name
        CODECS[name] = cls
        return cls

    return wrap


def codec_class(name: str) -> type[Codec]:
    try:
        return CODECS[name]
    except KeyError:
        raise ValueError(f"Unknown codec '{name}'. Available: {', '.join(sorted(CODECS))}") from None


def make_codec(name: str, bits: int, head_dim: int, **kwargs) -> Codec:
    """Build codec ``name`` at ``bits`` for vectors of ``head_dim`` (see :class:`kernels.base.Codec`)."""
    return codec_class(name)(bits=bits, head_dim=head_dim, **kwargs)


def list_codecs() -> dict[str, tuple[int, ...]]:
    """name -> supported bit widths."""
    return {n: c.bits_supported for n, c in sorted(CODECS.items())}
