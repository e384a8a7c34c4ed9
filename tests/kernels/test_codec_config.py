"""kernels/config.py: CodecConfig checks and JSON round trip, a codec's options read once into its Options."""
from __future__ import annotations

import json

import pytest

from kernels import CodecConfig, codec_class, make_codec
from kernels.config import CODEC_CONFIG_VERSION, codec_options


def test_json_round_trip_with_version():
    c = CodecConfig("polarquant", 4, 96, seed=3, layer=5, num_heads=4, value_bits=2, value_group=16,
                    backend="torch", options={"angle_bits": [4, 3, 2, 2]})
    # lists (JSON) become tuples; every option is present (the defaults filled in)
    assert c.options == codec_class("polarquant").Options(levels=4, angle_bits=(4, 3, 2, 2))
    d = json.loads(json.dumps(c.to_json()))
    assert d["version"] == CODEC_CONFIG_VERSION and d["options"] == {"levels": 4, "angle_bits": [4, 3, 2, 2]}
    assert CodecConfig.from_json(d) == c
    with pytest.raises(ValueError, match="version"):
        CodecConfig.from_json({**d, "version": CODEC_CONFIG_VERSION + 1})
    with pytest.raises(ValueError, match=r"unknown CodecConfig field\(s\) \['bitz'\]"):
        CodecConfig.from_json({**d, "bitz": 3})


@pytest.mark.parametrize("change,match", [
    ({"name": "octopuss"}, "Unknown codec 'octopuss'. Available: .*octopus"),
    ({"bits": 9}, r"does not support bits=9; supported: \[1, 2, 3, 4, 5, 6\]"),
    ({"bits": "3"}, "codec config bits must be int, got '3'"),
    ({"seed": 1.5}, "codec config seed must be int"),
    ({"value_bits": True}, r"codec config value_bits must be int \| None, got True"),
    ({"head_dim": 1}, "head_dim must be >= 2"),
    ({"num_heads": 0}, "num_heads must be >= 1"),
    ({"backend": "cuda"}, "Unknown backend 'cuda'. Available: auto, lut, triton, torch"),
    ({"options": {"rounding": "fastest"}}, r"codec option octopus\.rounding must be one of \['local', 'full', 'nearest'\]"),
])
def test_config_rejects_bad_values_in_one_line(change, match):
    args = {"name": "octopus", "bits": 3, "head_dim": 64, **change}
    with pytest.raises(ValueError, match=match) as e:
        CodecConfig(**args)
    assert "\n" not in str(e.value)


def test_codec_options_of_real_codecs():
    octopus = codec_class("octopus").Options
    assert codec_options("octopus", {"split": "4,2", "rounding": "full"}, strings=True) == octopus((4, 2), "full")
    assert codec_options("qjl", {"m": "none"}, strings=True).m is None
    assert codec_options("octopus", {"split": [4, 2]}) == octopus(split=(4, 2))  # JSON: typed, lists as tuples
    with pytest.raises(ValueError, match="codec option octopus.split must be"):
        codec_options("octopus", {"split": "4,2"})  # a string is not a command line's unless it says so
    given = octopus(split=(4, 2))
    assert codec_options("octopus", given) is given  # an instance's types are trusted: checked where it was made
    with pytest.raises(ValueError, match=r"codec option octopus\.split=0,2: 0 at position 1 is out of range"):
        make_codec(octopus(split=(0, 2)), 3, 64)  # its ranges are not: made in Python, no reader checked them
    with pytest.raises(ValueError, match="takes its options as a dict or a"):
        codec_options("octopus", codec_class("kivi").Options())
    c = make_codec(CodecConfig("octopus", 3, 64, options=codec_options("octopus", {"split": "4,2"}, strings=True)))
    assert (c.stage.b_u, c.stage.b_r) == (4, 2) and c.opts is c.config.options


def test_make_codec_from_a_config_takes_nothing_else():
    cfg = CodecConfig("kivi", 2, 64, options={"group_size": 8})
    c = make_codec(cfg, device="cpu")
    assert c.token_block == 8 and c.config == cfg
    with pytest.raises(TypeError, match="only device"):
        make_codec(cfg, 3)
    with pytest.raises(ValueError, match="cannot build codec"):
        type(c)(CodecConfig("quarot", 2, 64))


def test_the_options_class_names_the_codec():
    from kernels import CODECS, codec_for

    classes = {name: cls.Options for name, cls in CODECS.items()}
    assert len(set(classes.values())) == len(classes)  # each codec its own, those that declare none included
    assert all(codec_for(opts()) is CODECS[name] for name, opts in classes.items())
    octopus = classes["octopus"](split=(4, 2))
    c = make_codec(octopus, 3, 64, seed=1, num_heads=2)  # the options instance is the dispatch key
    assert type(c) is CODECS["octopus"] and c.config == CodecConfig("octopus", 3, 64, seed=1, num_heads=2,
                                                                     options={"split": (4, 2)})
    with pytest.raises(TypeError, match="takes the options in the instance"):
        make_codec(octopus, 3, 64, rounding="full")
    with pytest.raises(ValueError, match="is no codec's Options"):
        codec_for(object())
    with pytest.raises(ValueError, match="takes its options as a dict or a"):  # another codec's options
        CodecConfig("kivi", 2, 64, options=octopus)


def test_the_json_names_every_field_once():
    from dataclasses import fields

    from kernels.config import _JSON_ORDER, CodecConfig

    assert sorted(_JSON_ORDER) == sorted(f.name for f in fields(CodecConfig))  # a new field cannot miss the JSON
