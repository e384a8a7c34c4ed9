"""registry/options.py: typed options (codecs' and tasks'): strings read by the field types, typed values
checked, where each may lie, the JSON form."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import pytest

from registry.options import (Allowed, allowed, check_options, check_ranges, help_of, option, options_json, parse_options,
                              read_options)


@dataclass(frozen=True)
class _Opts:
    flag: bool = False
    ratio: float = 0.5
    sizes: tuple[int, ...] | None = None
    pair: tuple[int, int] = (1, 2)
    mode: Literal["a", "b"] = "a"
    label: str = ""


def test_parse_options_by_field_type():
    raw = {"flag": "true", "ratio": "2", "sizes": "3,3,3", "pair": "4, 5", "mode": "b", "label": "x,y"}
    assert parse_options("codec", "t", _Opts, raw) == {"flag": True, "ratio": 2.0, "sizes": (3, 3, 3), "pair": (4, 5),
                                              "mode": "b", "label": "x,y"}
    assert parse_options("codec", "t", _Opts, {"flag": "False", "sizes": "none"}) == {"flag": False, "sizes": None}
    for raw, match in (({"flag": "maybe"}, r"codec option t\.flag=maybe: cannot read it as bool"),
                       ({"pair": "1,2,3"}, r"option t\.pair=1,2,3: cannot read it as tuple\[int, int\]"),
                       ({"sizes": "3,x"}, r"option t\.sizes=3,x: cannot read"),
                       ({"mode": "c"}, r"option t\.mode must be one of \['a', 'b'\]"),
                       ({"nope": "1"}, r"unknown option\(s\) \['nope'\]; it takes \['flag', 'label', 'mode', 'pair'")):
        with pytest.raises(ValueError, match=match):
            parse_options("codec", "t", _Opts, raw)


def test_check_options_types():
    assert check_options("codec", "t", _Opts, {"sizes": [1, 2], "ratio": 1}) == {"sizes": (1, 2), "ratio": 1.0}
    for given in ({"flag": 1}, {"ratio": True}, {"pair": (1,)}, {"sizes": (1, "2")}, {"label": 3}):
        with pytest.raises(ValueError, match=f"codec option t.{next(iter(given))} must be"):
            check_options("codec", "t", _Opts, given)


@dataclass(frozen=True)
class _Ranged:
    contexts: tuple[int, ...] = option((1024,), "prompt lengths", Allowed(lo=1, nonempty=True, positions=True))
    scorer: str = option("auto", "which scorer", Allowed(choices=("auto", "rouge")))
    top_p: float = option(0.95, "top-p", Allowed(lo=0, hi=1))
    flag: bool = False


def test_options_carry_help_and_where_they_may_lie():
    o = read_options("task", "t", _Ranged, {"contexts": "512,2048", "top_p": "0.5", "flag": "on"})
    assert o == _Ranged(contexts=(512, 2048), top_p=0.5, flag=True)
    assert options_json(o) == {"contexts": [512, 2048], "scorer": "auto", "top_p": 0.5, "flag": True}
    f = {x.name: x for x in _Ranged.__dataclass_fields__.values()}
    assert help_of(f["contexts"]) == "prompt lengths" and allowed(f["contexts"]).positions
    assert allowed(f["flag"]) == Allowed() and help_of(f["flag"]) == ""
    for given, match in (({"contexts": "0"}, r"task option t\.contexts=0: 0 is out of range \(1 <= value\)"),
                         ({"contexts": ""}, r"option t\.contexts=: give at least one value"),
                         ({"scorer": "bleu"}, r"option t\.scorer=bleu: must be one of 'auto', 'rouge'"),
                         ({"top_p": "1.50"}, r"option t\.top_p=1\.50: 1\.5 is out of range \(0 <= value <= 1\)"),
                         ({"top_p": 1.5}, r"option t\.top_p=1\.5: 1\.5 is out of range"),
                         ({"nope": 1}, r"task 't' got unknown option\(s\) \['nope'\]; it takes \['contexts', 'flag'")):
        with pytest.raises(ValueError, match=match):
            read_options("task", "t", _Ranged, given)
    with pytest.raises(ValueError, match=r"task option t\.top_p must be float"):
        read_options("task", "t", _Ranged, {"top_p": "0.5"}, strings=False)  # JSON: typed values only
    Allowed(positions=True).check_positions((512, 2048), 4096)
    with pytest.raises(ValueError, match="4096 tokens exceed the model's 2048 positions"):
        Allowed(positions=True).check_positions((512, 4096), 2048)


@dataclass(frozen=True)
class _Pair:
    split: tuple[int, int] | None = option(None, "(b_u, b_r)", Allowed(lo=(1, 0), hi=10))


def test_a_bound_per_position_and_an_instance_made_in_python():
    """A fixed-length tuple's items each within their own bounds (issue #41: octopus's split); None (left to the
    codec) is not bounded; an instance made in Python is checked as a read one is."""
    assert read_options("codec", "t", _Pair, {"split": "1,0"}) == _Pair(split=(1, 0))
    for text, match in (("0,5", r"t\.split=0,5: 0 at position 1 is out of range \(1 <= value <= 10\)"),
                        ("1,11", r"t\.split=1,11: 11 at position 2 is out of range \(0 <= value <= 10\)"),
                        ("1,-1", r"-1 at position 2 is out of range")):
        with pytest.raises(ValueError, match=match):
            read_options("codec", "t", _Pair, {"split": text})
    check_ranges("codec", "t", _Pair())
    with pytest.raises(ValueError, match=r"codec option t\.split=0,5: 0 at position 1 is out of range"):
        check_ranges("codec", "t", _Pair(split=(0, 5)))
    with pytest.raises(ValueError, match=r"codec option t\.split=3,1,2: takes 2 values, got 3"):
        check_ranges("codec", "t", _Pair(split=(3, 1, 2)))  # made in Python, past the type's reading
    Allowed(lo=1, positions=True).check_positions(None, 16)  # an optional field left unset

