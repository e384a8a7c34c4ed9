"""What the engines do around their bytes, through the cache's read (adapters/cache/layer_kv.py and
kernels/attention.py): each behaviour a codec option defaulting to the engine's own, each shown to change the
attention output where it should and to match a float64 attention over what the engine attends.

- llama.cpp: the q8 query in the dot products with the cached keys (decode steps), the tokens in flight attended
  from the cache;
- mlx-lm: full precision until ``quantized_kv_start`` tokens, then everything quantized, later chunks as stored;
- ExLlamaV2: the chunk in flight attended in fp16 (the cache's default);
- (LMDeploy's half-precision arithmetic and llama.cpp's rotation change the stored codes themselves: see
  tests/kernels/engines/.)"""
from __future__ import annotations

import math

import torch
from helpers.tolerances import attention_atol

from adapters.cache.config import CacheConfig
from adapters.cache.layer_kv import LayerKV
from kernels import make_codec

B, HKV, HQ, D = 1, 2, 4, 128


def _layer(codec: str, bits: int, residual: int = 8, **options) -> LayerKV:
    config = CacheConfig(codec=codec, bits=bits, residual=residual, options=options)
    return LayerKV(make_codec(codec, bits, D, num_heads=HKV, **options), config)


def _kv(t: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, HKV, t, D, generator=g) * 2, torch.randn(B, HKV, t, D, generator=g)


def _attention64(parts, causal_new: int = 0):
    """float64 softmax attention over parts [(q [B, HQ, Tq, D], k [B, HKV, n, D], v)], each part's scores with its
    own query; the last ``causal_new`` keys are the queries' own positions (causal)."""
    scores, values = [], []
    for q, k, v in parts:
        g = q.shape[1] // k.shape[1]
        scores.append(q.double() @ k.double().repeat_interleave(g, 1).transpose(-1, -2) / math.sqrt(D))
        values.append(v.double().repeat_interleave(g, 1))
    s, v = torch.cat(scores, -1), torch.cat(values, -2)
    if causal_new:
        tq, t = s.shape[-2], s.shape[-1]
        s = s.masked_fill(torch.arange(t) > torch.arange(t - tq, t)[:, None], float("-inf"))
    return torch.softmax(s, -1) @ v


def _atol(q, k, v, n):
    """attention_atol for ``n`` rounding steps a score takes (a decode and a dot product: a few D)."""
    return attention_atol(float(q.norm(dim=-1).max()), float(k.norm(dim=-1).max()), float(v.abs().max()),
                          1 / math.sqrt(D), n, k.shape[-2])


def test_llamacpp_dots_the_cached_keys_with_a_q8_query_on_decode_steps():
    k, v = _kv(40, seed=0)
    q = torch.randn(B, HQ, 1, D, generator=torch.Generator().manual_seed(1))
    outs, layers = {}, {}
    for mode in ("never", "decode"):
        layers[mode] = layer = _layer("llamacpp-q4_0", 4, quantize_query=mode, new_tokens="native")
        layer.append(k, v)
        outs[mode] = layer.attend(q)
    assert not torch.equal(outs["decode"], outs["never"])
    layer = layers["decode"]
    c = layer.codec
    n = layer.committed
    kc, vc = c.decode(c.encode(k[..., :n, :])), c.decode_values(c.encode_values(v[..., :n, :]))
    q8 = c.prepare_query(q)  # tests/kernels/engines/test_llamacpp.py checks it against numpy
    want = _attention64([(q8, kc, vc), (q, k[..., n:, :], v[..., n:, :])])  # the window native, the query as given
    torch.testing.assert_close(outs["decode"].double(), want, rtol=0, atol=_atol(q, k, v, 4 * D))


def test_tokens_in_flight_are_attended_as_the_engine_stores_them():
    k, v = _kv(48, seed=2)
    kn, vn = _kv(5, seed=3)
    q = torch.randn(B, HQ, 5, D, generator=torch.Generator().manual_seed(4))
    outs = {}
    for mode in ("native", "stored"):  # the stored one's layer read below
        layer = _layer("llamacpp-q8_0", 8, new_tokens=mode)
        layer.append(k, v)
        outs[mode] = layer.attend(q, k_new=kn, v_new=vn, causal=True)
    assert not torch.equal(outs["stored"], outs["native"])
    c, n = layer.codec, layer.committed
    rt = lambda x, values=False: (c.decode_values(c.encode_values(x)) if values else c.decode(c.encode(x)))  # noqa: E731
    parts = [(q, rt(k[..., :n, :]), rt(v[..., :n, :], True)), (q, k[..., n:, :], v[..., n:, :])]
    want = _attention64(parts + [(q, rt(kn), rt(vn, True))], causal_new=5)
    torch.testing.assert_close(outs["stored"].double(), want, rtol=0, atol=_atol(q, k, v, 4 * D))
    want_native = _attention64(parts + [(q, kn, vn)], causal_new=5)
    torch.testing.assert_close(outs["native"].double(), want_native, rtol=0, atol=_atol(q, k, v, 4 * D))


def test_exllamav2_attends_the_chunk_in_flight_in_full_precision():
    k, v = _kv(48, seed=5)
    kn, vn = _kv(4, seed=6)
    q = torch.randn(B, HQ, 4, D, generator=torch.Generator().manual_seed(7))
    layer = _layer("exl2-q4", 4)
    layer.append(k, v)
    out = layer.attend(q, k_new=kn, v_new=vn, causal=True)
    c, n = layer.codec, layer.committed
    want = _attention64([(q, c.decode(c.encode(k[..., :n, :])), c.decode_values(c.encode_values(v[..., :n, :]))),
                         (q, k[..., n:, :], v[..., n:, :]), (q, kn, vn)], causal_new=4)
    torch.testing.assert_close(out.double(), want, rtol=0, atol=_atol(q, k, v, 4 * D))


def test_mlx_keeps_full_precision_until_quantized_kv_start():
    k, v = _kv(60, seed=8)
    layer = _layer("mlx-g64", 4, residual=0, quantized_kv_start=50)
    layer.append(k[..., :30, :], v[..., :30, :])
    assert layer.committed == 0  # a plain KVCache below 50 tokens
    layer.append(k[..., 30:55, :], v[..., 30:55, :])
    assert layer.committed == 55  # converted after the call that reached 50: every token quantized
    layer.append(k[..., 55:, :], v[..., 55:, :])
    assert layer.committed == 60  # and each later token as it comes (no window with residual 0)


def test_mlx_attends_the_first_chunk_natively_and_later_ones_as_stored():
    k, v = _kv(40, seed=9)
    q = torch.randn(B, HQ, 20, D, generator=torch.Generator().manual_seed(10))
    layer = _layer("mlx-g64", 4, residual=0)  # quantized_kv_start 0: generate_step's default
    first = layer.attend(q, k_new=k[..., :20, :], v_new=v[..., :20, :], causal=True)
    torch.testing.assert_close(first.double(), _attention64([(q, k[..., :20, :], v[..., :20, :])], causal_new=20),
                               rtol=0, atol=_atol(q, k, v, D))
    layer.append(k[..., :20, :], v[..., :20, :])
    second = layer.attend(q, k_new=k[..., 20:, :], v_new=v[..., 20:, :], causal=True)
    c = layer.codec
    rt = lambda x: c.decode(c.encode(x))  # noqa: E731
    rtv = lambda x: c.decode_values(c.encode_values(x))  # noqa: E731
    want = _attention64([(q, rt(k[..., :20, :]), rtv(v[..., :20, :])), (q, rt(k[..., 20:, :]), rtv(v[..., 20:, :]))],
                        causal_new=20)
    torch.testing.assert_close(second.double(), want, rtol=0, atol=_atol(q, k, v, 4 * D))
