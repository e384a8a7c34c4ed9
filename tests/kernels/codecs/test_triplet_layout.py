"""The fused triplet-code layout of OCTOPUS keys (kernels.fused_layout.TripletCodes, issue #16)
against the two-field layout it replaced: same codes, same decoded keys bit for bit, same bytes.

The old layout is rebuilt here from its documentation (kernels/codecs/octopus.py before issue #16):
"u" = BitField(2 nt, b_u) of the interleaved direction codes u_0, v_0, u_1, ..., "r" =
BitField(nt, b_r) of the triplet-length codes, decoded as rho_c[r_i] * octa_decode(c[u_i], c[v_i]).
The codes come from kernels.joint_rounding directly (the quantizer both layouts store), not from
the codec under test."""
from __future__ import annotations

import pytest
import torch

from kernels import make_codec
from kernels.fused_layout import TripletCodes
from kernels.joint_rounding import decode_triplets, encode_triplets
from kernels.packing import BitField
from kernels.rotation import Rotation
from helpers.rate_refs import key_bytes


def _old_state(k, d, b_u, b_r, seed, layer, heads, rounding="local"):
    """(norm, old "u" field, old "r" field, y_hat decoded from the old fields) for keys k."""
    rot = Rotation(d, seed, layer, heads)
    n = rot.padded
    nt = -(-n // 3)
    x = k.float()
    norm = x.norm(dim=-1, keepdim=True)
    y = rot.forward(x / torch.where(norm > 0, norm, torch.ones_like(norm)))
    t = torch.nn.functional.pad(y, (0, 3 * nt - n)).unflatten(-1, (nt, 3))
    iu, iv, ir = encode_triplets(t, b_u, b_r, n, rounding)
    u_old = BitField(2 * nt, b_u).pack(torch.stack((iu, iv), -1).flatten(-2))
    r_old = BitField(nt, b_r).pack(ir)
    uv = BitField(2 * nt, b_u).unpack(u_old)
    y_hat = decode_triplets(uv[..., 0::2], uv[..., 1::2], BitField(nt, b_r).unpack(r_old), b_u, b_r, n)
    return norm, u_old, r_old, norm * rot.inverse(y_hat.flatten(-2)[..., :n])


@pytest.mark.parametrize("d,bits,split", [(128, 2, None), (128, 3, None), (128, 4, None), (64, 3, None),
                                          (96, 3, None), (128, 1, None), (64, 3, (3, 3)), (256, 5, None),
                                          (64, 6, None)])
def test_decode_equals_the_old_layout_bit_for_bit(d, bits, split):
    heads = 2
    g = torch.Generator().manual_seed(d + bits)
    k = torch.randn(2, heads, 23, d, generator=g) * (0.5 + 3 * torch.rand(2, heads, 23, 1, generator=g))
    k[0, 1, 5] = 0  # a zero key stays zero
    opts = {} if split is None else {"split": split}
    codec = make_codec("octopus", bits, d, seed=4, layer=3, num_heads=heads, backend="torch", **opts)
    b_u, b_r = codec.stage.b_u, codec.stage.b_r
    norm, u_old, r_old, k_old = _old_state(k, d, b_u, b_r, 4, 3, heads)
    st = codec.encode(k)
    assert torch.equal(st.tensors["norm"], norm)
    assert torch.equal(codec.decode(st).float(), k_old)  # same keys after decode, bit for bit
    # same bytes per token as the two old fields (the rate tests' documented count at the default split)
    assert st.tensors["u"].shape[-1] == u_old.shape[-1] + r_old.shape[-1]
    assert st.nbytes() == norm.numel() * 4 + u_old.numel() + r_old.numel()
    if split is None and bits > 1:
        assert st.nbytes() == k.shape[:-1].numel() * key_bytes("octopus", bits, d)


@pytest.mark.parametrize("nt,b_u,b_r", [(43, 3, 1), (43, 4, 2), (43, 5, 3), (22, 4, 2), (86, 2, 0), (3, 7, 8)])
def test_triplet_codes_round_trip_and_zero_padding(nt, b_u, b_r):
    g = torch.Generator().manual_seed(nt * 100 + b_u)
    tc = TripletCodes(nt, b_u, b_r)
    iu, iv = (torch.randint(0, 1 << b_u, (5, nt), generator=g) for _ in range(2))
    ir = torch.randint(0, 1 << b_r, (5, nt), generator=g)
    row = tc.pack(iu, iv, ir)
    assert row.dtype == torch.uint8 and row.shape == (5, tc.nbytes)
    assert all(torch.equal(a, b) for a, b in zip(tc.unpack(row), (iu, iv, ir)))
    # by hand: triplet i's code u | v << b_u | r << 2 b_u at bits [i W, (i + 1) W), LSB first
    W = 2 * b_u + b_r
    bitrow = ((row.long().unsqueeze(-1) >> torch.arange(8)) & 1).flatten(-2)  # [5, 8 nbytes]
    for i in (0, nt // 2, nt - 1):
        code = (bitrow[:, i * W:(i + 1) * W] << torch.arange(W)).sum(-1)
        assert torch.equal(code, iu[:, i] | (iv[:, i] << b_u) | (ir[:, i] << (2 * b_u)))
    assert int(bitrow[:, nt * W:].sum()) == 0  # the bits past the last code are zero
