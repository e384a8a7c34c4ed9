"""The codec contract, checked for every registered codec (parametrized from the registry, so a
new codec gets these tests by registering): shapes and dtypes, bytes, seeds, config round trip,
options. Codec-specific figures (distortion, estimators) live in test_baselines / test_octopus."""
from __future__ import annotations

import inspect
import json
from dataclasses import fields

import pytest
import torch
from helpers.distortion_refs import SMALL_SAMPLE_MARGIN, distortion_bound

from kernels import CODECS, CodecConfig, make_codec
from kernels.config import codec_options
from registry.options import options_json
from kernels.codecs.qjl import GaussianSketch
from kernels.rotation import Rotation, next_pow2

NAMES = sorted(CODECS)
H = 2  # KV heads


def _bits(name: str) -> list[int]:
    """The lowest supported bit width and 3 (or the highest below it)."""
    s = CODECS[name].bits_supported
    return sorted({s[0], max(b for b in s if b <= 3) if s[0] <= 3 else s[0]})


def _dim(name: str, d: int) -> int:
    """``d``, or 128 for a codec that refuses ``d`` (vLLM's int4 cache: powers of two only; mlx-g128: groups of 128)."""
    return d if CODECS[name].head_dim_unsupported(d) is None else 128


def _keys(name: str, d: int, dtype=torch.float32, seed: int = 0, heads: int = H) -> torch.Tensor:
    """[2, heads, T, d] with T two of the codec's token blocks (KIVI encodes whole groups)."""
    T = 2 * make_codec(name, _bits(name)[0], _dim(name, d)).token_block
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, heads, T, d, generator=g).to(dtype)


def _expected(codec, shape, dtype) -> int:
    """``codec.expected_nbytes(shape)``; told the keys' dtype where its side information takes it (transformers'
    quantized cache keeps scales and zeros in the model's dtype)."""
    if "dtype" in inspect.signature(codec.expected_nbytes).parameters:
        return codec.expected_nbytes(shape, dtype)
    return codec.expected_nbytes(shape)


def _random_parts(codec) -> list:
    """The seeded random objects (rotations, Gaussian sketches) a codec holds, one level deep."""
    found = []
    for v in vars(codec).values():
        for x in [v, *vars(v).values()] if hasattr(v, "__dict__") else [v]:
            if isinstance(x, (Rotation, GaussianSketch)):
                found.append(x)
    return found


def _same_state(a, b) -> bool:
    return a.tensors.keys() == b.tensors.keys() and all(torch.equal(a.tensors[k], b.tensors[k]) for k in a.tensors)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_encode_decode_shapes_and_dtypes(name, dtype):
    d = _dim(name, 80)  # not a power of two: rotations pad
    x = _keys(name, d, dtype)
    T = x.shape[-2]
    for bits in _bits(name):
        c = make_codec(name, bits, d, seed=1, num_heads=H)
        state = c.encode(x)
        assert state.shape == tuple(x.shape) and state.dtype == dtype and state.num_tokens == T
        for key, t in state.tensors.items():  # [..., T, k] or [..., T // block, k]: cat along dim -2 works
            assert t.shape[:-2] == x.shape[:-2], key
            assert t.shape[-2] in (T, T // c.token_block), key
        out = c.decode(state)
        assert out.shape == x.shape and out.dtype == dtype
        # a half-precision key is coded as its float32 value (codecs compute in float32), so decode is the float32
        # input's decode rounded to the dtype; and that reconstructs x within the codec's distortion figure
        out32 = c.decode(c.encode(x.float()))
        if not c.engine_preset:  # an engine's format keeps the engine's roundings through the input dtype
            assert torch.equal(out, out32.to(dtype))
        err = float((out32.double() - x.double()).pow(2).sum() / x.double().pow(2).sum())
        if name == "none":
            assert err == 0.0
        else:
            assert err <= SMALL_SAMPLE_MARGIN * distortion_bound(name, bits), (err, distortion_bound(name, bits))
        q = torch.randn(2, H, 3, d, dtype=dtype)
        s = c.score(q, state)
        assert s.shape == (2, H, 3, T) and s.dtype == torch.float32
        vstate = c.encode_values(x)
        v = c.decode_values(vstate)
        assert v.shape == x.shape and v.dtype == dtype


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("d", [64, 80, 96, 128, 256])
def test_bytes_are_counted_from_the_state(name, d):
    why = CODECS[name].head_dim_unsupported(d)
    if why is not None:  # refused at construction, with the reason
        with pytest.raises(ValueError, match=f"codec '{name}': "):
            make_codec(name, _bits(name)[0], d)
        return
    x = _keys(name, d, torch.float16)
    for bits in _bits(name):
        c = make_codec(name, bits, d, seed=2, num_heads=H)
        state = c.encode(x)
        stored = sum(t.numel() * t.element_size() for t in state.tensors.values())
        assert state.nbytes() == stored == _expected(c, tuple(x.shape), x.dtype)
        assert state.bits_per_coord() == 8 * stored / x.numel()  # one correctly rounded division of integers
        if name == "none":
            assert state.bits_per_coord() == 16
        else:  # the nominal bits (on the padded dims of a rotation) plus side information, not fp16's
            assert state.bits_per_coord() <= (bits + 1.5) * next_pow2(d) / d + 32 / d
        flat = make_codec(name, bits, d, seed=2).encode(x[0, 0])  # [T, d]: no leading dims
        assert flat.nbytes() == _expected(c, tuple(x[0, 0].shape), x.dtype)
        vstate = c.encode_values(x)
        assert vstate.nbytes() == sum(t.numel() * t.element_size() for t in vstate.tensors.values())


@pytest.mark.parametrize("name", NAMES)
def test_seed_determinism(name):
    d = _dim(name, 96)
    x = _keys(name, d, seed=3)
    bits = _bits(name)[-1]
    a, b = (make_codec(name, bits, d, seed=5, layer=1, num_heads=H) for _ in range(2))
    sa = a.encode(x)
    assert _same_state(sa, b.encode(x))
    assert torch.equal(a.decode(sa), b.decode(sa))
    randomised = bool(_random_parts(a))
    for other in (make_codec(name, bits, d, seed=6, layer=1, num_heads=H),
                  make_codec(name, bits, d, seed=5, layer=2, num_heads=H)):
        # a codec that draws a rotation or sketch draws another one for another (seed, layer);
        # one that draws nothing must not depend on the seed at all
        assert _same_state(sa, other.encode(x)) != randomised


@pytest.mark.parametrize("name", NAMES)
def test_config_json_round_trip_rebuilds_the_same_codec(name):
    d = _dim(name, 64)
    bits = _bits(name)[-1]
    value_bits = None if CODECS[name].engine_preset else 4  # an engine's preset fixes its value bits
    c = make_codec(name, bits, d, seed=7, layer=3, num_heads=H, value_bits=value_bits, value_group=16)
    text = json.dumps(c.config.to_json())
    again = make_codec(CodecConfig.from_json(json.loads(text)))
    assert again.config == c.config and type(again) is type(c)
    assert json.dumps(again.config.to_json()) == text
    x = _keys(name, d, seed=4)
    s1, s2 = c.encode(x), again.encode(x)
    assert _same_state(s1, s2)
    assert torch.equal(c.decode(s1), again.decode(s2))
    q = torch.randn(2, H, 3, d)
    assert torch.equal(c.score(q, s1), again.score(q, s2))
    assert _same_state(c.encode_values(x), again.encode_values(x))


@pytest.mark.parametrize("name", NAMES)
def test_options_are_declared_with_defaults_and_resolved(name):
    cls = CODECS[name]
    declared = [f.name for f in fields(cls.Options)]
    cls.Options()  # every option has a default
    c = make_codec(name, _bits(name)[0], _dim(name, 64))
    assert list(options_json(c.config.options)) == declared  # the config names every option the codec ran with
    assert c.opts is c.config.options and type(c.opts) is cls.Options


@pytest.mark.parametrize("name", NAMES)
def test_unknown_option_rejected(name):
    declared = [f.name for f in fields(CODECS[name].Options)]
    d = _dim(name, 64)
    for build in (lambda: make_codec(name, _bits(name)[0], d, levls=3),
                  lambda: CodecConfig(name, _bits(name)[0], d, options={"levls": 3}),
                  lambda: codec_options(name, {"levls": "3"}, strings=True)):
        with pytest.raises(ValueError, match=r"unknown option\(s\) \['levls'\]") as e:
            build()
        msg = str(e.value)
        assert "\n" not in msg and all(repr(n) in msg for n in declared)


@pytest.mark.parametrize("name", NAMES)
def test_wrong_option_type_rejected(name):
    for f in fields(CODECS[name].Options):
        with pytest.raises(ValueError, match=f"codec option {name}.{f.name} must be") as e:
            make_codec(name, _bits(name)[0], _dim(name, 64), **{f.name: {"not": "an option value"}})
        assert "\n" not in str(e.value)


@pytest.mark.parametrize("name", NAMES)
def test_command_line_form_of_every_default_parses_back(name):
    opts = CODECS[name].Options()
    for f in fields(opts):
        value = getattr(opts, f.name)
        text = ("none" if value is None else ",".join(map(str, value)) if isinstance(value, tuple)
                else str(value).lower() if isinstance(value, bool) else str(value))
        assert getattr(codec_options(name, {f.name: text}, strings=True), f.name) == value
