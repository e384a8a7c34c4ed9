"""What builds a codec: :class:`CodecConfig`, and the typed options every codec declares.

A codec class declares its options as a frozen dataclass ``Options`` (typed fields with
defaults; an empty one when it takes none). Option values are checked against those types
here, once: an unknown name or a wrong type is a one-line ValueError. Closed choices are
``Literal[...]`` fields. Lists (JSON has no tuples) become tuples, so a config read back from
JSON equals the one written.

    cfg = CodecConfig("octopus", 3, 128, options={"split": (4, 2)})
    CodecConfig.from_json(cfg.to_json()) == cfg
    parse_codec_options("octopus", {"split": "4,2"}) == {"split": (4, 2)}
"""
from __future__ import annotations

import functools
import types
import typing
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Literal

from .backend import BACKENDS

CODEC_CONFIG_VERSION = 1
_NONE_WORDS = ("none", "null")
_BOOL_WORDS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def _codec_class(name: str):
    from .registry import codec_class  # local: the registry imports this module

    return codec_class(name)


@dataclass(frozen=True)
class CodecConfig:
    """Everything that builds a codec (the device aside); round-trips to JSON with a version.

    ``value_bits`` None means the key bit width. ``options`` holds only the codec's own options
    (its ``Options`` fields); :meth:`resolved` fills in every default.
    """

    name: str
    bits: int
    head_dim: int
    seed: int = 0
    layer: int = 0
    num_heads: int = 1
    value_bits: int | None = None
    value_group: int = 32
    backend: str = "auto"  # one of BACKENDS
    options: dict = field(default_factory=dict)

    def __post_init__(self):
        cls = _codec_class(self.name)  # unknown name -> "Unknown codec 'x'. Available: ..."
        for f in fields(self):
            if f.name not in ("name", "options"):
                _check_value(getattr(self, f.name), _hints(CodecConfig)[f.name], f"codec config {f.name}", f.type)
        if self.bits not in cls.bits_supported:
            raise ValueError(f"codec '{self.name}' does not support bits={self.bits}; "
                             f"supported: {list(cls.bits_supported)}")
        if self.head_dim < 2:
            raise ValueError(f"head_dim must be >= 2, got {self.head_dim}")
        if self.backend not in BACKENDS:
            raise ValueError(f"Unknown backend '{self.backend}'. Available: {', '.join(BACKENDS)}")
        if self.num_heads < 1:
            raise ValueError(f"num_heads must be >= 1, got {self.num_heads}")
        if not isinstance(self.options, dict):
            raise ValueError(f"codec options must be a dict, got {self.options!r}")
        object.__setattr__(self, "options", check_options(self.name, cls.Options, self.options))

    def resolved(self) -> "CodecConfig":
        """The same config with every option of the codec present (defaults filled in)."""
        opts = _codec_class(self.name).Options(**self.options)
        return replace(self, options={f.name: getattr(opts, f.name) for f in fields(opts)})

    def to_json(self) -> dict:
        return {"version": CODEC_CONFIG_VERSION, **_jsonable(asdict(self))}

    @classmethod
    def from_json(cls, d: dict) -> "CodecConfig":
        d = dict(d)
        version = d.pop("version", None)
        if version != CODEC_CONFIG_VERSION:
            raise ValueError(f"codec config version {version!r} is not the supported {CODEC_CONFIG_VERSION}")
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(d) - set(known))
        if unknown:
            raise ValueError(f"unknown CodecConfig field(s) {unknown}; known: {known}")
        return cls(**d)


# --- options ------------------------------------------------------------------------------

def check_options(codec: str, options_cls: type, given: dict) -> dict:
    """``given`` checked against the dataclass ``options_cls``: the same keys, values in canonical
    form (tuples for tuple fields). Unknown names and wrong types raise a one-line ValueError."""
    declared = {f.name: f for f in fields(options_cls)}
    _reject_unknown(codec, declared, given)
    hints = _hints(options_cls)
    return {k: _check_value(v, hints[k], f"codec '{codec}' option {k}", declared[k].type)
            for k, v in given.items()}


def parse_codec_options(codec_name: str, raw: dict[str, str]) -> dict:
    """Option values of codec ``codec_name`` given as strings (a command line) -> typed values, checked
    (see :func:`parse_options`): ``parse_codec_options("octopus", {"split": "4,2"}) == {"split": (4, 2)}``."""
    return parse_options(codec_name, _codec_class(codec_name).Options, raw)


def parse_options(codec: str, options_cls: type, raw: dict[str, str]) -> dict:
    """Strings read by the field's type: ``"3,3"`` -> ``(3, 3)`` for a tuple, ``"true"``/``"false"``
    for a bool, ``"none"`` for an optional field, a number for int/float, the text for a str."""
    declared = {f.name: f for f in fields(options_cls)}
    _reject_unknown(codec, declared, raw)
    hints = _hints(options_cls)
    parsed = {}
    for k, text in raw.items():
        try:
            parsed[k] = _parse_value(str(text).strip(), hints[k])
        except ValueError:
            raise ValueError(f"codec '{codec}' option {k}: cannot read {text!r} as {declared[k].type}") from None
    return check_options(codec, options_cls, parsed)


def _reject_unknown(codec: str, declared, given) -> None:
    unknown = sorted(set(given) - set(declared))
    if unknown:
        raise ValueError(f"codec '{codec}' got unknown option(s) {unknown}; "
                         f"it takes {sorted(declared) or 'none'}")


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _jsonable(value):
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def _check_value(value, tp, where: str, shown: str):
    """``value`` against the annotation ``tp`` -> canonical value (lists become tuples)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        for a in inner:
            try:
                return _check_value(value, a, where, shown)
            except ValueError:
                pass
        raise ValueError(f"{where} must be {shown}, got {value!r}")
    if origin is Literal:
        if value not in args:
            raise ValueError(f"{where} must be one of {list(args)}, got {value!r}")
        return value
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{where} must be {shown}, got {value!r}")
        elem = [args[0]] * len(value) if len(args) == 2 and args[1] is Ellipsis else list(args)
        if len(elem) != len(value):
            raise ValueError(f"{where} must be {shown} ({len(elem)} values), got {value!r}")
        return tuple(_check_value(v, t, where, shown) for v, t in zip(value, elem))
    ok = {bool: lambda v: isinstance(v, bool),
          int: lambda v: isinstance(v, int) and not isinstance(v, bool),
          float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
          str: lambda v: isinstance(v, str)}.get(tp)
    if ok is None:
        raise TypeError(f"{where}: unsupported option type {tp!r}")
    if not ok(value):
        raise ValueError(f"{where} must be {shown}, got {value!r}")
    return float(value) if tp is float else value


def _parse_value(text: str, tp):
    """``text`` read as the annotation ``tp`` (ValueError when it cannot be)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if type(None) in args and text.lower() in _NONE_WORDS:
            return None
        inner = [a for a in args if a is not type(None)]
        for a in inner:
            try:
                return _parse_value(text, a)
            except ValueError:
                pass
        raise ValueError(text)
    if origin is Literal or tp is str:
        return text
    if origin is tuple:
        parts = [p.strip() for p in text.strip("()[]").split(",") if p.strip()]
        elem = [args[0]] * len(parts) if len(args) == 2 and args[1] is Ellipsis else list(args)
        if len(elem) != len(parts):
            raise ValueError(text)
        return tuple(_parse_value(p, t) for p, t in zip(parts, elem))
    if tp is bool:
        if text.lower() not in _BOOL_WORDS:
            raise ValueError(text)
        return _BOOL_WORDS[text.lower()]
    if tp is int:
        return int(text)
    if tp is float:
        return float(text)
    raise ValueError(text)
