"""adapters/cache/kv_cache.py: encode once, window semantics, byte formulas, protected layers, and the
read paths (native = plain attention; score = reconstruct for codecs without an estimator)."""
from __future__ import annotations

import json
import math

import pytest
import torch
from helpers.decode_checks import out_rtol
from helpers.tolerances import attention_atol, gamma

from adapters.cache.config import CacheConfig

from adapters.cache.kv_cache import CompressedKVCache

from adapters.cache.layer_kv import LayerKV
from kernels import codec_class, list_codecs, make_codec
from kernels.backend import Decision

B, HKV, HQ, D = 1, 2, 4, 64
CODECS = [c for c in list_codecs() if c != "none" and codec_class(c).head_dim_unsupported(D) is None]


def _plain() -> str:
    """A codec that encodes token by token (no token groups)."""
    return next(c for c in CODECS if make_codec(c, _bits(c), D).token_block == 1)


def _bits(codec: str) -> int:
    supported = list_codecs()[codec]
    return 3 if 3 in supported else supported[0]


def _kv(T: int, seed: int = 0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, HKV, T, D, generator=g).to(dtype), torch.randn(B, HKV, T, D, generator=g).to(dtype))


def _layer(codec: str | None, **cfg) -> LayerKV:
    config = CacheConfig(codec=codec or "none", bits=_bits(codec) if codec else 16, **cfg)
    c = None if codec is None else make_codec(codec, config.bits, D, num_heads=HKV, layer=0)
    return LayerKV(c, config)


def _atol(q, k, v, n=D, scale=None):
    """attention_atol of a float32 attention over keys k, values v against the float64 _reference: ``n``
    rounding steps a score takes (D for a dot product; a codec's score also rotates the query, 2 D + 8)."""
    return attention_atol(float(q.norm(dim=-1).max()), float(k.float().norm(dim=-1).max()), float(v.abs().max()),
                          scale or 1 / math.sqrt(q.shape[-1]), n, k.shape[-2])


def _reference(q, k, v, scale=None, causal_from=None):
    """Plain softmax attention with GQA (query head h reads KV head h // G), float64."""
    G = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(G, dim=1).double()
    v = v.repeat_interleave(G, dim=1).double()
    s = q.double() @ k.transpose(-1, -2) * (scale or 1 / math.sqrt(q.shape[-1]))
    if causal_from is not None:
        T, Tq = k.shape[-2], q.shape[-2]
        s = s.masked_fill(torch.arange(T) > torch.arange(T - Tq, T)[:, None], float("-inf"))
    return torch.softmax(s, -1) @ v


@pytest.mark.parametrize("codec", CODECS)
def test_encode_once_in_order(codec):
    layer = _layer(codec, residual=8)
    seen = []
    enc = layer.codec.encode

    def spy(x, defer=None):
        seen.append(x.clone())
        return enc(x, defer)

    layer.codec.encode = spy
    k, v = _kv(150)
    start = 0
    for n in (37, 1, 1, 20, 5, 1, 40, 45):
        layer.append(k[..., start:start + n, :], v[..., start:start + n, :])
        start += n
        layer.reconstruct()  # reads never encode
    encoded = torch.cat(seen, dim=-2)
    assert encoded.shape[-2] == layer.committed  # every committed token encoded exactly once ...
    assert torch.equal(encoded, k[..., : layer.committed, :])  # ... in token order
    assert torch.equal(layer.window_k, k[..., layer.committed:, :])


@pytest.mark.parametrize("codec", CODECS)
def test_window_token_semantics(codec):
    layer = _layer(codec, residual=16)
    block = layer.codec.token_block
    k, v = _kv(200)
    for t in range(0, 200, 7):
        layer.append(k[..., t:t + 7, :], v[..., t:t + 7, :])
        T = min(t + 7, 200)
        W = layer.window_k.shape[-2]
        assert layer.length == T
        assert layer.committed % block == 0
        assert 16 <= W < 16 + block or (T < 16 + block and layer.committed == 0)


def test_window_append_semantics():
    layer = _layer(_plain(), residual=2, residual_unit="append")
    k, v = _kv(60)
    sizes, start = [10, 5, 7, 20, 3], 0
    for n in sizes:
        layer.append(k[..., start:start + n, :], v[..., start:start + n, :])
        start += n
    assert layer.window_k.shape[-2] == sum(sizes[-2:])  # exactly the last two appends stay native
    assert layer.committed == sum(sizes[:-2])


@pytest.mark.parametrize("codec", CODECS)
def test_bytes_match_formula(codec):
    layer = _layer(codec, residual=8)
    k, v = _kv(101)
    layer.append(k[..., :90, :], v[..., :90, :])
    layer.append(k[..., 90:, :], v[..., 90:, :])
    n = layer.committed
    b = layer.nbytes()
    assert b["compressed_keys"] == layer.codec.expected_nbytes((B, HKV, n, D))
    assert b["compressed_values"] == layer.codec.value_quantizer.expected_nbytes((B, HKV, n, D))
    assert b["window"] == 2 * B * HKV * (101 - n) * D * 4
    assert b["uncompressed"] == 2 * B * HKV * 101 * D * 4
    cache = CompressedKVCache(CacheConfig(codec=codec, bits=_bits(codec), residual=8), 3, HKV, D)
    for layer in cache.layers:
        layer.append(k, v)
    s = cache.stats()
    n = cache[0].committed
    # one correctly rounded division of the same rational
    assert s["bits_per_coord"] == 8 * 3 * layer.codec.expected_nbytes((B, HKV, n, D)) / (3 * n * HKV * D)
    assert s["cache_bytes"] == sum(sum(v for key, v in l.nbytes().items()
                                       if key in ("compressed", "window", "native_layers")) for l in cache.layers)
    assert s["cache_bytes"] < s["uncompressed_bytes"]
    cache.assert_compressed()


def test_protected_layers_native():
    codec = CODECS[0]
    k, v = _kv(80)
    for protect, native in (("boundary-1", {0, 3}), ([1, -1], {1, 3}), ("none", set())):
        cache = CompressedKVCache(CacheConfig(codec=codec, bits=_bits(codec), residual=4, protect=protect), 4, HKV, D)
        for layer in cache.layers:
            layer.append(k, v)
        for i, layer in enumerate(cache.layers):
            if i in native:
                assert layer.codec is None and layer.committed == 0 and torch.equal(layer.window_k, k)
            else:  # all but the 4-token window, in whole token blocks
                assert layer.codec is not None
                assert layer.committed == (80 - 4) // layer.codec.token_block * layer.codec.token_block
    with pytest.raises(ValueError, match="protect"):
        CacheConfig(protect="first").protected_layers(4)


def test_native_is_plain_attention():
    layer = _layer(None)
    k, v = _kv(50)
    layer.append(k[..., :30, :], v[..., :30, :])
    layer.append(k[..., 30:45, :], v[..., 30:45, :])
    q = torch.randn(B, HQ, 5, D, generator=torch.Generator().manual_seed(1))
    out = layer.attend(q, k_new=k[..., 45:, :], v_new=v[..., 45:, :], causal=True)
    ref = _reference(q, k, v, causal_from=45)
    torch.testing.assert_close(out.double(), ref, rtol=0, atol=_atol(q, k, v))  # float32 against float64
    assert layer.length == 45  # k_new is attended, not stored
    r_k, r_v = layer.reconstruct()
    assert torch.equal(r_k, k[..., :45, :]) and torch.equal(r_v, v[..., :45, :])


def test_causal_flag_equals_explicit_mask():
    layer = _layer(_plain(), residual=4)
    k, v = _kv(60)
    layer.append(k[..., :40, :], v[..., :40, :])
    q = torch.randn(B, HQ, 20, D, generator=torch.Generator().manual_seed(6))
    T = 60
    mask = torch.arange(T) <= torch.arange(40, 60)[:, None]
    a = layer.attend(q, k_new=k[..., 40:, :], v_new=v[..., 40:, :], causal=True)
    b = layer.attend(q, k_new=k[..., 40:, :], v_new=v[..., 40:, :], mask=mask)
    torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("codec", [c for c in CODECS if not make_codec(c, _bits(c), D).has_score_estimator])
def test_attend_equals_reconstruct(codec):
    """For codecs without a score estimator the score path is <q, decode(k)>: attend == attention over reconstruct()."""
    k, v = _kv(120)
    q = torch.randn(B, HQ, 3, D, generator=torch.Generator().manual_seed(2))
    outs = {}
    for attend, memo in (("score", True), ("score", False), ("reconstruct", False)):
        layer = _layer(codec, residual=8, attend=attend, memo_decoded=memo)
        layer.append(k, v)
        outs[(attend, memo)] = layer.attend(q)
        rk, rv = layer.reconstruct()
    ref = _reference(q, rk, rv)
    for out in outs.values():  # float32 against float64; the score path rotates the query first
        torch.testing.assert_close(out.double(), ref, rtol=0, atol=_atol(q, rk, rv, n=2 * D + 8))


@pytest.mark.parametrize("codec", [c for c in CODECS if make_codec(c, _bits(c), D).has_score_estimator])
def test_estimator_codecs_use_their_score(codec):
    layer = _layer(codec, residual=8)
    k, v = _kv(120)
    layer.append(k, v)
    q = torch.randn(B, HQ, 2, D, generator=torch.Generator().manual_seed(3))
    out = layer.attend(q)
    qg = q.reshape(B, HKV, -1, D)
    s = torch.cat([layer.codec.score(qg, layer.compressed_keys()), qg @ layer.window_k.transpose(-1, -2)], -1)
    p = torch.softmax(s.reshape(B, HQ, 2, -1) / math.sqrt(D), -1).reshape(B, HKV, -1, s.shape[-1])
    vals = torch.cat([layer.codec.decode_values(layer.compressed_values()).float(), layer.window_v], -2)
    # the same scores, scaled by a product with 1 / sqrt(D) there and a division here: one rounding of each
    # score apart (n = 0 rounding steps of the dot products), then each side's softmax and weighted sum
    keys = torch.cat([layer.codec.decode(layer.compressed_keys()).float(), layer.window_k], -2)
    tol = 2 * _atol(q, keys, vals, n=0)
    torch.testing.assert_close(out, (p @ vals).reshape(B, HQ, 2, D), rtol=0, atol=tol)


def test_fork_is_independent():
    """A fork shares the encoded rows (nothing is re-encoded) and each side's later commits are its
    own: both equal a layer that saw only their own appends (the store copies on write)."""
    k, v = _kv(40)

    def fed(*spans):
        layer = _layer(_plain(), residual=4)
        for a, b in spans:
            layer.append(k[..., a:b, :], v[..., a:b, :])
        return layer

    layer = fed((0, 30))
    other = layer.fork()
    seen = []
    encode = layer.codec.encode
    layer.codec.encode = lambda x, defer=None: seen.append(x.shape[-2]) or encode(x, defer)  # the codec is shared too
    other.append(k[..., 30:, :], v[..., 30:, :])
    layer.append(k[..., 30:35, :], v[..., 30:35, :])  # both commit after the fork point
    assert seen == [10, 5]  # only the new tokens were encoded
    assert layer.length == 35 and other.length == 40
    for got, want in ((layer, fed((0, 30), (30, 35))), (other, fed((0, 30), (30, 40)))):
        assert got.committed == want.committed
        for name, t in want.compressed_keys().tensors.items():
            assert torch.equal(got.compressed_keys().tensors[name], t)
        assert torch.equal(got.window_k, want.window_k)


def test_cache_config_json_round_trip():
    c = CacheConfig(codec="octopus", bits=2, residual=16, protect=[0, 5], value_bits=4, options={"split": [3, 1]})
    d = json.loads(json.dumps(c.to_json()))
    assert d["version"] >= 1
    assert CacheConfig.from_json(d) == c
    with pytest.raises(ValueError, match="unknown CacheConfig field"):
        CacheConfig.from_json({**d, "bitz": 3})
    assert c.label == "octopus@2" and CacheConfig().label == "none"


def test_assert_compressed_when_window_covers_everything():
    codec = CODECS[0]
    cache = CompressedKVCache(CacheConfig(codec=codec, bits=_bits(codec), residual=500), 2, HKV, D)
    k, v = _kv(40)
    for layer in cache.layers:
        layer.append(k, v)
    with pytest.raises(RuntimeError, match="committed no token"):
        cache.assert_compressed()


def test_decode_fast_path_matches_torch():
    """backend='triton' routes a single-token decode through kernels.attention.decode_attention
    (here Triton's interpreter, on CUDA the fused kernel); it must agree with the torch path."""
    pytest.importorskip("triton")
    attention = pytest.importorskip("kernels.attention")
    from kernels.triton import available

    codec = next((c for c in ("octopus", "turboquant-mse") if c in CODECS), None)
    if codec is None or not available(torch.device("cpu")) and not torch.cuda.is_available():
        pytest.skip("no fused codec, or no way to run Triton here")
    k, v = _kv(40)
    q = torch.randn(B, HQ, 1, D, generator=torch.Generator().manual_seed(4))
    outs = {}
    for backend in ("torch", "triton"):
        layer = LayerKV(make_codec(codec, 2, D, num_heads=HKV), CacheConfig(codec=codec, bits=2, residual=4,
                                                                             backend=backend))
        layer.append(k[..., :39, :], v[..., :39, :])
        if backend == "triton" and attention.fused_unsupported(q, layer.codec):
            pytest.skip(attention.fused_unsupported(q, layer.codec))
        outs[backend] = layer.attend(q, k_new=k[..., 39:, :], v_new=v[..., 39:, :])
    # first order, each term p_j v_j of the fused output takes five fp16 roundings (tests/helpers/decode_checks.py):
    # at most that fraction of sum_j p_j |v_j| <= max |v|
    torch.testing.assert_close(outs["triton"], outs["torch"], rtol=0, atol=out_rtol(torch.float32) * float(v.abs().max()))


def test_decode_fast_path_takes_masks_that_mask_nothing(monkeypatch):
    """transformers passes an all-True boolean mask on plain decode steps: that must not push the
    step off the fused path; a mask that hides a key must (the kernel has no general masks)."""
    import adapters.cache.layer_kv as kvc

    calls = []
    monkeypatch.setattr(kvc, "decode_attention", lambda *a, **kw: calls.append(kw) or "fused")
    monkeypatch.setattr(kvc, "decide_attention", lambda *a, **kw: Decision("triton"))  # any machine: the mask decides
    codec = "octopus"  # a codec the Triton kernel covers (the decision is made before the stubbed call)
    layer = LayerKV(make_codec(codec, _bits(codec), D, num_heads=HKV),
                    CacheConfig(codec=codec, bits=_bits(codec), residual=4, backend="triton"))
    k, v = _kv(40)
    layer.append(k, v)
    q = torch.randn(B, HQ, 1, D)
    keep = torch.ones(B, 1, 1, 40, dtype=torch.bool)
    assert layer.attend(q, mask=keep) == "fused" and len(calls) == 1
    assert layer.attend(q, mask=torch.zeros(B, 1, 1, 40)) == "fused"  # additive, all zero
    hide = keep.clone()
    hide[0, 0, 0, 3] = False
    out = layer.attend(q, mask=hide)
    assert isinstance(out, torch.Tensor) and len(calls) == 2
    keep[0, 0, 0, 5] = False  # the mask changed in place: its memo is stale and re-checked
    assert isinstance(layer.attend(q, mask=keep), torch.Tensor) and len(calls) == 2


@pytest.mark.parametrize("codec", CODECS)
def test_incremental_decode_memo_equals_full_decode(codec):
    """Reads between commits decode only the new tokens (cut from the merged state); the memo then
    equals decoding everything at once."""
    layer = _layer(codec, residual=8)
    k, v = _kv(170)
    q = torch.randn(B, HQ, 1, D, generator=torch.Generator().manual_seed(7))
    start = 0
    for n in (50, 3, 40, 1, 1, 35, 40):
        layer.append(k[..., start:start + n, :], v[..., start:start + n, :])
        start += n
        layer.decoded()
        layer.attend(q)
    dk, dv = layer.decoded()
    assert dk.shape[-2] == layer.committed
    # equal up to float rounding: a sketch codec's decode is a matrix product, and BLAS may block
    # a product of 50 rows differently from one of 170 (seen with torch 2.11's CPU BLAS): two orders of the
    # same m <= 8 D terms a coordinate, within 2 gamma(m) of their magnitudes' sum, which for a sketch
    # (sqrt(pi/2) / m times ||k|| sum_j |S_ji|, S's columns of norm ~sqrt(m)) stays under 2 ||k||
    bound = 2 * gamma(8 * D) * 2 * k[..., : dk.shape[-2], :].norm(dim=-1, keepdim=True)
    assert bool(((dk - layer.codec.decode(layer.compressed_keys())).abs() <= bound).all())
    assert torch.equal(dv, layer.codec.decode_values(layer.compressed_values()))


def test_repeat_batch_makes_copies_of_each_sequence():
    """A batch-1 cache repeated to 3 sequences: each reads and counts as the original (throughput scripts)."""
    codec = "kivi" if "kivi" in CODECS else CODECS[0]
    cache = CompressedKVCache(CacheConfig(codec=codec, bits=_bits(codec), residual=8), 2, HKV, D)
    k, v = _kv(100)
    for layer in cache.layers:
        layer.append(k, v)
    q = torch.randn(1, HQ, 1, D, generator=torch.Generator().manual_seed(5))
    want, stats = cache[0].attend(q), cache.stats()
    cache.repeat_batch(3)
    assert cache.batch_size() == 3 and all(cache.stats(b) == stats for b in range(3))
    # the same attention over a batch of 3: the batched product may block its sums otherwise (a 64-term dot,
    # the softmax's and the weighted sum's 100 terms): twice attention_atol's bound on one evaluation
    rk, rv = cache[0].reconstruct()
    tol = 2 * attention_atol(float(q.norm(dim=-1).max()), float(rk.norm(dim=-1).max()), float(rv.abs().max()),
                             1 / math.sqrt(D), D, 100)
    torch.testing.assert_close(cache[0].attend(q.expand(3, -1, -1, -1)), want.expand(3, -1, -1, -1), rtol=0, atol=tol)
