"""The decode-attention dispatch: 'auto' tries the table-lookup CUDA kernel, then the Triton kernel,
then the PyTorch reference, one decision (kernels.backend.decide) that keeps each refusal's reason.

CPU: the decision itself (fake paths, and the real ones asked about a CUDA device with CuPy
hidden). GPU (sm_90 and CuPy; skipped elsewhere): 'auto' runs the LUT kernel for OCTOPUS,
TurboQuant-MSE and their QJL forms and matches the reference; what it does not cover falls back to the Triton kernel with the reason.
"""
from __future__ import annotations

import sys

import pytest
import torch

from kernels import make_codec
from kernels.attention import decode_attention, decode_attention_torch, decide_attention
from kernels.backend import ATTENTION_PATHS, Decision, decide, fused_wanted, use_fused
from helpers.decode_checks import lut_gpu as gpu, out_rtol

CUDA = torch.device("cuda")
CPU = torch.device("cpu")


# ---------------------------------------------------------------------------------------------
# CPU: the decision
# ---------------------------------------------------------------------------------------------
def test_decide_order_and_reasons(monkeypatch):
    monkeypatch.delenv("KVCODEC_BACKEND", raising=False)
    ok, no = (lambda: None), (lambda: "cupy missing (test)")
    assert ATTENTION_PATHS == ("lut", "triton")
    assert decide("auto", CUDA, [("lut", ok), ("triton", ok)], "x") == Decision("lut")
    d = decide("auto", CUDA, [("lut", no), ("triton", ok)], "x")
    assert d.path == "triton" and d.fused and d.reason("lut") == "cupy missing (test)"
    assert "lut: cupy missing" in str(d)
    d = decide("auto", CUDA, [("lut", no), ("triton", lambda: "no triton")], "x")
    assert d.path == "torch" and not d.fused and d.refused == (("lut", "cupy missing (test)"), ("triton", "no triton"))
    d = decide("auto", CPU, [("lut", ok), ("triton", ok)], "x")  # 'auto' fuses on CUDA only
    assert d.path == "torch" and "CUDA only" in d.reason("lut")
    assert decide("torch", CUDA, [("lut", ok)], "x").path == "torch"
    # a named kernel: that one or an error with the reason; never a silent fallback
    assert decide("triton", CPU, [("lut", no), ("triton", ok)], "x").path == "triton"
    with pytest.raises(RuntimeError, match="backend='lut' cannot run it: cupy missing"):
        decide("lut", CUDA, [("lut", no), ("triton", ok)], "run it")
    # an operation without the named path (encoding under 'lut') decides as under 'auto'
    assert decide("lut", CUDA, [("triton", ok)], "x").path == "triton"
    assert decide("lut", CPU, [("triton", ok)], "x").path == "torch"
    assert fused_wanted("lut", CPU) and use_fused("lut", CUDA, ok, "x") and not use_fused("lut", CPU, ok, "x")
    monkeypatch.setenv("KVCODEC_BACKEND", "triton")
    assert decide("auto", CUDA, [("lut", ok), ("triton", ok)], "x").path == "triton"


def _q(Hq=4, d=128, dtype=torch.bfloat16):
    return torch.randn(1, Hq, 1, d).to(dtype)


def test_real_paths_without_cupy_fall_back_with_the_reason(monkeypatch):
    """Asked about a CUDA device with CuPy hidden: the LUT kernel is refused ('cupy missing') and
    the decision moves on to the Triton kernel (or the reference where Triton cannot run)."""
    monkeypatch.delenv("KVCODEC_BACKEND", raising=False)
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy -> ImportError
    codec = make_codec("octopus", 3, 128, num_heads=2)
    d = decide_attention(_q(), codec, 2, device=CUDA)
    assert "cupy missing" in d.reason("lut")
    assert d.path in ("triton", "torch") and (d.path == "triton" or d.reason("triton"))
    with pytest.raises(RuntimeError, match="cupy missing"):
        decide_attention(_q(), codec, 2, backend="lut", device=CUDA)


def test_real_paths_refuse_what_the_lut_kernel_does_not_cover(monkeypatch):
    monkeypatch.delenv("KVCODEC_BACKEND", raising=False)
    cases = [(make_codec("turboquant-prod", 6, 128, num_heads=2), 4, "scalar key codes of 5 bits"),
             (make_codec("octopus-qjl", 6, 128, num_heads=2), 4, "OCTOPUS split"),
             (make_codec("turboquant-mse", 5, 128, num_heads=2), 4, "scalar key codes of 5 bits"),
             (make_codec("octopus", 3, 128, num_heads=1), 16, "at most 8"),
             (make_codec("octopus", 3, 128, num_heads=2, value_group=64), 4, "value quantizer")]
    for codec, Hq, why in cases:
        Hkv = codec.fused_layout().rotation.num_heads
        d = decide_attention(_q(Hq), codec, Hkv, device=CUDA)
        assert why in d.reason("lut"), (codec, d)
    d = decide_attention(_q(), make_codec("octopus", 3, 128, num_heads=2), 2)  # q on the CPU
    assert d.path == "torch" and "CUDA only" in d.reason("lut")
    assert decide_attention(torch.randn(1, 4, 2, 128), make_codec("octopus", 3, 128), 2,
                            device=CUDA).reason("lut").startswith("the table-lookup kernel takes one query")


def test_named_lut_backend_on_the_cpu_raises_with_the_reason():
    codec = make_codec("octopus", 2, 64, num_heads=1)
    k, v = torch.randn(1, 1, 20, 64), torch.randn(1, 1, 20, 64)
    q = torch.randn(1, 2, 1, 64)
    with pytest.raises(RuntimeError, match="backend='lut' cannot run this call: the CUDA kernel needs a CUDA device"):
        decode_attention(q, codec.encode(k), codec.encode_values(v), codec, backend="lut")


# ---------------------------------------------------------------------------------------------
# GPU: the dispatch runs the LUT kernel
# ---------------------------------------------------------------------------------------------
def _state(name, bits, d, B, Hkv, G, T, W, seed=0, **kw):
    g = torch.Generator().manual_seed(seed)
    codec = make_codec(name, bits, d, seed=seed, layer=2, num_heads=Hkv, device="cuda", **kw)
    k = torch.randn(B, Hkv, T, d, generator=g) * (1 + torch.rand(B, Hkv, T, 1, generator=g) * 3)
    v = torch.randn(B, Hkv, T, d, generator=g)
    q = (torch.randn(B, Hkv * G, 1, d, generator=g) * 2).to(torch.bfloat16).cuda()
    wk = torch.randn(B, Hkv, W, d, generator=g).to(torch.bfloat16).cuda()
    wv = torch.randn(B, Hkv, W, d, generator=g).to(torch.bfloat16).cuda()
    return codec, q, codec.encode(k.cuda()), codec.encode_values(v.cuda()), wk, wv


def _spy(monkeypatch):
    """Count the launches of each fused kernel through the dispatch."""
    import kernels.cuda.decode_lut as lut
    import kernels.triton.decode_attention as tri

    calls = {"lut": 0, "triton": 0}
    real_lut, real_tri = lut.decode_attention_lut, tri.decode_attention_fused

    def lut_fn(*a, **kw):
        calls["lut"] += 1
        return real_lut(*a, **kw)

    def tri_fn(*a, **kw):
        calls["triton"] += 1
        return real_tri(*a, **kw)

    monkeypatch.setattr(lut, "decode_attention_lut", lut_fn)
    monkeypatch.setattr(tri, "decode_attention_fused", tri_fn)
    return calls


def _rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


def test_turboquant_mse_is_covered_on_cuda(monkeypatch):
    """Asked about a CUDA device (CuPy present or not): TurboQuant-MSE's layout is one the LUT kernel
    reads, so its refusal, if any, is about the machine, never the codec."""
    monkeypatch.delenv("KVCODEC_BACKEND", raising=False)
    codec = make_codec("turboquant-mse", 3, 128, num_heads=2)
    d = decide_attention(_q(), codec, 2, device=CUDA)
    why = d.reason("lut")
    assert d.path == "lut" or any(w in why for w in ("cupy missing", "CUDA is not available", "sm_90")), why


@gpu
@pytest.mark.parametrize("name", ["octopus", "turboquant-mse", "octopus-qjl", "turboquant-prod"])
@pytest.mark.parametrize("bits", [2, 3, 4])
def test_auto_runs_the_lut_kernel(name, bits, monkeypatch):
    monkeypatch.delenv("KVCODEC_BACKEND", raising=False)
    calls = _spy(monkeypatch)
    codec, q, ks, vs, wk, wv = _state(name, bits, 128, B=2, Hkv=2, G=7, T=700, W=16, seed=bits)
    lengths = torch.tensor([700, 431], device="cuda")
    assert decide_attention(q, codec, 2) == Decision("lut")
    out = decode_attention(q, ks, vs, codec, wk, wv, lengths, backend="auto")
    ref = decode_attention_torch(q, ks, vs, codec, wk, wv, lengths)
    assert calls == {"lut": 1, "triton": 0}
    assert _rel(out, ref) < out_rtol(torch.bfloat16), _rel(out, ref)  # fp16 tables and dots, bf16 outputs
    forced = decode_attention(q, ks, vs, codec, wk, wv, lengths, backend="lut")
    assert torch.equal(forced, out)
    decode_attention(q, ks, vs, codec, wk, wv, lengths, backend="triton")
    assert calls == {"lut": 2, "triton": 1}


@gpu
@pytest.mark.parametrize("name,kw,G,why", [("turboquant-prod", {"value_group": 64}, 4, "value quantizer"),
                                           ("octopus", {}, 12, "at most 8")])
def test_auto_falls_back_to_triton_with_the_reason(name, kw, G, why, monkeypatch):
    monkeypatch.delenv("KVCODEC_BACKEND", raising=False)
    calls = _spy(monkeypatch)
    codec, q, ks, vs, wk, wv = _state(name, 3, 128, B=1, Hkv=1, G=G, T=300, W=8, seed=G, **kw)
    d = decide_attention(q, codec, 1)
    assert d.path == "triton" and why in d.reason("lut")
    out = decode_attention(q, ks, vs, codec, wk, wv)
    assert calls == {"lut": 0, "triton": 1}
    assert _rel(out, decode_attention_torch(q, ks, vs, codec, wk, wv)) < out_rtol(torch.bfloat16)
    with pytest.raises(RuntimeError, match=why):
        decode_attention(q, ks, vs, codec, wk, wv, backend="lut")


@gpu
def test_cache_decode_step_goes_through_the_lut_kernel(monkeypatch):
    """LayerKV's single-token step reaches the LUT kernel through the same dispatch."""
    from adapters.cache.config import CacheConfig
    from adapters.cache.layer_kv import LayerKV

    monkeypatch.delenv("KVCODEC_BACKEND", raising=False)
    calls = _spy(monkeypatch)
    g = torch.Generator().manual_seed(0)
    k, v = (torch.randn(1, 2, 200, 128, generator=g).to(torch.bfloat16).cuda() for _ in range(2))
    q = torch.randn(1, 4, 1, 128, generator=g).to(torch.bfloat16).cuda()
    outs = {}
    for backend in ("auto", "torch"):
        layer = LayerKV(make_codec("octopus", 3, 128, num_heads=2, device="cuda"),
                        CacheConfig(codec="octopus", bits=3, residual=8, backend=backend))
        layer.append(k, v)
        outs[backend] = layer.attend(q)
    assert calls == {"lut": 1, "triton": 0}
    assert _rel(outs["auto"], outs["torch"]) < out_rtol(torch.bfloat16)
