"""The fused commit of a graphed decode step (kernels/triton/commit.py) against the sequence it replaces:
the window write (``index_copy_``), the slot's gather, ``codec.encode`` and ``codec.encode_values`` on the
fused encoders, ``EncodedStore.write_at``. The same code paths run on the same rows, so every buffer must
come out byte for byte the same (no tolerance: a row's bytes do not depend on the rows encoded with it).
Runs on CUDA, else on the CPU under TRITON_INTERPRET=1 (small shapes: the interpreter runs programs one by one).
"""
from __future__ import annotations

import pytest
import torch

CUDA = torch.cuda.is_available()  # else the interpreter runs the kernels (tests/conftest.py sets TRITON_INTERPRET=1)
triton = pytest.importorskip("triton")

from adapters.cache.encoded_store import EncodedStore  # noqa: E402
from kernels import make_codec  # noqa: E402
from kernels.checks import DeferredFinite  # noqa: E402
from kernels.triton.encoders import commit_unsupported  # noqa: E402

DEV = "cuda" if CUDA else "cpu"
B, H, CAP = 2, 2, 6


def _rand(shape, seed, dtype):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g) * (0.5 + 4 * torch.rand(*shape[:-1], 1, generator=g))
    return x.to(dtype).to(DEV)


def _stores(codec, d, dtype):
    """Two stores of CAP tokens holding the same random bytes (rows the commit must leave as they are)."""
    like_k, like_v = codec.encode(_rand((B, H, 1, d), 1, dtype)), codec.encode_values(_rand((B, H, 1, d), 2, dtype))
    out = []
    for _ in range(2):
        sk, sv = EncodedStore(B), EncodedStore(B)
        sk.allocate(CAP, like_k)
        sv.allocate(CAP, like_v)
        out.append((sk, sv))
    g = torch.Generator().manual_seed(3)
    for a, b in zip(*out):
        for name, t in a.buffers().items():
            t.view(torch.uint8).copy_(torch.randint(0, 256, t.view(torch.uint8).shape, generator=g,
                                                    dtype=torch.uint8).to(DEV))
            b.buffers()[name].copy_(t)
    return out


def _run(codec, d, dtype, slots, steps, nan_at=None):
    """``steps`` steps of a ring of ``slots`` slots, the fused way and (without ``nan_at``: on the CPU the
    reference raises at once) the reference way; returns both sides' buffers (ring, keys, values by field)
    and their non-finite notes."""
    (fk, fv), (rk, rv) = _stores(codec, d, dtype)
    rings = [(_rand((B, H, slots, d), 4, dtype), _rand((B, H, slots, d), 5, dtype)) for _ in range(2)]
    rings[1] = (rings[0][0].clone(), rings[0][1].clone())
    defer = DeferredFinite(), DeferredFinite()
    flags = defer[0].flag("keys", DEV), defer[0].flag("values", DEV)
    new_slot, slot, pos = (torch.zeros(1, dtype=torch.int64, device=DEV) for _ in range(3))
    commit = codec.fused_commit(torch.device(DEV))(codec, *rings[0], fk.buffers(), fv.buffers(), new_slot, slot, pos,
                                                   flags)
    for s in range(steps):
        new_slot.fill_((s + slots - 1) % slots)
        slot.fill_(s % slots)
        pos.fill_(s)
        k = _rand((B, 1, H, d), 10 + s, dtype).transpose(1, 2)  # the model's [B, H, 1, d] view: strided
        v = _rand((B, H, 1, d), 20 + s, dtype)
        if nan_at == s:
            k[1, 0, 0, 3] = float("nan")
            v[0, 1, 0, 0] = float("inf")
        commit(k, v)
        if nan_at is not None:
            continue
        wk, wv = rings[1]
        wk.index_copy_(2, new_slot, k)
        wv.index_copy_(2, new_slot, v)
        sk = codec.encode(wk.index_select(2, slot), defer[1])
        sv = codec.encode_values(wv.index_select(2, slot), defer[1])
        rk.write_at(sk, pos)
        rv.write_at(sv, pos)
    sides = []
    for (wk, wv), sk, sv in ((rings[0], fk, fv), (rings[1], rk, rv)):
        sides.append({"ring_k": wk, "ring_v": wv, **{f"k.{n}": t for n, t in sk.buffers().items()},
                      **{f"v.{n}": t for n, t in sv.buffers().items()}})
    return sides, defer


def _same(a: dict, b: dict):
    assert a.keys() == b.keys()
    for name in a:
        x, y = a[name], b[name]
        assert x.dtype == y.dtype and x.shape == y.shape, name
        assert torch.equal(x.view(torch.uint8), y.view(torch.uint8)), \
            f"{name}: {int((x.view(torch.uint8) != y.view(torch.uint8)).sum())} bytes differ"


@pytest.mark.parametrize("name, bits, opts", [("octopus", 3, {}), ("octopus", 2, {"rounding": "nearest"}),
                                              ("turboquant-mse", 3, {}), ("turboquant-mse", 4, {"num_heads": 1})])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_fused_commit_writes_the_bytes_of_encode_and_write_at(name, bits, opts, dtype):
    opts = {"num_heads": H, **opts}
    codec = make_codec(name, bits, 64, seed=2, layer=1, backend="triton", device=DEV, **opts)
    assert commit_unsupported(codec, torch.device(DEV)) is None
    (fused, ref), _ = _run(codec, 64, dtype, slots=3, steps=4)  # the ring wraps; rows 4, 5 keep their bytes
    _same(fused, ref)


def test_a_ring_of_one_slot_commits_the_steps_own_token():
    """No native window (residual 0): the token the step writes is the one it commits."""
    codec = make_codec("octopus", 3, 64, seed=2, num_heads=H, value_group=16, backend="triton", device=DEV)
    (fused, ref), _ = _run(codec, 64, torch.bfloat16, slots=1, steps=2)
    _same(fused, ref)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # the interpreter computes on NaN
def test_a_non_finite_token_is_noted_when_it_is_committed():
    """A NaN key and an inf value sit in the window unnoted (as the eager cache holds them natively) and
    are noted in the non-finite check's flags by the step that commits them; the next check raises, as
    after the reference's deferred notes."""
    codec = make_codec("turboquant-mse", 3, 64, seed=2, num_heads=H, backend="triton", device=DEV)
    for steps, noted in ((3, False), (4, True)):  # written at step 1 into slot 0, which step 3 commits
        _, (fused, _) = _run(codec, 64, torch.float32, slots=3, steps=steps, nan_at=1)
        if noted:
            with pytest.raises(ValueError, match="keys contained non-finite values"):
                fused.raise_if_any()
            assert not torch.isfinite(fused.flag("values", DEV))
        else:
            fused.raise_if_any()


def test_which_codecs_commit_in_one_launch():
    """The codec's layout and value quantizer decide, never its name; the backend decision is
    kernels.backend.decide_commit's (nothing fused where the backend keeps the reference)."""
    dev = torch.device(DEV)
    assert make_codec("octopus", 3, 64, backend="torch").fused_commit(dev) is None
    for name, bits, why in (("kivi", 2, "no fused encoder"), ("octopus-qjl", 3, "QJL residual"),
                            ("turboquant-prod", 3, "QJL residual"), ("vllm-fp8", 8, "no fused encoder")):
        codec = make_codec(name, bits, 64, backend="triton")
        assert why in commit_unsupported(codec, dev) and codec.fused_commit(dev) is None
    odd = make_codec("octopus", 3, 96, value_group=32, backend="triton")  # 3 value groups: not a power of two
    assert "powers of two" in commit_unsupported(odd, dev) and odd.fused_commit(dev) is None
