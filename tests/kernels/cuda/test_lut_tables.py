"""The table-lookup decode kernel on the CPU (kernels/cuda/lut_tables.py, lut_config.py, decode_lut.supports):
the tables and the index the kernel takes from the stored codes rebuild the reference's rotated keys
(fp16 table entries: ~2e-4 relative), the kernel's constants come from the declared layout, and
:func:`supports` refuses what the kernel does not cover. The kernel itself: test_decode_lut.py."""
from __future__ import annotations

import dataclasses
import json
import re

import pytest
import torch

from kernels import make_codec
from kernels.cuda.decode_lut import (LutConfig, default_config, launch_plan, lookup_for, lut_tables, source,
                                     supports, table_keys)
from kernels.cuda.lut_tables import TSCALE
from helpers.decode_checks import LUT_CODECS as CODECS, LUT_FORMS as FORMS, lut_form_unsupported as _form_unsupported
from helpers.tolerances import U16, gamma


@pytest.mark.parametrize("bits", [1, 2, 3, 4])
@pytest.mark.parametrize("name,form", FORMS)
def test_table_rebuilds_reference_keys(bits, name, form):
    if _form_unsupported(name, bits, form):
        pytest.skip(_form_unsupported(name, bits, form))
    g = torch.Generator().manual_seed(bits)
    codec = make_codec(name, bits, 128, seed=1, num_heads=2)
    k = torch.randn(2, 2, 37, 128, generator=g) * (1 + torch.rand(2, 2, 37, 1, generator=g) * 3)
    st = codec.encode(k)
    layout = codec.fused_layout()
    # the reference's keys brought back to the rotated unit frame (independent of the tables)
    ref = layout.rotation.forward(codec.decode(st).float() / st.tensors[layout.norm_field])
    lookup = lookup_for(layout, default_config(codec).replace(**form))
    got = table_keys(layout, st.tensors, lookup)
    err = float((got - ref).norm() / ref.norm())
    # fp16 entries, each within U16 of its value (one rounding; two for OCTOPUS unfused, a direction times a
    # length), against the reference's float32 rotation of its decode (butterfly and scaling, l2-relative)
    roundings = 2 if name == "octopus" and form.get("fused") is False else 1
    assert err < roundings * U16 + U16 ** 2 + gamma(2 * 7 + 6), err
    tab, scale = lut_tables(layout, lookup)
    assert torch.isfinite(tab.float()).all() and tab.shape == (lookup.entries, 4 // lookup.lookups)
    if name == "octopus":  # the 4th slot (the MMA's padding column) is zero
        assert torch.equal(tab[:, 3], torch.zeros_like(tab[:, 3]))
    else:  # slot i of entry p is the centroid of code (p >> i b) & (2^b - 1)
        c = layout.codebooks[0]
        p = torch.arange(lookup.entries)
        for i in range(tab.shape[1]):
            want = (c[(p >> (i * bits)) & ((1 << bits) - 1)].double() * TSCALE).to(torch.float16)
            assert torch.equal(tab[:, i], want)


def test_tables_read_the_declared_codebooks():
    """The tables come from the layout's codebooks, not from the codec: other centroids, other table."""
    codec = make_codec("octopus", 3, 128)
    layout = codec.fused_layout()
    c, rho = layout.codebooks
    other = dataclasses.replace(layout, codebooks=(c * 0.5, rho * 2))
    lk = lookup_for(layout, default_config(codec).replace(fused=False))
    t1, r1 = lut_tables(layout, lk)
    t2, r2 = lut_tables(other, lk)
    assert torch.equal(r2.float(), 2 * r1.float()) and not torch.equal(t1, t2)  # doubling is exact in fp16
    tq_codec = make_codec("turboquant-mse", 3, 128)
    tq = tq_codec.fused_layout()
    half = dataclasses.replace(tq, codebooks=(tq.codebooks[0] * 0.5,))
    lk = lookup_for(tq, default_config(tq_codec).replace(pairs=True))
    assert torch.equal(lut_tables(half, lk)[0].float(), (lut_tables(tq, lk)[0].float() * 0.5))


@pytest.mark.parametrize("name", CODECS)
def test_default_config_fits_shared_memory(name):
    for bits in (2, 3, 4):
        codec = make_codec(name, bits, 128)
        cfg = default_config(codec)
        lk = lookup_for(codec.fused_layout(), cfg)
        assert lk.entries * lk.entry_bytes * cfg.copies <= 32 * 1024
        if name == "turboquant-mse":  # 4-byte entries, one copy per lane: no bank conflicts
            assert lk.lookups == 2 and cfg.copies == 32


def test_launch_constants_come_from_the_layout():
    """TurboQuant-MSE at d=128: 32 groups of 4 codes (4 b bits each); rows of 32/48/64 bytes read
    as whole words (KEY_ROWS_ALIGNED); OCTOPUS: 43 triplets of 2 b_u + b_r bits, rows at any byte."""
    def macros(*a):
        return launch_plan(*a).constants.macros

    for bits in (2, 3, 4):
        k = macros(make_codec("turboquant-mse", bits, 128), torch.bfloat16, 7)
        assert ((k["CODE_GROUPS"], k["GROUP_CODE_BITS"], k["GROUP_COORDS"], k["LOOKUPS"], k["INDEX_BITS"],
                 k["SCALE_BITS"]) == (32, 4 * bits, 4, 2, 2 * bits, 0))
        assert k["KEY_ROW_BYTES"] == 16 * bits and k["KEY_ROWS_ALIGNED"] == 1
    k = macros(make_codec("turboquant-mse", 3, 64), torch.float32, 2)
    assert k["KEY_ROW_BYTES"] == 24 and k["KEY_ROWS_ALIGNED"] == 0  # 24-byte rows: the funnel-shift path
    k = macros(make_codec("octopus", 3, 128), torch.bfloat16, 7)
    assert ((k["CODE_GROUPS"], k["GROUP_CODE_BITS"], k["GROUP_COORDS"], k["LOOKUPS"], k["INDEX_BITS"],
             k["KEY_ROWS_ALIGNED"]) == (43, 10, 3, 1, 10, 0))
    k = macros(make_codec("octopus", 4, 128), torch.bfloat16, 7)
    assert (k["INDEX_BITS"], k["SCALE_BITS"]) == (10, 3)  # unfused by default at 4 bits
    # every macro of the source's table, and only those, is written (in the table's order)
    src = source()
    table = src[src.index("| macro "):src.index("*/")]
    assert list(k) == re.findall(r"^\| ([A-Z_]+) +\|", table, re.M)
    assert launch_plan(make_codec("octopus", 3, 128), torch.bfloat16, 7).constants.header.startswith(
        "#define HEAD_DIM 128\n#define HEADS_PER_KV 7\n")
    with pytest.raises(ValueError, match=r"config keys \['fused'\] do not apply"):
        launch_plan(make_codec("turboquant-mse", 3, 128), torch.bfloat16, 7, {"fused": True})
    with pytest.raises(ValueError, match="over 64 KB"):
        launch_plan(make_codec("turboquant-mse", 3, 128), torch.bfloat16, 7, {"pairs": False, "copies": 8})


def test_launch_configs_are_checked_before_the_cache():
    """launch_plan is derived once per (codec, dtype, G, config): a value equal to an accepted one but of
    another type (1 == True) is still refused, and a malformed one is refused with its name. A LutConfig
    is checked where it is built, and frozen."""
    codec = make_codec("octopus", 3, 128)
    assert launch_plan(codec, torch.bfloat16, 7, {"pdl": True}).config.pdl is True
    with pytest.raises(ValueError, match="config pdl must be true or false"):
        launch_plan(codec, torch.bfloat16, 7, {"pdl": 1})
    with pytest.raises(ValueError, match="config num_warps must be a positive integer"):
        launch_plan(codec, torch.bfloat16, 7, {"num_warps": [8]})
    with pytest.raises(ValueError, match="config qprep must be"):
        launch_plan(codec, torch.bfloat16, 7, {"qprep": "always"})
    with pytest.raises(ValueError, match="config copies must be a power of two"):
        LutConfig(fused=True, copies=3)
    with pytest.raises(ValueError, match="exactly one lookup form"):
        LutConfig(fused=True, pairs=True, copies=4)
    a = launch_plan(codec, torch.bfloat16, 7)
    assert a is launch_plan(codec, torch.bfloat16, 7) and a.constants.query_prep and not a.cta_constants.query_prep
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.config.copies = 8
    cfg = default_config(codec).replace(merge="kernel")  # a LutConfig is taken as it is
    assert launch_plan(codec, torch.bfloat16, 7, cfg).constants.merge_in_kernel
    assert launch_plan(codec, torch.bfloat16, 7, {"merge": "kernel"}).constants == \
        launch_plan(codec, torch.bfloat16, 7, cfg).constants
    # JSON with a version, read back checked
    assert LutConfig.from_json(json.loads(json.dumps(cfg.to_json()))) == cfg and cfg.to_json()["version"] == 1
    assert "pairs" not in cfg.to_json() and cfg.to_json()["fused"] is True
    with pytest.raises(ValueError, match="version"):
        LutConfig.from_json(cfg.to_json() | {"version": 2})
    with pytest.raises(ValueError, match="config stages must be a positive integer"):
        LutConfig.from_json(cfg.to_json() | {"stages": 0})


def test_supports_reasons():
    assert supports(make_codec("turboquant-mse", 3, 128)) is None
    for name, bits in (("octopus-qjl", 2), ("octopus-qjl", 4), ("turboquant-prod", 2), ("turboquant-prod", 4),
                       ("octopus", 1)):
        assert supports(make_codec(name, bits, 128, value_bits=max(bits, 2))) is None, (name, bits)
    assert "OCTOPUS split" in supports(make_codec("octopus-qjl", 6, 128))
    assert "scalar key codes of 5 bits" in supports(make_codec("turboquant-prod", 6, 128))
    assert "scalar key codes of 5 bits" in supports(make_codec("turboquant-mse", 5, 128))
    assert "no fused layout" in supports(make_codec("kivi", 2, 128))
    assert "value quantizer" in supports(make_codec("octopus", 3, 128, value_group=64))
    assert "at most 8" in supports(make_codec("octopus", 3, 128), G=16)
    assert "head_dim" in supports(make_codec("octopus", 3, 96))
    assert "head_dim" in supports(make_codec("turboquant-mse", 3, 96))
    assert "split" in supports(make_codec("octopus", 3, 128, split=(6, 2)))
    if not torch.cuda.is_available():
        assert "CUDA device" in supports(make_codec("octopus", 3, 128), device="cpu")
    assert "has 2 heads, the cache 4" in supports(make_codec("octopus", 3, 128, num_heads=2), Hkv=4)


def test_renamed_codec_gets_the_kernel():
    """The kernel reads the declared layout, never the codec's name."""
    from kernels.codecs.octopus import Octopus
    from kernels.codecs.turboquant import TurboQuantMSE

    for name, cls in (("octopus", Octopus), ("turboquant-mse", TurboQuantMSE)):
        renamed = type("Renamed", (cls,), {"name": "renamed-" + name})
        codec = make_codec(name, 3, 128)
        codec.__class__ = renamed
        assert supports(codec) is None and codec.name.startswith("renamed")
