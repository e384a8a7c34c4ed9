"""CacheConfig (adapters/cache/kv_cache.py): closed choices checked, codec options checked, and the codec
config of each layer that CompressedKVCache builds from and a report row embeds."""
from __future__ import annotations

import json

import pytest
import torch

from adapters.cache.config import CacheConfig

from adapters.cache.kv_cache import CompressedKVCache


@pytest.mark.parametrize("field,value,allowed", [
    ("attend", "reconstruc", "score, reconstruct"),
    ("residual_unit", "frame", "token, append"),
    ("backend", "cuda", "auto, lut, triton, torch"),
])
def test_unknown_closed_choice_raises(field, value, allowed):
    with pytest.raises(ValueError, match=f"Unknown {field} '{value}'. Available: {allowed}") as e:
        CacheConfig(codec="octopus", bits=3, **{field: value})
    assert "\n" not in str(e.value)


def test_allowed_choices_are_accepted():
    for kw in ({"attend": "reconstruct"}, {"residual_unit": "append"}, {"backend": "torch"},
               {"protect": "boundary-1"}, {"protect": [0, -1]}, {"protect": None}):
        CacheConfig(codec="octopus", bits=3, **kw)
    with pytest.raises(ValueError, match="layer indices"):
        CacheConfig(protect=[0, "last"])


# every front end's form of protect -> the one canonical form (--protect, lm-eval's protect=, Python, JSON)
PROTECTS = [("none", "none"), (None, "none"), ("boundary-1", "boundary-1"), ("0,29", [0, 29]), ("0:29", [0, 29]),
            ("-1", [-1]), (" 3 , -1", [3, -1]), (5, [5]), ([0, -1], [0, -1]), ((2, 3), [2, 3]), ([], [])]


@pytest.mark.parametrize("given, canonical", PROTECTS, ids=[repr(g) for g, _ in PROTECTS])
def test_protect_is_read_by_one_parser(given, canonical):
    from adapters.cache.config import parse_protect, protect_text

    assert parse_protect(given) == canonical
    cc = CacheConfig(codec="octopus", bits=3, protect=given)
    assert cc.protect == canonical and CacheConfig.from_json(json.loads(json.dumps(cc.to_json()))) == cc
    if canonical:  # written as --protect takes it, read back the same
        assert parse_protect(protect_text(canonical)) == canonical


@pytest.mark.parametrize("given", ["boundary", "first", "0,x", "", "0;1", True, [0, "last"], [True], 1.5, {"a": 1}])
def test_protect_refused_in_one_line(given):
    from adapters.cache.config import parse_protect

    with pytest.raises(ValueError) as e:
        CacheConfig(protect=given)
    assert str(e.value) == f"protect takes 'none', 'boundary-1' or layer indices like 0,29 (or 0:29); got {given!r}"
    with pytest.raises(ValueError, match=r"^--protect takes 'none', 'boundary-1' or layer indices"):
        parse_protect(given, "--protect")


def test_options_are_the_codecs_and_checked():
    from kernels import codec_class

    assert CacheConfig(codec="octopus", bits=3, options={"split": [4, 2]}).options == \
        codec_class("octopus").Options(split=(4, 2))
    with pytest.raises(ValueError, match=r"codec 'octopus' got unknown option\(s\) \['splt'\]"):
        CacheConfig(codec="octopus", bits=3, options={"splt": [4, 2]})
    with pytest.raises(ValueError, match="codec option kivi.group_size must be int"):
        CacheConfig(codec="kivi", bits=2, options={"group_size": "8"})
    with pytest.raises(ValueError, match=r"codec 'none' got unknown option\(s\) \['m'\]; it takes none"):
        CacheConfig(options={"m": 3})
    with pytest.raises(ValueError, match="Unknown codec 'octopuss'"):
        CacheConfig(codec="octopuss")


def test_codec_config_is_resolved_and_builds_every_layer():
    cc = CacheConfig(codec="octopus", bits=2, seed=4, value_bits=3, value_group=16, backend="torch",
                     protect="boundary-1", options={"rounding": "nearest"})
    cfg = cc.codec_config(head_dim=64, num_heads=2, layer=1)
    assert cfg.to_json() == {"version": 1, "name": "octopus", "bits": 2, "head_dim": 64, "seed": 4, "layer": 1,
                             "num_heads": 2, "value_bits": 3, "value_group": 16, "backend": "torch",
                             "options": {"split": None, "rounding": "nearest"}}
    cache = CompressedKVCache(cc, 4, 2, 64)
    assert cache[0].codec is None and cache[3].codec is None  # protected
    for i in (1, 2):
        assert cache[i].codec.config == cc.codec_config(64, 2, layer=i)
    k = torch.randn(1, 2, 5, 64)
    assert torch.equal(cache[1].codec.encode(k).tensors["u"],
                       CompressedKVCache(cc, 4, 2, 64)[1].codec.encode(k).tensors["u"])


def test_json_field_names_unchanged():
    cc = CacheConfig(codec="kivi", bits=2, options={"group_size": 8})
    d = json.loads(json.dumps(cc.to_json()))
    assert list(d) == ["version", "codec", "bits", "residual", "residual_unit", "protect", "value_bits",
                       "value_group", "seed", "attend", "backend", "options", "memo_decoded"]
    assert CacheConfig.from_json(d) == cc


def test_the_json_names_every_field_once():
    from dataclasses import fields

    from adapters.cache.config import _JSON_ORDER, CacheConfig

    assert sorted(_JSON_ORDER) == sorted(f.name for f in fields(CacheConfig))  # a new field cannot miss the JSON
