"""The one PyTorch attention core (kernels.attention.attend) against a naive float64 computation
(an explicit loop over batch, query head and query token), and the two callers that must go
through it: LayerKV.attend and decode_attention_torch (bit for bit)."""
from __future__ import annotations

import math

import pytest
import torch
from helpers.tolerances import U32, attention_atol

from adapters.cache.config import CacheConfig

from adapters.cache.layer_kv import LayerKV
from kernels import make_codec
from kernels.attention import attend, decide_attention, decode_attention, decode_attention_torch
from kernels.backend import fused_wanted, use_fused

D = 16


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _kv(B, Hkv, T, g):
    return torch.randn(B, Hkv, T, D, generator=g), torch.randn(B, Hkv, T, D, generator=g)


def naive(q, parts, mask=None, causal=False, scale=None, softcap=None):
    """q [B, Hq, Tq, d]; parts: [(k, v, lengths or None)] in token order, k/v [B, Hkv, n, d].
    Float64, one query row at a time; a row with nothing to attend gives zeros. ``softcap``: each
    scaled score s becomes softcap * tanh(s / softcap) before the mask (Gemma 2)."""
    B, Hq, Tq, d = q.shape
    Hkv = parts[0][0].shape[1]
    scale = 1 / math.sqrt(d) if scale is None else scale
    T = sum(k.shape[-2] for k, _, _ in parts)
    m = None if mask is None else mask.expand(B, Hq, Tq, T)
    out = torch.zeros(B, Hq, Tq, d, dtype=torch.float64)
    for b in range(B):
        for h in range(Hq):
            kv = h // (Hq // Hkv)  # GQA: query head h reads KV head h // G
            K = torch.cat([k[b, kv] for k, _, _ in parts]).double()
            V = torch.cat([v[b, kv] for _, v, _ in parts]).double()
            keep = [lens is None or t < int(lens[b]) for k, _, lens in parts for t in range(k.shape[-2])]
            for i in range(Tq):
                s = (K @ q[b, h, i].double()) * scale
                if softcap is not None:
                    s = softcap * torch.tanh(s / softcap)
                for t in range(T):
                    if m is not None:
                        if m.dtype == torch.bool:
                            keep_t = bool(m[b, h, i, t])
                        else:
                            s[t] += float(m[b, h, i, t])
                            keep_t = True
                    else:
                        keep_t = True
                    if not keep[t] or not keep_t or (causal and t > T - Tq + i):
                        s[t] = -math.inf
                if torch.isinf(s).all():
                    continue
                p = torch.exp(s - s.max())
                out[b, h, i] = (p / p.sum()) @ V
    return out


def atol(q, parts, mask=None, scale=None, softcap=None, n=D):
    """attention_atol of the float32 core against the float64 naive one over ``parts`` [(k, v, lengths)]:
    ``n`` rounding steps a score takes (D for a dot product; a codec's score also rotates the query), an
    additive mask's addition and a soft cap's division, tanh and product (4 roundings of at most the cap)."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    k = torch.cat([p[0] for p in parts], -2)
    v = torch.cat([p[1] for p in parts], -2)
    qn, kn = float(q.norm(dim=-1).max()), float(k.norm(dim=-1).max())
    extra = U32 * (scale * qn * kn + (float(mask.abs().max()) if mask is not None and mask.dtype != torch.bool else 0))
    if softcap is not None:
        extra += 4 * U32 * softcap
    return attention_atol(qn, kn, float(v.abs().max()), scale, n, k.shape[-2], score_extra=extra)


CASES = [  # (G, Tq, W, t_new, lengths, window_lengths, mask kind, causal)
    (1, 1, 0, 0, None, None, None, False),
    (3, 1, 5, 0, [9, 4], [5, 2], None, False),
    (2, 4, 3, 4, None, None, None, True),
    (2, 4, 3, 4, None, None, "bool", True),
    (4, 3, 0, 3, [9, 0], None, "additive", False),
    (1, 5, 6, 5, None, None, "additive", True),
    (3, 2, 2, 0, [0, 0], [0, 1], "bool", False),  # the first sequence has nothing to attend
]


@pytest.mark.parametrize("G,Tq,W,t_new,lengths,wlens,mask_kind,causal", CASES)
def test_core_matches_naive(G, Tq, W, t_new, lengths, wlens, mask_kind, causal):
    g = _gen(G * 100 + Tq * 10 + W)
    B, Hkv, T = 2, 2, 9
    q = torch.randn(B, Hkv * G, Tq, D, generator=g)
    k, v = _kv(B, Hkv, T, g)
    wk, wv = _kv(B, Hkv, W, g) if W else (None, None)
    kn, vn = _kv(B, Hkv, t_new, g) if t_new else (None, None)
    total = T + W + t_new
    mask = None
    if mask_kind == "bool":
        mask = torch.rand(B, 1, Tq, total, generator=g) > 0.3
        mask[..., -1] = True  # with causal order every row keeps its own token
        if lengths == [0, 0]:
            mask[0] = False
    elif mask_kind == "additive":
        mask = torch.randn(B, Hkv * G, 1, total, generator=g)
    out = attend(q, decoded=(k, v), window_k=wk, window_v=wv, k_new=kn, v_new=vn, lengths=lengths,
                 window_lengths=wlens, mask=mask, causal=causal, scale=0.3)
    parts = [(k, v, lengths)] + ([(wk, wv, wlens)] if W else []) + ([(kn, vn, None)] if t_new else [])
    ref = naive(q, parts, mask, causal, scale=0.3)
    assert out.shape == q.shape and out.dtype == q.dtype
    torch.testing.assert_close(out.double(), ref, rtol=0, atol=atol(q, parts, mask, scale=0.3))  # float32 core


def test_nothing_to_attend_gives_zeros():
    q = torch.randn(2, 4, 3, 16)
    assert torch.equal(attend(q), torch.zeros_like(q))
    empty = torch.zeros(2, 2, 0, 16)
    assert torch.equal(attend(q, window_k=empty, window_v=empty), torch.zeros_like(q))


def test_core_scores_through_the_codec():
    """The compressed part given as codec states is scored by codec.score: for a codec without an
    estimator that is <q, decode(k)>, so the naive computation runs on the decoded keys."""
    g = _gen(3)
    codec = make_codec("turboquant-mse", 4, D, num_heads=2)
    k, v = _kv(2, 2, 11, g)
    ks, vs = codec.encode(k), codec.encode_values(v)
    wk, wv = _kv(2, 2, 3, g)
    q = torch.randn(2, 6, 2, D, generator=g)
    out = attend(q, codec, ks, vs, window_k=wk, window_v=wv, lengths=[11, 5], causal=True)
    parts = [(codec.decode(ks), codec.decode_values(vs), [11, 5]), (wk, wv, None)]
    ref = naive(q, parts, causal=True)
    # codec.score rotates the query (log2 D butterfly stages and the scaling) before its D-term dot
    torch.testing.assert_close(out.double(), ref, rtol=0, atol=atol(q, parts, n=2 * D + 4))


def test_nothing_to_attend_is_zero():
    q = torch.randn(1, 2, 1, D)
    assert torch.equal(attend(q, window_k=torch.zeros(1, 1, 0, D), window_v=torch.zeros(1, 1, 0, D)),
                       torch.zeros_like(q))


@pytest.mark.parametrize("codec,attend_mode", [("turboquant-mse", "score"), ("turboquant-prod", "score"),
                                               ("octopus", "reconstruct")])
def test_layer_attend_is_the_core(codec, attend_mode):
    """LayerKV.attend gathers (committed states or their memoised decode, window, tokens in flight,
    mask, causal) and calls the core: the same bits as calling it directly."""
    g = _gen(7)
    layer = LayerKV(make_codec(codec, 3, D, num_heads=2), CacheConfig(codec=codec, bits=3, residual=4,
                                                                      attend=attend_mode, backend="torch"))
    k, v = _kv(2, 2, 30, g)
    layer.append(k[..., :26, :], v[..., :26, :])
    kn, vn = k[..., 26:, :], v[..., 26:, :]
    q = torch.randn(2, 4, 4, D, generator=g)
    mask = torch.randn(2, 1, 4, 30, generator=g)
    got = layer.attend(q, mask=mask, k_new=kn, v_new=vn, causal=True)
    if layer._uses_memo() or attend_mode == "reconstruct":
        prefix = {"decoded": layer.decoded()}
    else:
        prefix = {"codec": layer.codec, "key_state": layer.compressed_keys(), "value_state": layer.compressed_values()}
    want = attend(q, **prefix, window_k=layer.window_k, window_v=layer.window_v, k_new=kn, v_new=vn, mask=mask,
                  causal=True)
    assert torch.equal(got, want)
    if "decoded" in prefix:  # and it is attention: the naive computation over the same keys
        dk, dv = prefix["decoded"]
        parts = [(dk, dv, None), (layer.window_k, layer.window_v, None), (kn, vn, None)]
        ref = naive(q, parts, mask, True)
        torch.testing.assert_close(got.double(), ref, rtol=0, atol=atol(q, parts, mask))


def test_decode_attention_torch_is_the_core():
    g = _gen(9)
    codec = make_codec("octopus-qjl", 3, D, num_heads=2)
    k, v = _kv(2, 2, 13, g)
    ks, vs = codec.encode(k), codec.encode_values(v)
    wk, wv = _kv(2, 2, 4, g)
    q = torch.randn(2, 6, 1, D, generator=g)
    got = decode_attention_torch(q, ks, vs, codec, wk, wv, lengths=[13, 2], window_lengths=[4, 1], scale=0.2)
    want = attend(q, codec, ks, vs, window_k=wk, window_v=wv, lengths=[13, 2], window_lengths=[4, 1], scale=0.2)
    assert torch.equal(got, want)


def test_one_backend_decision(monkeypatch):
    monkeypatch.delenv("KVCODEC_BACKEND", raising=False)
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert not fused_wanted("torch", cuda) and not fused_wanted("auto", cpu) and fused_wanted("auto", cuda)
    assert fused_wanted("triton", cpu)
    assert use_fused("triton", cpu, lambda: None, "x") and not use_fused("auto", cuda, lambda: "no", "x")
    with pytest.raises(RuntimeError, match="backend='triton' cannot run it: no"):
        use_fused("triton", cpu, lambda: "no", "run it")
    monkeypatch.setenv("KVCODEC_BACKEND", "torch")
    assert not fused_wanted("auto", cuda) and fused_wanted("triton", cuda)
    with pytest.raises(ValueError, match="Unknown backend 'gpu'. Available: auto, lut, triton, torch"):
        fused_wanted("gpu", cpu)


@pytest.mark.parametrize("softcap,Tq,mask_kind", [(0.5, 3, "additive"), (2.0, 1, None), (1.0, 4, "bool")])
def test_softcap_matches_naive_and_matters(softcap, Tq, mask_kind):
    """Logit soft-capping (Gemma 2): cap(s) = softcap * tanh(s / softcap) on the scaled scores, before
    the mask, in the core and in the decode entry; the scores are large enough that the cap changes
    the output, so dropping it fails."""
    g = _gen(int(softcap * 10) + Tq)
    codec = make_codec("turboquant-mse", 4, D, num_heads=2)
    k, v = _kv(2, 2, 10, g)
    ks, vs = codec.encode(k), codec.encode_values(v)
    wk, wv = _kv(2, 2, 3, g)
    q = 3 * torch.randn(2, 4, Tq, D, generator=g)
    mask = None
    if mask_kind == "bool":
        mask = torch.rand(2, 1, Tq, 13, generator=g) > 0.3
        mask[..., -1] = True
    elif mask_kind == "additive":
        mask = torch.randn(2, 4, 1, 13, generator=g)
    got = attend(q, codec, ks, vs, window_k=wk, window_v=wv, mask=mask, causal=True, scale=0.5, softcap=softcap)
    parts = [(codec.decode(ks), codec.decode_values(vs), None), (wk, wv, None)]
    ref = naive(q, parts, mask, True, scale=0.5, softcap=softcap)
    tol = atol(q, parts, mask, scale=0.5, softcap=softcap, n=2 * D + 4)  # codec.score rotates the query
    torch.testing.assert_close(got.double(), ref, rtol=0, atol=tol)
    uncapped = naive(q, parts, mask, True, scale=0.5)
    assert (uncapped - ref).abs().max() > 0.1  # the cap matters here
    if Tq == 1:  # the decode entry applies it too, on the PyTorch path
        dec = decode_attention(q, ks, vs, codec, wk, wv, scale=0.5, backend="auto", softcap=softcap)
        torch.testing.assert_close(dec.double(), ref, rtol=0, atol=tol)


def test_softcap_keeps_decode_off_the_fused_kernels():
    """The fused decode kernels do not cap logits: with a softcap 'auto' takes the reference, saying
    why, even on CUDA (asked for a device this machine may lack), and a named kernel refuses."""
    codec = make_codec("octopus", 3, D, num_heads=2)
    q = torch.randn(1, 4, 1, D)
    d = decide_attention(q, codec, 2, "auto", device="cuda", softcap=50.0)
    assert d.path == "torch" and all("soft-capping" in d.reason(p) for p in ("lut", "triton"))
    with pytest.raises(RuntimeError, match="backend='triton' cannot run this call: .*soft-capping"):
        decide_attention(q, codec, 2, "triton", device="cuda", softcap=50.0)


def test_softcap_keeps_per_sequence_lengths():
    """A ragged batch under soft-capping: tokens past a sequence's length (right-padded storage)
    stay unattended. Capping before masking would turn their -inf scores into a finite -softcap
    and give them weight, so each sequence must match the reference of its own tokens."""
    g = _gen(7)
    codec = make_codec("turboquant-mse", 4, D, num_heads=2)
    k, v = _kv(2, 2, 16, g)
    ks, vs = codec.encode(k), codec.encode_values(v)
    wk, wv = _kv(2, 2, 6, g)
    q = 3 * torch.randn(2, 4, 1, D, generator=g)
    lengths, window_lengths = torch.tensor([16, 8]), torch.tensor([6, 3])
    got = attend(q, codec, ks, vs, window_k=wk, window_v=wv, lengths=lengths, window_lengths=window_lengths,
                 scale=0.5, softcap=2.0)
    parts = [(codec.decode(ks), codec.decode_values(vs), lengths), (wk, wv, window_lengths)]
    ref = naive(q, parts, scale=0.5, softcap=2.0)
    tol = atol(q, parts, scale=0.5, softcap=2.0, n=2 * D + 4)  # codec.score rotates the query
    torch.testing.assert_close(got.double(), ref, rtol=0, atol=tol)
    dec = decode_attention(q, ks, vs, codec, wk, wv, lengths=lengths, window_lengths=window_lengths, scale=0.5,
                           backend="torch", softcap=2.0)
    torch.testing.assert_close(dec.double(), ref, rtol=0, atol=tol)
