"""registry/versioned.py: the one versioned JSON round trip of the configurations (run, slurm, cache, codec,
lut config): the version written first and checked on read, unknown fields refused naming the known ones,
the declared field order kept, missing fields at their defaults, a missing version as each declares."""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest

from registry.options import option
from registry.versioned import JSONForm, VersionedJSON


@dataclass(frozen=True)
class Opts:
    split: tuple[int, ...] = option((4, 2))
    rounding: str = option("full")


@dataclass
class Plain(VersionedJSON, what="plain config", version=3, versionless=True):
    name: str = "a"
    bits: list[int] = field(default_factory=lambda: [2, 3])
    shape: tuple[int, int] = (1, 2)


@dataclass(frozen=True)
class Ordered(VersionedJSON, what="ordered config", version=1, order=("b", "options", "a")):
    a: int
    b: str = "x"
    options: Opts = Opts()


@dataclass(frozen=True)
class Sparse(VersionedJSON, what="sparse config", version=2):
    """Writes only the fields that are set (as LutConfig writes those of its layout)."""
    x: int | None = None
    y: int | None = None

    def json_fields(self) -> list[str]:
        return [k for k in ("y", "x") if getattr(self, k) is not None]


@dataclass
class Child(Plain):
    extra: int = 0


def test_the_class_keywords_declare_the_form():
    assert Plain.json_form == JSONForm("plain config", 3, (), True)
    assert Ordered.json_form == JSONForm("ordered config", 1, ("b", "options", "a"), False)
    assert Child.json_form is Plain.json_form  # a subclass without keywords keeps its base's form


def test_to_json_writes_the_version_first_then_the_fields_in_their_order():
    assert Plain().to_json() == {"version": 3, "name": "a", "bits": [2, 3], "shape": [1, 2]}
    assert list(Plain().to_json()) == ["version", "name", "bits", "shape"]  # declaration order
    d = Ordered(a=7, options=Opts(split=(3, 3))).to_json()
    assert list(d) == ["version", "b", "options", "a"]  # the declared order
    assert d["options"] == {"split": [3, 3], "rounding": "full"}  # an Options instance: every option, as JSON holds it
    assert json.dumps(Sparse(x=1).to_json()) == '{"version": 2, "x": 1}'  # the hook's fields only
    assert list(Sparse(x=1, y=2).to_json()) == ["version", "y", "x"]


def test_to_json_is_a_copy():
    c = Plain()
    c.to_json()["bits"].append(9)
    assert c.bits == [2, 3]


@pytest.mark.parametrize("config", [Plain(), Plain(name="b", bits=[], shape=(5, 6)), Ordered(a=1),
                                    Ordered(a=2, b="y", options=Opts(split=(1,), rounding="nearest")), Sparse(),
                                    Sparse(y=4), Child(extra=3)], ids=repr)
def test_round_trip_through_json_text(config):
    """The JSON written reads back to a config that writes the same JSON; the values go to the class as JSON
    holds them (lists, dicts): reading them into tuples or Options is the class's own ``__post_init__``."""
    d = json.loads(json.dumps(config.to_json()))
    assert type(config).from_json(d).to_json() == config.to_json()
    if isinstance(config, Sparse):  # values JSON holds as they are
        assert type(config).from_json(d) == config


def test_the_version_is_checked_in_one_wording():
    with pytest.raises(ValueError, match=r"^plain config version 4 is not the supported 3$"):
        Plain.from_json({"version": 4})
    with pytest.raises(ValueError, match=r"^ordered config version '1' is not the supported 1$"):
        Ordered.from_json({"version": "1", "a": 1})
    with pytest.raises(ValueError, match=r"^ordered config version True is not the supported 1$"):  # True == 1
        Ordered.from_json({"version": True, "a": 1})


def test_a_missing_version_is_read_as_the_class_declares():
    assert Plain.from_json({"name": "z"}) == Plain(name="z")  # versionless: files from before versions
    with pytest.raises(ValueError, match=r"^ordered config version None is not the supported 1$"):
        Ordered.from_json({"a": 1})


def test_unknown_fields_are_refused_in_one_line_naming_the_known_ones():
    with pytest.raises(ValueError) as e:
        Plain.from_json({"version": 3, "nmae": "x", "bitz": [1]})
    assert str(e.value) == "unknown Plain field(s) ['bitz', 'nmae']; known: ['bits', 'name', 'shape']"


def test_missing_fields_take_their_defaults_and_one_without_is_named():
    assert Plain.from_json({"version": 3}) == Plain()
    assert Ordered.from_json({"version": 1, "a": 5}) == Ordered(a=5)
    with pytest.raises(ValueError) as e:
        Ordered.from_json({"version": 1, "b": "y"})
    assert str(e.value) == ("ordered config lacks the field(s) ['a'], which have no default; "
                            "known: ['a', 'b', 'options']")
    assert "\n" not in str(e.value)


def test_the_input_is_not_changed():
    d = {"version": 3, "name": "q"}
    Plain.from_json(d)
    assert d == {"version": 3, "name": "q"}
