"""Typed options: what a codec (``Codec.Options``) or a task (``Task.Options``) takes, declared once as a
frozen dataclass of typed fields with defaults (an empty one when it takes none). Values are checked
against those types here, in one place: an unknown name or a wrong type is a one-line ValueError. Closed
choices are ``Literal[...]`` fields; lists (JSON has no tuples) become tuples, so options read back from
JSON equal the ones written. A field may carry its help and where its value may lie (:func:`option`,
:class:`Allowed`), checked with the types. What only a model's shape can settle (a group that must divide
the head dim) the codec checks as it is built, raising :class:`OptionError` naming the option.

    @dataclass(frozen=True)
    class Options:
        contexts: tuple[int, ...] = option((1024,), "prompt lengths in tokens", Allowed(lo=1, positions=True))

    parse_options("codec", "octopus", Octopus.Options, {"split": "4,2"}) == {"split": (4, 2)}
    read_options("codec", "octopus", Octopus.Options, {"split": [4, 2]}, strings=False) == Octopus.Options(split=(4, 2))
"""
from __future__ import annotations

import functools
import math
import types
import typing
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, Literal

@dataclass(frozen=True)
class NoOptions:
    """The options of a codec or task that takes none."""


_NONE_WORDS = ("none", "null")
_BOOL_WORDS = {"true": True, "1": True, "yes": True, "on": True, "false": False, "0": False, "no": False,
               "off": False}


class OptionError(ValueError):
    """An option's value that the thing it configures cannot take (``option``: the field's name), as opposed
    to a shape it cannot serve: a run refuses the value where the user gave it, and skips the codec where
    its default is what fails (``harness.run.checks.check_pairs``)."""

    def __init__(self, option: str, message: str):
        super().__init__(message)
        self.option = option


@dataclass(frozen=True)
class Allowed:
    """Where an option may lie: a finite number (or each item of a tuple option) in [lo, hi] (None: open; a
    tuple of bounds: one for each position of a fixed-length tuple option), one of ``choices``, a tuple
    ``nonempty``; ``positions``: at most the model's positions (tokens of context), checked once the model's
    limits are known (from its config file before it loads)."""
    lo: float | tuple | None = None
    hi: float | tuple | None = None
    choices: tuple = ()
    nonempty: bool = False
    positions: bool = False

    def __str__(self) -> str:
        """Where it may lie, as ``harness list`` shows it: 'one of 0, 1', '1..10', '>= 1', a range per position
        ('1..10, 0..10'), '<= the model's positions'; '' where anything its type admits may be."""
        def span(lo, hi) -> str:
            lo, hi = (f"{b:.4g}" if isinstance(b, float) else b for b in (lo, hi))
            return f"{lo}..{hi}" if lo is not None and hi is not None else (
                f">= {lo}" if lo is not None else f"<= {hi}" if hi is not None else "any")

        n = max((len(b) for b in (self.lo, self.hi) if isinstance(b, tuple)), default=0)
        parts = [f"one of {', '.join(map(str, self.choices))}"] if self.choices else []
        if n:
            parts.append(", ".join(span(*(b[i] if isinstance(b, tuple) else b for b in (self.lo, self.hi)))
                                   for i in range(n)))
        elif self.lo is not None or self.hi is not None:
            parts.append(span(self.lo, self.hi))
        if self.positions:
            parts.append("<= the model's positions")
        return "; ".join(parts)

    def check(self, value: Any) -> None:
        if value is None:  # an optional field left to its codec or task (``int | None``): nothing to bound
            return
        items = list(value) if isinstance(value, (list, tuple)) else [value]
        if self.nonempty and not items:
            raise ValueError("give at least one value")
        per_position = [len(b) for b in (self.lo, self.hi) if isinstance(b, tuple)]
        if per_position and len(items) != per_position[0]:
            raise ValueError(f"takes {per_position[0]} values, got {len(items)}")
        for i, v in enumerate(items):
            if isinstance(v, float) and not math.isfinite(v):  # NaN passes every comparison: said first
                raise ValueError(f"{v} is not a finite number")
            if self.choices and v not in self.choices:
                raise ValueError(f"must be one of {', '.join(repr(c) for c in self.choices)}")
            lo, hi = (b[i] if isinstance(b, tuple) else b for b in (self.lo, self.hi))
            if lo is not None and v < lo or hi is not None and v > hi:
                at = f" at position {i + 1}" if isinstance(self.lo, tuple) or isinstance(self.hi, tuple) else ""
                raise ValueError(f"{v}{at} is out of range ({'' if lo is None else f'{lo} <= '}value"
                                 f"{'' if hi is None else f' <= {hi}'})")

    def check_positions(self, value: Any, positions: int | None) -> None:
        if value is None:
            return
        items = list(value) if isinstance(value, (list, tuple)) else [value]
        if self.positions and positions is not None and max(items, default=0) > positions:
            raise ValueError(f"{max(items)} tokens exceed the model's {positions} positions")


def option(default: Any, help: str = "", allowed: Allowed | None = None):
    """A dataclass field: ``default``, the ``help`` that ``harness list`` shows, and where it may lie."""
    return field(default=default, metadata={"help": help, "allowed": allowed or Allowed()})


def allowed(f) -> Allowed:
    """Where the field ``f`` may lie (anywhere its type admits, where it does not say)."""
    return f.metadata.get("allowed") or Allowed()


def help_of(f) -> str:
    return f.metadata.get("help", "")


def read_options(kind: str, owner: str, options_cls: type, given: dict, strings: bool = True):
    """``options_cls`` of ``kind`` ('codec', 'task') ``owner`` from ``given``: the boundary where options
    enter. ``strings``: a command line's strings are read by the field types (:func:`parse_options`); else
    every value must already have its field's type (JSON, Python: :func:`check_options`)."""
    return options_cls(**(parse_options if strings else check_options)(kind, owner, options_cls, given))


def check_fields(obj, where: str, names: tuple[str, ...]) -> None:
    """The fields ``names`` of the dataclass instance ``obj`` against their annotations: a wrong type is a
    one-line ValueError naming ``where`` and the field."""
    hints = _hints(type(obj))
    shown = {f.name: f.type for f in fields(obj)}
    for name in names:
        _check_value(getattr(obj, name), hints[name], f"{where} {name}", shown[name])


def options_json(options) -> dict:
    """Every field of an ``Options`` instance, in declaration order, as JSON holds it (tuples as lists)."""
    return {f.name: jsonable(getattr(options, f.name)) for f in fields(options)}


def check_options(kind: str, owner: str, options_cls: type, given: dict, shown: dict | None = None) -> dict:
    """``given`` checked against the dataclass ``options_cls``: the same keys, values in canonical
    form (tuples for tuple fields) and where each field allows. Unknown names and wrong types raise a
    one-line ValueError naming the option as its flag does (``codec option octopus.split``), with its
    value as given (``shown``: the text it was read from)."""
    declared = {f.name: f for f in fields(options_cls)}
    _reject_unknown(kind, owner, declared, given)
    hints = _hints(options_cls)
    out = {}
    for k, v in given.items():
        out[k] = _check_value(v, hints[k], f"{kind} option {owner}.{k}", declared[k].type)
        _check_allowed(kind, owner, declared[k], out[k], (shown or {}).get(k, _text(v)))
    return out


def check_ranges(kind: str, owner: str, options) -> None:
    """Every field of an ``Options`` instance made in Python (not read by :func:`check_options`) where its
    field allows: the one-line ValueError :func:`check_options` gives."""
    for f in fields(options):
        _check_allowed(kind, owner, f, getattr(options, f.name), _text(getattr(options, f.name)))


def _check_allowed(kind: str, owner: str, f, value, shown: str) -> None:
    try:
        allowed(f).check(value)
    except ValueError as e:
        raise ValueError(f"{kind} option {owner}.{f.name}={shown}: {e}") from None


def _text(value) -> str:
    return ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def parse_options(kind: str, owner: str, options_cls: type, raw: dict) -> dict:
    """Strings read by the field's type: ``"3,3"`` -> ``(3, 3)`` for a tuple, ``"true"``/``"false"``
    for a bool, ``"none"`` for an optional field, a number for int/float, the text for a str; values
    that are not strings (JSON, a preset) pass to :func:`check_options` as they are."""
    declared = {f.name: f for f in fields(options_cls)}
    _reject_unknown(kind, owner, declared, raw)
    hints = _hints(options_cls)
    parsed = {}
    for k, text in raw.items():
        if not isinstance(text, str):
            parsed[k] = text
            continue
        try:
            parsed[k] = _parse_value(text.strip(), hints[k])
        except ValueError:
            raise ValueError(f"{kind} option {owner}.{k}={text}: cannot read it as {declared[k].type}") from None
    return check_options(kind, owner, options_cls, parsed, shown={k: v for k, v in raw.items() if isinstance(v, str)})


def _reject_unknown(kind: str, owner: str, declared, given) -> None:
    unknown = sorted(set(given) - set(declared))
    if unknown:
        raise ValueError(f"{kind} '{owner}' got unknown option(s) {unknown}; "
                         f"it takes {sorted(declared) or 'none'}")


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def jsonable(value):
    """``value`` as JSON holds it, in new containers: tuples as lists, a dataclass instance (an ``Options``)
    as :func:`options_json` writes it."""
    if is_dataclass(value) and not isinstance(value, type):
        return options_json(value)
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
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
