"""Fused key encoders (kernels/triton/octopus_encode.py, turboquant_encode.py) against the reference
codecs' ``encode``, and the fused value encoder (kernels/triton/value_encode.py) against
``ValueQuantizer.encode`` (byte for byte: same operations, same order).

Stated tolerance, derived: the kernels sum the key norm by a fixed pairwise tree, torch in its own
order; everything after the norm is the reference's operations in the reference's order (IEEE
division and square root, the same butterfly, no multiply-add contraction). So norms agree to the
bound of two orders of a d-term sum of squares, halved by the square root, plus each side's
rounding of the root and the division (``norm_rtol``); a row whose norm the kernel computed bit for
bit gets the reference's bytes exactly, and only a row whose norm moved may differ, in one code at
most (a move of a few ulps carries a value across a decision boundary with a chance of ~1e-6 a code,
two in one row ~1e-10: `harness bench` on an H200 saw 5 bytes in 10^6), i.e. in the bytes one code
spans. Runs
on CUDA, else on the CPU under TRITON_INTERPRET=1, where the interpreter runs the programs one by
one: the tests that compare with the reference take a prefill's 16 rows a program (``BLOCK_T``),
and test_a_row_encodes_to_the_same_bytes_in_any_block_of_rows shows a row's bytes do not depend on it.
"""
from __future__ import annotations

import importlib
import os
import sys

import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
triton = pytest.importorskip("triton")

from helpers.tolerances import U32, sum_rel  # noqa: E402

from kernels import make_codec  # noqa: E402

for _m in ("kernels.triton._common", "kernels.triton.octopus_encode", "kernels.triton.turboquant_encode",
           "kernels.triton.value_encode"):
    if _m in sys.modules and not CUDA:
        importlib.reload(sys.modules[_m])
from kernels.triton.octopus_encode import octopus_encode  # noqa: E402
from kernels.triton.turboquant_encode import turboquant_mse_encode  # noqa: E402
from kernels.triton.value_encode import value_encode, value_encoder_unsupported  # noqa: E402
from kernels.values import ValueQuantizer  # noqa: E402

DEV = "cuda" if CUDA else "cpu"
BLOCK_T = 16  # rows_per_program's prefill block: 8x fewer programs than a decode step's 2 rows each


def norm_rtol(d: int) -> float:
    """Two orders of summing d squares (nonnegative: relative to the sum itself), halved by the square
    root, plus the rounding of each side's root and of the division by it."""
    return sum_rel(d) / 2 + 2 * U32


@pytest.fixture(autouse=True)
def _reference_encode(monkeypatch):
    """``codec.encode`` is the oracle here: keep 'auto' on the PyTorch reference (on CUDA it would
    otherwise dispatch to the very kernels under test)."""
    monkeypatch.setenv("KVCODEC_BACKEND", "torch")


def _keys(shape, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(*shape, generator=g) * (0.5 + torch.rand(*shape[:-1], 1, generator=g) * 4)
    k[..., 0, :] = 0.0  # a zero key: stays zero, never NaN
    return k.to(dtype).to(DEV)


def _check(out, ref, fields, codec):
    """Norms within the bound of their summation orders (norm_rtol), bytes identical in every row
    whose norm came out bit for bit the same, and in a row whose norm moved, different in at most the
    bytes one code spans (the module docstring)."""
    bits = codec.fused_layout().bits  # (b,) scalar codes; (b_u, b_r) a triplet's fused u | v | r code
    width = bits[0] if len(bits) == 1 else 2 * bits[0] + bits[1]
    one_code = (width + 7) // 8 + 1  # bytes a code of that many bits can touch
    assert set(fields) <= set(out.tensors)
    norm = next(f for f in fields if out.tensors[f].dtype != torch.uint8)
    a, b = out.tensors[norm], ref.tensors[norm]
    assert a.shape == b.shape and a.dtype == b.dtype, norm
    torch.testing.assert_close(a, b, rtol=norm_rtol(ref.shape[-1]), atol=0)  # norm_rtol: two summation orders
    moved = (a != b).any(-1)
    for f in fields:
        a, b = out.tensors[f], ref.tensors[f]
        assert a.shape == b.shape and a.dtype == b.dtype, f
        if a.dtype == torch.uint8:
            differs = (a != b).any(-1)
            assert not (differs & ~moved).any(), f"{f}: {int((differs & ~moved).sum())} rows differ with the same norm"
            assert int((a != b).sum(-1).max()) <= one_code, f"{f}: a row differs in more than one code"


@pytest.mark.parametrize("bits", [1, 2, 3, 4])
@pytest.mark.parametrize("d", [64, 128, 96])
def test_octopus_encode_matches_reference(bits, d):
    codec = make_codec("octopus", bits, d, seed=bits, layer=2, num_heads=2, device=DEV)
    k = _keys((2, 2, 37, d), seed=d + bits)
    _check(octopus_encode(codec, k, block_t=BLOCK_T), codec.encode(k), ("norm", "u"), codec)


@pytest.mark.parametrize("split", [(2, 2), (5, 3), (3, 0)])
def test_octopus_encode_splits_and_bf16(split):
    codec = make_codec("octopus", 3, 128, seed=1, num_heads=1, split=split, device=DEV)
    k = _keys((3, 29, 128), seed=7, dtype=torch.bfloat16)
    _check(octopus_encode(codec, k, block_t=BLOCK_T), codec.encode(k), ("norm", "u"), codec)


def test_octopus_encode_nearest_rounding_and_qjl_stage():
    codec = make_codec("octopus", 2, 64, seed=4, num_heads=1, rounding="nearest", device=DEV)
    k = _keys((50, 64), seed=3)
    _check(octopus_encode(codec, k, block_t=BLOCK_T), codec.encode(k), ("norm", "u"), codec)
    qjl = make_codec("octopus-qjl", 3, 64, seed=4, num_heads=2, device=DEV)  # its (b-1)-bit OCTOPUS stage
    k = _keys((2, 21, 64), seed=5)
    _check(octopus_encode(qjl, k, block_t=BLOCK_T), qjl.encode(k), ("norm", "u"), qjl)


@pytest.mark.parametrize("bits", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("d", [64, 128, 80])
def test_turboquant_encode_matches_reference(bits, d):
    codec = make_codec("turboquant-mse", bits, d, seed=bits, layer=1, num_heads=2, device=DEV)
    k = _keys((1, 2, 41, d), seed=bits * d)
    _check(turboquant_mse_encode(codec, k, block_t=BLOCK_T), codec.encode(k), ("norm", "codes"), codec)


def test_turboquant_prod_mse_stage_and_bf16():
    codec = make_codec("turboquant-prod", 3, 128, seed=9, num_heads=1, device=DEV)
    k = _keys((33, 128), seed=1, dtype=torch.bfloat16)
    _check(turboquant_mse_encode(codec, k, block_t=BLOCK_T), codec.encode(k), ("norm", "codes"), codec)


def test_unsupported_codec_is_refused():
    codec = make_codec("octopus", 3, 64, rounding="full", device=DEV)
    with pytest.raises(ValueError, match="rounding 'full'"):
        octopus_encode(codec, _keys((4, 64), seed=0))
    with pytest.raises(ValueError, match="not a TurboQuant"):
        turboquant_mse_encode(codec, _keys((4, 64), seed=0))


def test_codec_encode_dispatches_to_the_fused_encoder():
    """Codec.encode takes the fused kernel when the backend asks for it (here forced, under the
    interpreter) and the PyTorch reference with 'torch'; both write the same bytes."""
    from kernels import make_codec

    g = torch.Generator().manual_seed(5)
    k = torch.randn(2, 2, 6, 64, generator=g).to(DEV)  # 24 rows: a decode step's blocks of 2, 12 programs
    for name in ("octopus", "turboquant-mse"):
        fused = make_codec(name, 3, 64, seed=1, num_heads=2, backend="triton", device=DEV)
        ref = make_codec(name, 3, 64, seed=1, num_heads=2, backend="torch", device=DEV)
        assert fused._fused_encode_fn(k) is not None and ref._fused_encode_fn(k) is None
        _check(fused.encode(k), ref.encode(k), ref.encode(k).tensors, ref)


def test_triton_backend_fails_loudly_where_no_fused_encoder_exists():
    from kernels import make_codec

    with pytest.raises(RuntimeError, match="no fused encoder"):
        make_codec("kivi", 2, 64, backend="triton").encode(torch.randn(32, 64))
    with pytest.raises(RuntimeError, match="cannot encode"):
        make_codec("octopus", 3, 64, backend="triton", rounding="full").encode(torch.randn(4, 64))
    with pytest.raises(ValueError, match="Unknown backend 'gpu'"):
        make_codec("octopus", 3, 64, backend="gpu")


def _same_bytes(out, ref):
    assert set(out.tensors) == set(ref.tensors) == {"codes", "scale", "zero"}
    assert out.shape == ref.shape and out.dtype == ref.dtype
    for f, a in out.tensors.items():
        b = ref.tensors[f]
        assert a.shape == b.shape and a.dtype == b.dtype, f
        if a.dtype == torch.float16:  # compare the bits (fp16 side information)
            a, b = a.view(torch.int16), b.view(torch.int16)
        assert torch.equal(a, b), f"{f}: {int((a != b).sum())} of {a.numel()} differ"


@pytest.mark.parametrize("bits", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("d, group", [(128, 32), (64, 64), (128, 16), (100, 32)])
def test_value_encode_matches_reference_byte_for_byte(bits, d, group):
    vq = ValueQuantizer(bits, d, group_size=group)
    assert value_encoder_unsupported(vq, torch.device(DEV)) is None
    g = torch.Generator().manual_seed(bits * 1000 + d + group)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        v = torch.randn(2, 3, 21, d, generator=g) * (0.1 + torch.rand(2, 3, 21, 1, generator=g) * 8)
        v[0, 0, 0] = 0.75  # one value per group: scale 0
        v[0, 0, 1] = torch.round(v[0, 0, 1] * 8) / 8  # coarse values: ties and exact hits
        v = v.to(dtype).to(DEV)
        _same_bytes(value_encode(vq, v, block_t=BLOCK_T), vq.encode(v))


def test_value_encode_rounds_ties_to_even():
    """(v - zero) / scale exactly k + 0.5: torch.round sends it to the even neighbour."""
    vq = ValueQuantizer(2, 32, group_size=32)  # qmax 3: lo 0, hi 3 -> scale 1
    v = torch.tensor([0.0, 3.0, 0.5, 1.5, 2.5, 1.0, 2.0, 0.25] * 4).to(DEV)
    out, ref = value_encode(vq, v[None]), vq.encode(v[None])
    _same_bytes(out, ref)
    assert vq.field.unpack(out.tensors["codes"])[0, :8].tolist() == [0, 3, 0, 2, 2, 1, 2, 0]


def test_value_encode_empty_and_strided_input():
    vq = ValueQuantizer(3, 64)
    v = torch.randn(2, 4, 10, 64, generator=torch.Generator().manual_seed(0)).to(DEV)
    _same_bytes(value_encode(vq, v[:, :, 3:7]), vq.encode(v[:, :, 3:7]))  # not contiguous
    empty = value_encode(vq, v[:, :, :0])
    assert empty.tensors["codes"].shape == (2, 4, 0, vq.field.nbytes) and empty.num_tokens == 0


def test_value_encoder_refuses_what_it_does_not_cover():
    assert "outside 1..8" in value_encoder_unsupported(ValueQuantizer(12, 64), torch.device(DEV))
    assert "powers of two" in value_encoder_unsupported(ValueQuantizer(4, 96, group_size=96), torch.device(DEV))
    assert "powers of two" in value_encoder_unsupported(ValueQuantizer(4, 96, group_size=32), torch.device(DEV))


def test_codec_encode_values_dispatches_to_the_fused_encoder(monkeypatch):
    """Codec.encode_values takes the fused kernel where the backend asks for fused kernels (forced
    here) and the reference under 'torch'; same bytes. What it does not cover (12-bit values) falls
    back to the reference, also under 'triton'."""
    import kernels.triton.value_encode as ve

    calls = []
    real = ve.value_encode
    monkeypatch.setattr(ve, "value_encode", lambda *a, **k: calls.append(1) or real(*a, **k))
    v = torch.randn(2, 2, 6, 64, generator=torch.Generator().manual_seed(3)).to(DEV)
    for name in ("octopus", "turboquant-mse", "kivi"):
        fused = make_codec(name, 2, 64, seed=1, num_heads=2, backend="triton", device=DEV)
        ref = make_codec(name, 2, 64, seed=1, num_heads=2, backend="torch", device=DEV)
        n = len(calls)
        _same_bytes(fused.encode_values(v), ref.encode_values(v))
        assert len(calls) == n + 1, name
    wide = make_codec("octopus", 3, 64, value_bits=12, backend="triton", device=DEV)
    n = len(calls)
    _same_bytes(wide.encode_values(v), wide.value_quantizer.encode(v))
    assert len(calls) == n


@pytest.mark.parametrize("name", ["octopus", "turboquant-mse", "values"])
def test_a_row_encodes_to_the_same_bytes_in_any_block_of_rows(name):
    """A decode step encodes its few rows two to a program, a prefill sixteen: a token's bytes must
    not depend on which (the key norm is summed by a fixed tree, not by the compiler's reduction)."""
    codec = make_codec("octopus" if name == "values" else name, 3, 128, num_heads=2, seed=1, device=DEV)
    keys = _keys((1, 2, 12, 128), seed=5)  # 24 rows: a full block of 16 and a partial one
    if name == "values":
        outs = [value_encode(codec.value_quantizer, keys, block_t=bt) for bt in (16, 2, 1)]
    else:
        fn = octopus_encode if name == "octopus" else turboquant_mse_encode
        outs = [fn(codec, keys, block_t=bt) for bt in (16, 2, 1)]
        outs.append(fn(codec, keys[:, :, 5:6]))  # one token alone: the rows_per_program default
        for f, t in outs[-1].tensors.items():
            assert torch.equal(t, outs[0].tensors[f][:, :, 5:6]), f
        outs.pop()
    for out in outs[1:]:
        for f, t in out.tensors.items():
            assert torch.equal(t, outs[0].tensors[f]), f
