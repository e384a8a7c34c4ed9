"""Codecs by name. A new codec is one new module in ``kernels/`` that decorates its class with
``@register_codec("name")``; ``kernels/__init__.py`` imports every module of the package."""
from __future__ import annotations

from dataclasses import fields, is_dataclass

from .base import Codec
from .config import CodecConfig

CODECS: dict[str, type[Codec]] = {}


def register_codec(name: str):
    def wrap(cls: type[Codec]) -> type[Codec]:
        if name in CODECS:
            old = CODECS[name]
            raise ValueError(f"codec '{name}' registered twice: by {old.__module__}.{old.__qualname__} "
                             f"and by {cls.__module__}.{cls.__qualname__}")
        if not (is_dataclass(cls.Options) and cls.Options.__dataclass_params__.frozen):
            raise TypeError(f"codec '{name}': {cls.__qualname__}.Options must be a frozen dataclass")
        cls.name = name
        CODECS[name] = cls
        return cls

    return wrap


def codec_class(name: str) -> type[Codec]:
    try:
        return CODECS[name]
    except KeyError:
        raise ValueError(f"Unknown codec '{name}'. Available: {', '.join(sorted(CODECS))}") from None


_CONFIG_FIELDS = {f.name for f in fields(CodecConfig)} - {"name", "bits", "head_dim", "options"}


def make_codec(config: CodecConfig | str, bits: int | None = None, head_dim: int | None = None, *,
               device="cpu", **kwargs) -> Codec:
    """Build a codec from its config: ``make_codec(config, device=...)``.

    Shorthand: ``make_codec(name, bits, head_dim, seed=.., layer=.., num_heads=.., value_bits=..,
    value_group=.., backend=.., device=.., **options)`` builds the :class:`CodecConfig` first
    (keywords that are not config fields are the codec's options).
    """
    if isinstance(config, str):
        options = {k: v for k, v in kwargs.items() if k not in _CONFIG_FIELDS}
        config = CodecConfig(config, bits, head_dim, options=options,
                             **{k: v for k, v in kwargs.items() if k in _CONFIG_FIELDS})
    elif bits is not None or head_dim is not None or kwargs:
        raise TypeError("make_codec(config) takes only device=...; bits, head_dim and options live in the config")
    return codec_class(config.name)(config, device=device)


def list_codecs() -> dict[str, tuple[int, ...]]:
    """name -> supported bit widths."""
    return {n: c.bits_supported for n, c in sorted(CODECS.items())}
