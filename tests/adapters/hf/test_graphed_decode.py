"""Graphed decode steps (adapters/hf/graphed_decode.py, adapters/cache/static_kv.py): greedy through the static
layout generates what the eager steps generate, hands back the cache the eager steps leave, refuses
what it cannot take with the reason; on CUDA a replayed step equals the same step run eagerly, byte for
byte, and asks the host for nothing."""
from __future__ import annotations

import warnings

import pytest
import torch
from helpers.decode_checks import score_atol

from adapters.hf.graphed_decode import GraphedDecode, why_not
from adapters.hf.attach import attach
from adapters.cache.config import CacheConfig
from kernels import list_codecs
from helpers.tiny_lm import tiny_causal_lm

CODECS = [None, CacheConfig(codec="octopus", bits=3, residual=8), CacheConfig(codec="turboquant-mse", bits=2, residual=8),
          CacheConfig(codec="qjl", bits=3, residual=0), CacheConfig(codec="polarquant", bits=3, residual=8),
          CacheConfig(codec="quarot", bits=4, residual=8, attend="reconstruct"),
          # blocks of 4 tokens (KIVI's group, its token block): 16 steps commit 4 blocks through the block window
          CacheConfig(codec="kivi", bits=2, residual=8, options={"group_size": 4})]


def _prompts(batch: int, n: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (batch, n), generator=g).tolist()


def _lively(lm, scale: float = 20.0):
    """The tiny model with its matrices scaled up: its random init greedily repeats one token, which
    would let two decodes agree on tokens without agreeing on much else."""
    with torch.no_grad():
        for p in lm.model.parameters():
            if p.dim() == 2:
                p.mul_(scale)
    return lm


def _greedy(lm, prompts, cfg, mode: str, new: int = 16, **kw):
    lm.graphs = mode
    return lm.greedy(prompts, new, cfg, force="self", **kw)


def _layer_state(cache) -> list[tuple]:
    kv = getattr(cache, "kv", None)
    if kv is None:  # a DynamicCache (the native baseline, graphs off)
        return [(layer.keys.shape[-2],) for layer in cache.layers]
    return [(layer.columns, list(layer.seq_committed), list(layer.seq_window), list(layer._seen),
             list(layer._append_sizes), None if layer.store_k is None else list(layer.store_k.tokens))
            for layer in kv.layers]


@pytest.mark.parametrize("cfg", CODECS, ids=lambda c: "native" if c is None else c.label)
@pytest.mark.parametrize("batch", [1, 2])
def test_static_steps_generate_what_eager_steps_generate(cfg, batch):
    lm = _lively(tiny_causal_lm())
    prompts = _prompts(batch, 40)
    eager, static = _greedy(lm, prompts, cfg, "off"), _greedy(lm, prompts, cfg, "static")
    for a, b in zip(eager, static):
        assert a["tokens"] == b["tokens"] and len(a["tokens"]) == 16
        # float rounding only (the static read is longer and masked): another order and length of each attention
        # row's float32 sums (U32 of their terms each) through the tiny model to its scaled-up logits (O(10),
        # _lively): ~10^3 U32 of them, far below a logit's spread
        torch.testing.assert_close(b["logits"], a["logits"], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(b["forced_logits"], a["forced_logits"], rtol=1e-4, atol=1e-4)
    if cfg is not None:  # the cache handed back is the one the eager steps leave: counts, bytes, window
        ca, cb = eager[0]["cache"], static[0]["cache"]
        assert _layer_state(ca) == _layer_state(cb)
        assert ca.stats() == cb.stats()
        for la, lb in zip(ca.kv.layers, cb.kv.layers):
            torch.testing.assert_close(lb.window_k, la.window_k, rtol=1e-4, atol=1e-4)  # keys of those forwards
            if la.codec is not None and la.store_k is not None:
                assert la.store_k.view().shape == lb.store_k.view().shape


@pytest.mark.parametrize("cfg", [None, CODECS[1], CODECS[3], CODECS[-1]],
                         ids=["native", "octopus@3", "qjl@3", "kivi@2"])
def test_kept_buffers_serve_the_next_rollouts_as_their_own_would(cfg, monkeypatch):
    """Rollouts of one configuration and batch shape share one set of static buffers (and on CUDA the step
    captured over them): each copies its cache in and takes its steps back, so it generates what it
    generates eagerly; rollouts of other lengths in the same capacity bucket share them too (KIVI's 41-token
    prompt leaves 9 tokens in its window, the 40-token ones 8: the window's fill is each rollout's own)."""
    import adapters.hf.graphed_decode as gd

    made = []
    real = gd._Graph.__init__

    def spy(self, model, cache, capacity):
        made.append(capacity)
        real(self, model, cache, capacity)

    monkeypatch.setattr(gd._Graph, "__init__", spy)
    lm = _lively(tiny_causal_lm())
    prompts = [_prompts(1, 40, seed=s) for s in range(3)] + [_prompts(1, 41, seed=3)]  # one bucket
    eager = [_greedy(lm, p, cfg, "off", new=10) for p in prompts]
    static = [_greedy(lm, p, cfg, "static", new=10) for p in prompts]
    assert len(made) == 1 and made[0] == gd.bucket(made[0])  # built once, at a bucket's capacity
    for a, b in zip(eager, static):
        assert a[0]["tokens"] == b[0]["tokens"]
        # the rounding of test_static_steps_generate_what_eager_steps_generate
        torch.testing.assert_close(b[0]["logits"], a[0]["logits"], rtol=1e-4, atol=1e-4)
        if cfg is not None:
            assert _layer_state(a[0]["cache"]) == _layer_state(b[0]["cache"])
            assert a[0]["cache"].stats() == b[0]["cache"].stats()


def test_buckets_round_up_to_an_eighth_of_a_power_of_two():
    assert [gd_bucket(n) for n in (1, 7, 8, 9, 16, 17, 1000, 1024, 1025, 32_768, 32_769)] == \
        [1, 7, 8, 9, 16, 18, 1024, 1024, 1152, 32_768, 36_864]


def gd_bucket(n: int) -> int:
    from adapters.hf.graphed_decode import bucket

    return bucket(n)


# polarquant, kivi: the decoded memo is handed back too; kivi: a window of blocks
@pytest.mark.parametrize("cfg", [CODECS[1], CODECS[4], CODECS[-1]], ids=["octopus", "polarquant", "kivi"])
def test_the_cache_goes_on_eagerly_after_the_static_steps(cfg):
    lm = _lively(tiny_causal_lm())
    prompt, tail = _prompts(1, 40)[0], _prompts(1, 12, seed=1)[0]
    outs = []
    for mode in ("off", "static"):
        lm.graphs = mode
        cache = lm.greedy(prompt, 10, cfg)["cache"]
        feed = lm._feed(1)
        feed.advance(cache.kv[0].columns)  # the columns fed so far
        with attach(lm.model):
            outs.append(lm._forward(feed, [tail], cache))
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-4, atol=1e-4)  # the rounding of the test above


def test_a_short_prompt_is_graphed_once_its_window_fills():
    lm = tiny_causal_lm()
    cfg = CacheConfig(codec="octopus", bits=3, residual=8)
    steps = []
    real = GraphedDecode.__init__

    def spy(self, model, cache, ids, n, capture=True, pool=None):
        steps.append((cache.kv[0].columns, n))
        real(self, model, cache, ids, n, capture, pool)

    GraphedDecode.__init__ = spy
    try:
        a, b = _greedy(lm, [3, 5, 7], cfg, "off", new=20), _greedy(lm, [3, 5, 7], cfg, "static", new=20)
    finally:
        GraphedDecode.__init__ = real
    assert a["tokens"] == b["tokens"]
    # 3 prompt tokens: the window (8) fills after 5 eager steps and the 6th commits the first token
    # (a static layer needs a store to write to), so the other 13 of the 19 steps fed are static
    assert steps == [(9, 13)]


def test_a_sequence_that_ends_hands_the_batch_back_to_eager_steps():
    lm = _lively(tiny_causal_lm())
    cfg = CacheConfig(codec="turboquant-mse", bits=3, residual=8)
    prompts = _prompts(2, 30)
    free = [r["tokens"] for r in _greedy(lm, prompts, cfg, "off", new=12)]
    # call EOS a token that ends sequence 0 after a few static steps and sequence 1 later, or never
    end = next(i for i in range(4, 10) if free[0][i] not in free[0][:i] and free[0][i] not in free[1][:i + 2])
    lm.eos_ids = lambda: {free[0][end]}
    a, b = _greedy(lm, prompts, cfg, "off", new=12), _greedy(lm, prompts, cfg, "static", new=12)
    assert len(a[0]["tokens"]) == end + 1 and len(a[1]["tokens"]) > end + 1
    for x, y in zip(a, b):
        assert x["tokens"] == y["tokens"]
        torch.testing.assert_close(y["logits"], x["logits"], rtol=1e-4, atol=1e-4)  # as in the first test
    assert _layer_state(a[0]["cache"]) == _layer_state(b[0]["cache"])
    assert all(a[0]["cache"].kv.stats(s) == b[0]["cache"].kv.stats(s) for s in (0, 1))


@pytest.mark.parametrize("cfg, ids, why", [
    (CacheConfig(codec="kivi", bits=2, residual=8), [1] * 39, "nothing committed yet"),  # its first block at 40
    (CacheConfig(codec="octopus", bits=3, residual=8, residual_unit="append"), [1] * 40, "commits whole appends"),
    (CacheConfig(codec="octopus", bits=3, residual=8), [1] * 5, "the native window holds 5 of its 8 tokens"),
    (CacheConfig(codec="octopus", bits=3, residual=8), [[1] * 40, [2] * 30], "differ in length"),
])
def test_what_cannot_be_graphed_says_why(cfg, ids, why):
    lm = tiny_causal_lm()
    batch = ids if isinstance(ids[0], list) else [ids]
    with attach(lm.model) as new_cache:
        cache = new_cache(cfg)
        feed = lm._feed(len(batch))
        lm._forward(feed, batch, cache)
        assert why in why_not(lm.model, cache, 10, capture=False)
        assert "CUDA graphs need a CUDA device" in why_not(lm.model, cache, 10, capture=True)
    with pytest.raises(ValueError, match="graphed decode"):
        GraphedDecode(lm.model, cache, [1] * len(batch), 10, capture=False)


@pytest.mark.parametrize("codec", [c for c in list_codecs() if c != "none"])
def test_every_codec_takes_static_steps_but_transformers_own_quantized_cache(codec):
    """Every codec's layers take the static layout once committed (KIVI's blocks, the engines' presets with
    their per-token kernel on CUDA), and static steps generate what eager steps generate; transformers' own
    quantized caches (hf-quanto, hf-hqq) live in transformers' layer objects and decode eagerly, saying so.
    Head dim 128: a multiple of every engine's group (MLX's 128, ExLlamaV2's 64)."""
    lm = tiny_causal_lm(head_dim=128)
    bits = list_codecs()[codec]
    cfg = CacheConfig(codec=codec, bits=3 if 3 in bits else min(bits), residual=8)
    with torch.no_grad(), attach(lm.model) as new_cache:
        cache = _steady_cache(lm, cfg, new_cache)
        why = why_not(lm.model, cache, 10, capture=False)
    if codec.startswith("hf-"):
        assert "transformers' own quantized cache layer (hf-quanto, hf-hqq" in why
    else:
        assert why is None
        prompt = _prompts(1, 40)[0]
        assert _greedy(lm, prompt, cfg, "off", new=6)["tokens"] == _greedy(lm, prompt, cfg, "static", new=6)["tokens"]


def test_the_graph_modes_are_checked():
    lm = tiny_causal_lm()
    # model.json says how the steps ran (on this CPU 'auto' is eager)
    assert lm.describe()["decode_steps"] == "eager"
    lm.graphs = "static"
    assert lm.describe()["decode_steps"] == "the graphs' static layout, run eagerly"
    lm.graphs = "sometimes"
    with pytest.raises(ValueError, match="Unknown graphs 'sometimes'. Available: auto, static, off"):
        lm.greedy([1, 2, 3], 4, None)


# --- CUDA: captured steps ---------------------------------------------------------------------------
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")


def _cuda_lm():
    lm = tiny_causal_lm(head_dim=128, hidden=256, heads=8, kv_heads=2)
    lm.model.to("cuda", torch.bfloat16)
    return lm


@cuda
@pytest.mark.parametrize("cfg", [None, CacheConfig(codec="octopus", bits=3), CacheConfig(codec="turboquant-mse", bits=3),
                                 CacheConfig(codec="octopus", bits=3, backend="triton"),
                                 CacheConfig(codec="octopus-qjl", bits=3), CacheConfig(codec="kivi", bits=2)],
                         ids=["native", "octopus-lut", "tq-mse-lut", "octopus-triton", "octopus-qjl-lut", "kivi"])
def test_replayed_steps_equal_the_same_steps_run_eagerly(cfg):
    lm = _cuda_lm()
    prompts = _prompts(2, 300)
    static, graphed, eager = (_greedy(lm, prompts, cfg, m, new=24) for m in ("static", "auto", "off"))
    for s, g, e in zip(static, graphed, eager):
        assert g["tokens"] == s["tokens"]
        assert torch.equal(g["logits"], s["logits"])  # the same kernels on the same inputs: the same bytes
        # against the eager steps: bf16 rounding of a longer, masked read (tokens may part where two
        # logits tie to bf16 precision, so only the first step, before any divergence, is compared): bf16
        # operands (UBF16 = 3.9e-3 each) through the model's 2 layers to logits of O(1-10), ~10 UBF16 of them
        torch.testing.assert_close(g["logits"][:1], e["logits"][:1], rtol=0.05, atol=0.05)
    assert graphed[0]["cache"].stats() == static[0]["cache"].stats()


@cuda
@pytest.mark.parametrize("cfg", [CacheConfig(), CacheConfig(codec="octopus", bits=3),
                                 CacheConfig(codec="kivi", bits=2, options={"group_size": 4})],
                         ids=["native", "octopus", "kivi"])
def test_a_replayed_step_never_syncs(cfg):
    lm = _cuda_lm()
    with torch.no_grad(), attach(lm.model) as new_cache:
        cache = new_cache(cfg)
        lm._forward(lm._feed(1), _prompts(1, 300), cache)
        graph = GraphedDecode(lm.model, cache, [5], 12)
        graph.step(), graph.step()  # the warm-up and the capture
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            for _ in range(8):
                graph.step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert graph.close() == 10
        assert cache.kv[0].columns == 310


@cuda
@pytest.mark.parametrize("codec", [c for c in list_codecs() if c != "none"])
def test_every_codec_is_captured_or_left_eager(codec, monkeypatch):
    """No codec's step fails a capture (which would warn): a codec why_not lets in is captured and
    equals its static steps; one it keeps out equals the eager steps."""
    lm = _cuda_lm()
    cfg = CacheConfig(codec=codec, bits=3 if 3 in list_codecs()[codec] else min(list_codecs()[codec]))
    import adapters.hf.graphed_decode as gd

    monkeypatch.setattr(gd, "_WARNED", set())  # each test sees its own warnings
    captured = []
    real = GraphedDecode.close

    def spy(self):
        captured.append(self.g is not None and self.g.graph is not None)  # captured and replayed to the end
        return real(self)

    monkeypatch.setattr(GraphedDecode, "close", spy)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        graphed = _greedy(lm, _prompts(1, 300)[0], cfg, "auto", new=12)
    # transformers' own quantized cache (hf-*) holds its layers in transformers' layer objects, which a graph does
    # not take; every other codec (KIVI's blocks, the engines' presets) is captured
    graphed_here = not codec.startswith("hf-")
    assert captured == ([True] if graphed_here else [])
    same = _greedy(lm, _prompts(1, 300)[0], cfg, "static" if graphed_here else "off", new=12)
    assert graphed["tokens"] == same["tokens"] and torch.equal(graphed["logits"], same["logits"])


@cuda
def test_a_step_that_cannot_be_captured_runs_eagerly_with_a_warning(monkeypatch):
    import adapters.hf.graphed_decode as gd
    import adapters.cache.static_kv as static_kv

    monkeypatch.setattr(gd, "_WARNED", set())

    lm = _cuda_lm()
    cfg = CacheConfig(codec="turboquant-mse", bits=3)
    static = _greedy(lm, _prompts(1, 300)[0], cfg, "static", new=12)
    real = static_kv.StaticKV.step

    def with_a_host_copy(self, q, *a):  # a pageable host-to-device copy: refused while capturing
        return real(self, q + torch.tensor(0.0).to(q.device), *a)

    monkeypatch.setattr(static_kv.StaticKV, "step", with_a_host_copy)
    with pytest.warns(RuntimeWarning, match="could not be captured"):
        graphed = _greedy(lm, _prompts(1, 300)[0], cfg, "auto", new=12)
    assert graphed["tokens"] == static["tokens"] and torch.equal(graphed["logits"], static["logits"])


@pytest.mark.parametrize("codec", [c for c in list_codecs() if c != "none"])
def test_an_estimator_scores_what_its_decoded_keys_score(codec):
    """The static layout keeps an estimator codec's keys decoded (float32) and dots them: that must be
    the estimator's score, to float rounding, for every codec that has one."""
    from kernels import make_codec

    c = make_codec(codec, 3 if 3 in list_codecs()[codec] else min(list_codecs()[codec]), 128, num_heads=2, seed=3)
    if not c.has_score_estimator:
        pytest.skip(f"{codec} is read decoded (no estimator)")
    g = torch.Generator().manual_seed(0)
    k, q = torch.randn(1, 2, 64, 128, generator=g), torch.randn(1, 2, 4, 128, generator=g)
    state = c.encode(k)
    k_hat = c.decode(state).float()  # two float32 computations of <q, k_hat> (decode_checks.score_atol)
    assert bool(((q @ k_hat.transpose(-1, -2) - c.score(q, state).float()).abs() <= score_atol(q, k_hat, 2 * 128 + 16)).all())


def _steady_cache(lm, cfg, new_cache):
    cache = new_cache(cfg)
    lm._forward(lm._feed(1), _prompts(1, 40), cache)
    return cache


def test_a_failure_hands_every_layer_back(monkeypatch):
    """A layer that cannot be laid out, or a step that raises, leaves no layer in the static layout and
    counts no step that did not finish."""
    import adapters.cache.static_kv as static_kv

    lm = tiny_causal_lm(layers=3)
    cfg = CacheConfig(codec="octopus", bits=3, residual=8)
    with torch.no_grad(), attach(lm.model) as new_cache:
        cache = _steady_cache(lm, cfg, new_cache)
        built, real_init = [], static_kv.StaticKV.__init__

        def third_fails(self, *a, **k):
            if len(built) == 2:
                raise MemoryError("no room for layer 2")
            built.append(1)
            real_init(self, *a, **k)

        monkeypatch.setattr(static_kv.StaticKV, "__init__", third_fails)
        with pytest.raises(MemoryError):
            GraphedDecode(lm.model, cache, [5], 10, capture=False)
        assert all(layer.static is None for layer in cache.layers) and cache.kv[0].columns == 40
        monkeypatch.setattr(static_kv.StaticKV, "__init__", real_init)

        graph = GraphedDecode(lm.model, cache, [5], 10, capture=False)
        graph.step()
        monkeypatch.setattr(static_kv.StaticKV, "step", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom")))
        with pytest.raises(RuntimeError, match="boom"):
            graph.step()
        assert all(layer.static is None and layer.pending is None for layer in cache.layers)
        assert cache.kv[0].columns == 41  # the one step that finished


def test_a_model_on_several_devices_is_not_graphed(monkeypatch):
    lm = tiny_causal_lm()
    cfg = CacheConfig(codec="octopus", bits=3, residual=8)
    with torch.no_grad(), attach(lm.model) as new_cache:
        cache = _steady_cache(lm, cfg, new_cache)
        assert why_not(lm.model, cache, 10, capture=False) is None
        params = list(lm.model.parameters())
        monkeypatch.setattr(type(lm.model), "parameters",
                            lambda self, recurse=True: iter(params + [torch.empty(1, device="meta")]))
        assert "spread over several devices" in why_not(lm.model, cache, 10, capture=False)
