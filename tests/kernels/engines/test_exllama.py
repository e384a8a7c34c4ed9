"""ExLlamaV2's and ExLlamaV3's caches as codecs (kernels/engines/exllama.py) against numpy written from their
kernels (helpers/engine_refs.py: ExLlamaV2's half-precision steps with numpy's correctly rounded float16, ExLlamaV3's
float32 ones), the byte layout (lanes, nibbles, bit planes) and byte counts from the kernels' stores."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import engine_refs as E

from kernels import make_codec

EXL2 = {"exl2-q4": (4, 4), "exl2-q6": (8, 4), "exl2-q8": (8, 8)}  # (key, value) code bits


def _keys(n=24, d=128, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 2, n, d, generator=g) * (0.05 + 3 * torch.rand(2, 2, n, 1, generator=g))
    x[0, 0, 0] = 0.0  # absmax 0: 0 / 0, which the kernel's conversion reads as code 0
    x[0, 1, 1, 7] = 80.0
    return x.to(dtype)


@pytest.mark.parametrize("name", sorted(EXL2))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_exl2_codes_and_scales_are_the_kernels(name, dtype):
    x = _keys(dtype=dtype)
    c = make_codec(name, 8 if name != "exl2-q4" else 4, 128)
    for side, bits, state in (("k", EXL2[name][0], c.encode(x)), ("v", EXL2[name][1], c.encode_values(x))):
        q, scale = E.exl2_q(x.float().numpy(), bits)  # [..., d/64, 2 (even, odd coefficients), 32 lanes]
        codes = state.tensors["codes"].numpy().reshape(*q.shape[:-2], -1)
        if bits == 4:  # a byte a lane: the even group's coefficient in the low nibble, the odd one's high
            np.testing.assert_array_equal(codes, q[..., 0, :] | (q[..., 1, :] << 4))
        else:  # two bytes a lane, even then odd
            np.testing.assert_array_equal(codes, np.swapaxes(q, -1, -2).reshape(codes.shape))
        np.testing.assert_array_equal(state.tensors["scale"].numpy(), scale)  # fp16 per 32 stored values
        got = c.decode(state) if side == "k" else c.decode_values(state)  # fp16, then the input's dtype
        assert torch.equal(got, torch.from_numpy(E.exl2_dequantized(q, scale, bits)).to(dtype))
        assert state.nbytes() == x[..., 0].numel() * (128 * bits // 8 + 128 // 32 * 2)


def test_exl2_fp8_is_the_upper_byte_of_fp16():
    x = _keys()
    s = make_codec("exl2-fp8", 8, 128).encode(x)
    bits = x.to(torch.float16).numpy().view(np.uint16)
    np.testing.assert_array_equal(s.tensors["codes"].numpy(), (bits >> 8).astype(np.uint8))
    got = make_codec("exl2-fp8", 8, 128).decode(s).to(torch.float16).numpy()
    np.testing.assert_array_equal(got.view(np.uint16), bits & 0xFF00)  # truncation: the low byte dropped
    assert s.nbytes() == x.numel()


@pytest.mark.parametrize("bits", range(2, 9))
def test_exl3_codes_scales_and_planes(bits):
    x = _keys()
    c = make_codec("exl3", bits, 128)
    s = c.encode(x)
    q, scale = E.exl3_q(x.numpy(), bits)  # [..., d/32, 32]
    np.testing.assert_array_equal(s.tensors["scale"].numpy(), scale)
    # bit planes of 8, 4, 2, 1 bits (those in b, high bits first), value j at bits j w.. of the plane's words
    words = s.tensors["codes"].numpy().reshape(*q.shape[:-1], bits, 4)
    stream = np.unpackbits(words.reshape(*q.shape[:-1], -1), axis=-1, bitorder="little")
    rebuilt, at, rem = np.zeros_like(q), 0, bits
    for w in [p for p in (8, 4, 2, 1) if bits & p]:
        rem -= w
        plane = stream[..., at:at + 32 * w].reshape(*q.shape, w)
        rebuilt |= (plane * (1 << np.arange(w))).sum(-1) << rem
        at += 32 * w
    np.testing.assert_array_equal(rebuilt, q)
    np.testing.assert_array_equal(c.decode(s).to(torch.float16).numpy(), E.exl3_dequantized(q, scale, bits))
    assert s.nbytes() == x[..., 0].numel() * (128 * bits // 8 + 128 // 32 * 2) == c.expected_nbytes(tuple(x.shape))


def test_exl3_midpoint_grid():
    """Since v1.0.0 code q reads as (q - m + 1/2) / m of the group's scale. A lone 1.0 rotates to 32 equal
    coordinates, each the absmax: code floor(2 + 2) clamped to 3 at 2 bits, read as (3 - 1.5) / 2 = 0.75 of it,
    which rotates back to 0.75 (the grid (q - m) / m before v1.0.0 read the top code as 0.5)."""
    x = torch.zeros(1, 1, 1, 32)
    x[..., 0] = 1.0
    c = make_codec("exl3", 2, 32)
    s = c.encode(x)
    assert (E.exl3_q(x.numpy(), 2)[0] == 3).all()
    want = torch.zeros(1, 1, 1, 32)
    want[..., 0] = 0.75
    assert torch.equal(c.decode(s), want)


def test_exl3_value_bits():
    x = _keys()
    c = make_codec("exl3", 4, 128, v_bits=2)
    assert c.encode_values(x).nbytes() == x[..., 0].numel() * (128 * 2 // 8 + 8)
    assert c.encode(x).nbytes() == x[..., 0].numel() * (128 * 4 // 8 + 8)
    with pytest.raises(ValueError, match=r"exl3\.v_bits=9: must be one of 0, 2, 3, 4, 5, 6, 7, 8"):
        make_codec("exl3", 4, 128, v_bits=9)


def test_tokens_in_flight_default_to_each_engines_own():
    assert not make_codec("exl2-q4", 4, 128).stores_before_attending(10)  # fp16 attention over the chunk
    assert make_codec("exl3", 4, 128).stores_before_attending(10)  # quantized into the cache first


@pytest.mark.parametrize("name, bits, why", [("exl2-q4", 4, "64 coordinates at a time: head dim 96"),
                                             ("exl3", 4, "32 coordinates at a time: head dim 80")])
def test_head_dims_off_the_groups_are_refused(name, bits, why):
    with pytest.raises(ValueError, match=why):
        make_codec(name, bits, 96 if name == "exl2-q4" else 80)
