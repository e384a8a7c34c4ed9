"""llama.cpp's KV-cache types as codecs (kernels/engines/llamacpp.py) against independent references: the bytes
against gguf's numpy quantizers (the ggml authors' port of ``quantize_row_*_ref``) and iq4_nl against a numpy
CUDA writer (helpers/engine_refs.py); the block layout, rounding, ties and byte counts from the format's
definition; the Hadamard rotation's rule; the q8 query."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import engine_refs as E
from helpers.tolerances import gamma

from kernels import make_codec
from kernels.engines.llamacpp import ggml_blocks, ggml_hadamard, rotation_blocks

gguf = pytest.importorskip("gguf")

TYPES = {"llamacpp-q8_0": 8, "llamacpp-q4_0": 4, "llamacpp-q4_1": 4, "llamacpp-q5_0": 5, "llamacpp-q5_1": 5,
         "llamacpp-iq4_nl": 4}
BLOCK_BYTES = {"llamacpp-q8_0": 34, "llamacpp-q4_0": 18, "llamacpp-q4_1": 20, "llamacpp-q5_0": 22,
               "llamacpp-q5_1": 24, "llamacpp-iq4_nl": 18}  # ggml's block structs, per 32 coordinates


def _keys(n=48, d=128, seed=0):
    """Token-heads of varied scale, with an all-zero, a constant and a one-outlier block."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 2, n, d, generator=g) * (0.01 + 5 * torch.rand(2, 2, n, 1, generator=g))
    x[0, 0, 0, :32] = 0.0
    x[0, 0, 1, :32] = 0.75
    x[0, 1, 2, 5] = 300.0
    return x


def _qtype(name):
    return getattr(gguf.GGMLQuantizationType, name.partition("-")[2].upper())


@pytest.mark.parametrize("name", sorted(TYPES))
def test_bytes_are_ggmls(name):
    x = _keys()
    c = make_codec(name, TYPES[name], 128, rotate=False)
    s = c.encode(x)
    got = ggml_blocks(name, s.tensors).numpy().reshape(-1, 128 // 32 * BLOCK_BYTES[name])
    rows = x.numpy().reshape(-1, 128)
    if name == "llamacpp-iq4_nl":  # gguf reads iq4_nl but does not write it: the CUDA writer in numpy
        d, idx = E.iq4_nl_blocks(rows.reshape(-1, 32))
        want = np.concatenate([d.reshape(-1, 1).view(np.uint8), (idx[:, :16] | (idx[:, 16:] << 4)).astype(np.uint8)], -1)
        want = want.reshape(rows.shape[0], -1)
    else:
        want = gguf.quants.quantize(rows, _qtype(name))
    np.testing.assert_array_equal(got, want)
    # read back as gguf dequantizes ggml's bytes (d * q, d * q + m, levels * d: float32 products)
    np.testing.assert_array_equal(c.decode(s).numpy().reshape(rows.shape), gguf.quants.dequantize(want, _qtype(name)))
    assert s.nbytes() == rows.shape[0] * 128 // 32 * BLOCK_BYTES[name] == c.expected_nbytes(tuple(x.shape))


def test_q8_0_rounds_halfway_away_from_zero_and_q4_0_truncates():
    x = torch.zeros(1, 1, 1, 32)
    x[..., 0], x[..., 1], x[..., 2], x[..., 3] = 127.0, 2.5, -2.5, -126.5  # d = 1: x / d is x
    q = make_codec("llamacpp-q8_0", 8, 32, rotate=False).encode(x).tensors["qs"].view(torch.int8)[0, 0, 0, :4]
    assert q.tolist() == [127, 3, -3, -127]  # roundf, where ties-to-even would give 2 and -126
    y = torch.zeros(1, 1, 1, 32)
    y[..., 0], y[..., 1], y[..., 2] = -8.0, 1.5, 1.49  # d = vmax / -8 = 1: q = trunc(x + 8.5)
    q4 = make_codec("llamacpp-q4_0", 4, 32, rotate=False).encode(y).tensors["qs"][0, 0, 0]
    codes = torch.cat([q4 & 15, q4 >> 4])
    assert codes[:3].tolist() == [0, 10, 9] and codes[16:].tolist() == [8] * 16  # element j + 16: high nibble of byte j


def test_q5_fifth_bits_ride_in_qh_element_by_element():
    x = torch.linspace(-1, 1, 32).reshape(1, 1, 1, 32)
    t = make_codec("llamacpp-q5_0", 5, 32, rotate=False).encode(x).tensors
    # vmax = -1 (the first of the two largest magnitudes): d = -1 / -16, q = trunc(16 x + 16.5)
    assert torch.equal(t["d"].float()[0, 0, 0], torch.tensor([1 / 16]))
    q = torch.trunc(x * 16 + 16.5).clamp_max(31).to(torch.int64)[0, 0, 0]
    qh = int.from_bytes(bytes(t["qh"][0, 0, 0].tolist()), "little")
    assert [(qh >> j) & 1 for j in range(32)] == [(int(v) >> 4) & 1 for v in q]


@pytest.mark.parametrize("d, k, v", [(128, 128, 64), (64, 64, 64), (192, 64, 64), (256, 256, 64), (96, 0, 0),
                                     (80, 0, 0)])
def test_rotation_follows_llamacpps_rule(d, k, v):
    """attn_rot_k / attn_rot_v: quantized types and head dims that are multiples of 64; keys over the largest
    power of two dividing the head dim, values over 64."""
    assert (rotation_blocks(d, "k"), rotation_blocks(d, "v")) == (k, v)


def test_rotated_codes_are_the_codes_of_the_rotated_keys():
    x = _keys()
    c = make_codec("llamacpp-q4_0", 4, 128)
    h = E.hadamard(128)  # float64, from its definition; ggml's 1.0 / sqrtf(128): two roundings
    assert c.rotation["k"] == 128
    np.testing.assert_allclose(ggml_hadamard(128).double().numpy(), h, rtol=gamma(2), atol=0)
    rotated = (x.double().numpy() @ h).astype(np.float32)
    want = gguf.quants.quantize(rotated.reshape(-1, 128), gguf.GGMLQuantizationType.Q4_0)
    got = ggml_blocks("llamacpp-q4_0", c.encode(x).tensors).numpy().reshape(want.shape)
    # float32 rotation against float64's: a code moves only where a coordinate sits within its rounding of a
    # code boundary (none expected in these 24 576 codes; the scales carry the same few ulps, rounded to fp16)
    assert (got != want).mean() < 1e-3
    # and decode turns back: the keys come out in the model's space, within q4_0's error of the unrotated ones
    err = float(((c.decode(c.encode(x)) - x) ** 2).sum() / (x ** 2).sum())
    plain = make_codec("llamacpp-q4_0", 4, 128, rotate=False)
    assert err < float(((plain.decode(plain.encode(x)) - x) ** 2).sum() / (x ** 2).sum())  # the outlier is spread


def test_values_rotate_over_blocks_of_64():
    x = _keys()
    c = make_codec("llamacpp-q8_0", 8, 128)
    h64 = np.kron(np.eye(2), E.hadamard(64))
    want = gguf.quants.quantize((x.double().numpy() @ h64).astype(np.float32).reshape(-1, 128),
                                gguf.GGMLQuantizationType.Q8_0)
    got = ggml_blocks("llamacpp-q8_0", c.encode_values(x).tensors).numpy().reshape(want.shape)
    assert (got != want).mean() < 1e-3


def test_query_is_quantized_to_q8_on_decode_steps_only():
    """The vector kernel's q8_1 query, per block of 32 of the rotated query: d = amax / 127, roundf(x / d) d."""
    c = make_codec("llamacpp-q4_0", 4, 128)
    q1 = torch.randn(1, 4, 1, 128, generator=torch.Generator().manual_seed(1))
    h = E.hadamard(128)
    qr = q1.double().numpy() @ h
    blocks = qr.reshape(*qr.shape[:-1], -1, 32)
    dq = np.abs(blocks).max(-1, keepdims=True) / 127
    want = (E.round_away(blocks / dq) * dq).reshape(qr.shape) @ h
    got = c.prepare_query(q1).double().numpy()
    # float32 rotations and quotient against float64: a few ulps a coordinate (and a code where x / d is that near a
    # half: none here); the query's own rounding is d / 2 a coordinate
    assert np.abs(got - want).max() < 1e-5 * np.abs(qr).max()
    assert not torch.equal(c.prepare_query(q1), q1)
    q3 = torch.randn(1, 4, 3, 128)  # a 3-token step runs the tensor-core kernel: the query as it is
    assert torch.equal(c.prepare_query(q3), q3)
    assert not torch.equal(make_codec("llamacpp-q4_0", 4, 128, quantize_query="always").prepare_query(q3), q3)
    assert torch.equal(make_codec("llamacpp-q4_0", 4, 128, quantize_query="never").prepare_query(q1), q1)


@pytest.mark.parametrize("name", sorted(TYPES))
def test_refuses_head_dims_off_its_blocks(name):
    with pytest.raises(ValueError, match="multiple of its 32-value blocks, got 40"):
        make_codec(name, TYPES[name], 40)
