"""kernels/config.py: CodecConfig checks and JSON round trip, option types, command-line parsing."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

import pytest

from kernels import CodecConfig, make_codec, parse_codec_options
from kernels.config import CODEC_CONFIG_VERSION, check_options, parse_options


def test_json_round_trip_with_version():
    c = CodecConfig("polarquant", 4, 96, seed=3, layer=5, num_heads=4, value_bits=2, value_group=16,
                    backend="torch", options={"angle_bits": [4, 3, 2, 2]})
    assert c.options == {"angle_bits": (4, 3, 2, 2)}  # lists (JSON) become tuples
    d = json.loads(json.dumps(c.to_json()))
    assert d["version"] == CODEC_CONFIG_VERSION and d["options"] == {"angle_bits": [4, 3, 2, 2]}
    assert CodecConfig.from_json(d) == c
    r = c.resolved()
    assert r.options == {"levels": 4, "angle_bits": (4, 3, 2, 2)} and CodecConfig.from_json(r.to_json()) == r
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
    ({"options": {"rounding": "fastest"}}, r"option rounding must be one of \['local', 'full', 'nearest'\]"),
])
def test_config_rejects_bad_values_in_one_line(change, match):
    args = {"name": "octopus", "bits": 3, "head_dim": 64, **change}
    with pytest.raises(ValueError, match=match) as e:
        CodecConfig(**args)
    assert "\n" not in str(e.value)


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
    assert parse_options("t", _Opts, raw) == {"flag": True, "ratio": 2.0, "sizes": (3, 3, 3), "pair": (4, 5),
                                              "mode": "b", "label": "x,y"}
    assert parse_options("t", _Opts, {"flag": "False", "sizes": "none"}) == {"flag": False, "sizes": None}
    for raw, match in (({"flag": "maybe"}, "option flag: cannot read 'maybe'"),
                       ({"pair": "1,2,3"}, "option pair: cannot read"),
                       ({"sizes": "3,x"}, "option sizes: cannot read"),
                       ({"mode": "c"}, r"option mode must be one of \['a', 'b'\]"),
                       ({"nope": "1"}, r"unknown option\(s\) \['nope'\]; it takes \['flag', 'label', 'mode', 'pair'")):
        with pytest.raises(ValueError, match=match):
            parse_options("t", _Opts, raw)


def test_check_options_types():
    assert check_options("t", _Opts, {"sizes": [1, 2], "ratio": 1}) == {"sizes": (1, 2), "ratio": 1.0}
    for given in ({"flag": 1}, {"ratio": True}, {"pair": (1,)}, {"sizes": (1, "2")}, {"label": 3}):
        with pytest.raises(ValueError, match=f"option {next(iter(given))}"):
            check_options("t", _Opts, given)


def test_parse_codec_options_of_real_codecs():
    assert parse_codec_options("octopus", {"split": "4,2", "rounding": "full"}) == {"split": (4, 2), "rounding": "full"}
    assert parse_codec_options("qjl", {"m": "none"}) == {"m": None}
    c = make_codec("octopus", 3, 64, **parse_codec_options("octopus", {"split": "4,2"}))
    assert (c.stage.b_u, c.stage.b_r) == (4, 2)


def test_make_codec_from_a_config_takes_nothing_else():
    cfg = CodecConfig("kivi", 2, 64, options={"group_size": 8})
    c = make_codec(cfg, device="cpu")
    assert c.token_block == 8 and c.config == cfg.resolved()
    with pytest.raises(TypeError, match="only device"):
        make_codec(cfg, 3)
    with pytest.raises(ValueError, match="cannot build codec"):
        type(c)(CodecConfig("quarot", 2, 64))
