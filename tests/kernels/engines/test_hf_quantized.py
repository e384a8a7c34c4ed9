"""transformers' quantized KV cache as codecs (kernels/engines/hf_quantized.py): hf-quanto against optimum-quanto's own
quantizer, hf-hqq against HQQ's, both on the per-token groups the codec stores, and the stored bytes against the
layout (packed codes, a scale and a zero per group in the input's dtype). The transformers-backed cache itself is
tested against plain transformers in tests/adapters/hf/test_hf_library_cache.py."""
from __future__ import annotations

import pytest
import torch

from kernels import make_codec

pytest.importorskip("optimum.quanto")
pytest.importorskip("hqq")


def _keys(d=128, n=40, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(2, 2, n, d, generator=g) * (1 + 3 * torch.rand(2, 2, n, 1, generator=g))).to(dtype)


@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quanto_codes_and_values_are_the_librarys(bits, dtype):
    from optimum.quanto import MaxOptimizer, qint2, qint4, quantize_weight

    x = _keys(dtype=dtype)
    c = make_codec("hf-quanto", bits, 128)
    s = c.encode(x)
    g = x.reshape(-1, 64)  # transformers' axis 0: rows of 64 contiguous coordinates, a token-head's halves here
    qtype = qint4 if bits == 4 else qint2
    scale, shift = MaxOptimizer()(g, qtype, 0, 64)
    q = quantize_weight(g, qtype, 0, scale, shift, 64)
    assert torch.equal(c.field.unpack(s.tensors["codes"]).reshape(-1, 64), q._data.unpack().long())
    assert torch.equal(s.tensors["scale"].reshape(-1, 1), scale) and torch.equal(s.tensors["zero"].reshape(-1, 1), shift)
    assert torch.equal(c.decode(s), q.dequantize().reshape(x.shape))
    assert s.tensors["scale"].dtype == dtype  # in the model's dtype, as the library keeps it


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
def test_hqq_codes_and_values_are_the_librarys(bits):
    from hqq.core.quantize import Quantizer

    x = _keys(d=64)
    c = make_codec("hf-hqq", bits, 64)
    s = c.encode(x)
    codes, meta = Quantizer.quantize(x, nbits=bits, group_size=64, axis=1, compute_dtype=torch.float32, device="cpu")
    meta["compute_dtype"] = torch.float32
    torch.testing.assert_close(c.decode(s), Quantizer.dequantize(codes, meta), rtol=0, atol=0)
    assert s.nbytes() == codes.numel() * codes.element_size() + 2 * meta["scale"].numel() * 4  # bytes HQQ holds


def test_hqq_refines_round_to_nearest():
    """HQQ's optimizer lowers the error of min-max rounding on the same groups."""
    x = _keys(d=128, n=200, seed=3)
    for bits in (2, 4):  # quanto's codes are min-max round-to-nearest on the same groups
        hqq, rtn = make_codec("hf-hqq", bits, 128), make_codec("hf-quanto", bits, 128)
        assert float((hqq.decode(hqq.encode(x)) - x).pow(2).sum()) < float((rtn.decode(rtn.encode(x)) - x).pow(2).sum())


def test_bytes_per_token_head():
    for name, bits in (("hf-quanto", 4), ("hf-quanto", 2), ("hf-hqq", 1), ("hf-hqq", 8)):
        for dtype, size in ((torch.float32, 4), (torch.bfloat16, 2)):
            c = make_codec(name, bits, 128, q_group_size=32)
            x = _keys(dtype=dtype)
            per = 128 * bits // 8 + 2 * (128 // 32) * size  # packed codes, then scale and zero per group of 32
            assert c.encode(x).nbytes() == x[..., 0].numel() * per == c.expected_nbytes(x.shape, dtype)


def test_options_are_transformers_cache_config():
    c = make_codec("hf-hqq", 2, 128, axis_key=1, axis_value=1, residual_length=16)
    assert c.transformers_cache_config() == {"backend": "hqq", "nbits": 2, "q_group_size": 64, "residual_length": 16,
                                             "axis_key": 1, "axis_value": 1}
    with pytest.raises(ValueError, match="hf-quanto.axis_key=1: must be one of 0, -1"):
        make_codec("hf-quanto", 4, 128, axis_key=1)  # quanto's axes are 0 and -1
    with pytest.raises(ValueError, match="hf-hqq.axis_value=-1: must be one of 0, 1"):
        make_codec("hf-hqq", 4, 128, axis_value=-1)  # HQQ's are 0 and 1
    with pytest.raises(ValueError, match="q_group_size=0: 0 is out of range"):
        make_codec("hf-quanto", 4, 128, q_group_size=0)
    # the per-token form cuts groups at a token-head's end where 64 does not divide the head dim
    c = make_codec("hf-hqq", 4, 80)
    assert c.group == 16 and c.encode(_keys(d=80)).tensors["scale"].shape[-1] == 5
