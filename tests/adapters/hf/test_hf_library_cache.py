"""Codecs hf-quanto and hf-hqq store through transformers' own quantized cache layers
(adapters/hf/library_layer.py): the same tokens and scores as plain transformers'
``model.generate(..., cache_implementation="quantized", cache_config=...)``, bit for bit; the bytes counted
are the library's tensors; a shared prefill replayed into the cache equals a live one."""
from __future__ import annotations

import pytest
import torch
from helpers.tiny_lm import tiny_causal_lm, tiny_model

from adapters.hf.attach import attach
from adapters.hf.compat import cache_kwargs
from adapters.cache.config import CacheConfig

pytest.importorskip("optimum.quanto")
pytest.importorskip("hqq")

CASES = [("hf-quanto", 4, {}), ("hf-quanto", 2, {"residual_length": 24}),
         ("hf-hqq", 4, {}), ("hf-hqq", 2, {"axis_key": 1, "axis_value": 1, "residual_length": 16})]


def _prompt(n=150, seed=0):
    return torch.randint(0, 256, (1, n), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("codec, bits, options", CASES)
def test_generate_equals_plain_transformers(codec, bits, options):
    model = tiny_model(head_dim=64, layers=3)
    ids = _prompt()
    args = dict(max_new_tokens=60, do_sample=False, return_dict_in_generate=True, output_scores=True)
    plain = model.generate(ids, cache_implementation="quantized",
                           cache_config={"backend": codec[3:], "nbits": bits, **options}, **args)
    with attach(model) as new_cache:
        cache = new_cache(CacheConfig(codec=codec, bits=bits, options=options))
        ours = model.generate(ids, **cache_kwargs(model, cache), **args)
    assert torch.equal(ours.sequences, plain.sequences)
    assert all(torch.equal(a, b) for a, b in zip(ours.scores, plain.scores))
    # what the byte counts say is what the library's layers hold
    held = ours_bytes = 0
    for layer in cache.layers:
        for q in (layer._quantized_keys, layer._quantized_values):
            if isinstance(q, tuple):
                held += q[0].numel() * q[0].element_size() + sum(
                    t.numel() * t.element_size() for t in q[1].values() if torch.is_tensor(t))
            else:
                held += sum(t.numel() * t.element_size() for t in (q._data._data, q._scale, q._shift))
        ours_bytes += layer.keys.numel() * 4 * 2 if layer.keys.dim() == 4 else 0
    s = cache.stats()
    assert s["compressed_bytes"] == held and s["cache_bytes"] == held + ours_bytes
    total = ids.shape[1] + 59  # the last token is generated, not cached
    residual = cache.layers[0].keys.shape[-2] if cache.layers[0].keys.dim() == 4 else 0
    assert s["committed_tokens"] == total - residual and s["uncompressed_bytes"] == 3 * total * 2 * 2 * 64 * 4


def test_bits_per_coordinate_count_scale_and_shift():
    model = tiny_model(head_dim=64, layers=2)
    with attach(model) as new_cache:
        cache = new_cache(CacheConfig(codec="hf-quanto", bits=4))
        model(_prompt(), **cache_kwargs(model, cache))
    # 4 bits a coordinate, then a float32 scale and shift per group of 64 (the tiny model computes in float32)
    assert cache.stats()["bits_per_coord"] == 4 + 2 * 32 / 64  # 8 bytes / coords: the rational 5, exact


def test_a_replayed_prefill_equals_a_live_one():
    """The harness prefills once natively and replays the prompt into each cache: for transformers' layers
    the first update quantizes the prompt at once, as a live prefill does."""
    from transformers import DynamicCache
    from transformers.cache_utils import HQQQuantizedLayer

    lm = tiny_causal_lm(head_dim=64, layers=2)
    prompt = torch.tensor([_prompt(140)[0].tolist()])
    config = CacheConfig(codec="hf-hqq", bits=2, options={"residual_length": 16})
    with lm._session(config) as new_cache:
        live = new_cache()
        lm.model(prompt, **cache_kwargs(lm.model, live))
        native = DynamicCache(config=lm.model.config)
        lm.model(prompt, **cache_kwargs(lm.model, native))
        replayed = new_cache()
        for i, layer in enumerate(native.layers):
            replayed.replay(i, layer)
    for a, b in zip(live.layers, replayed.layers):
        assert isinstance(a, HQQQuantizedLayer)
        assert torch.equal(a._dequantize(a._quantized_keys), b._dequantize(b._quantized_keys))
        assert torch.equal(a._dequantize(a._quantized_values), b._dequantize(b._quantized_values))
    assert live.stats() == replayed.stats()
    fork = replayed.fork()  # transformers' layers are shared by a fork, never written in place
    assert fork.stats() == replayed.stats() and fork.layers[0] is not replayed.layers[0]


def test_the_harness_decode_loop_equals_plain_generate():
    """CausalLM.greedy (the harness's rollouts: a shared native prefill replayed, then its own decode loop)
    gives plain transformers' tokens and logits."""
    lm = tiny_causal_lm(head_dim=64, layers=2)
    ids = _prompt(130, seed=4)
    plain = lm.model.generate(ids, max_new_tokens=30, do_sample=False, cache_implementation="quantized",
                              cache_config={"backend": "quanto", "nbits": 2, "residual_length": 8},
                              return_dict_in_generate=True, output_scores=True)
    got = lm.greedy(ids[0].tolist(), 30, CacheConfig(codec="hf-quanto", bits=2, options={"residual_length": 8}))
    new = plain.sequences[0, ids.shape[1]:].tolist()
    assert got["tokens"] == new[: len(got["tokens"])] and len(got["tokens"]) > 10
    # whole forwards through the same transformers layers: the harness's replayed prefill and its own decode loop
    # sum in other shapes (float32, U32 of the terms each, through 2 layers): float32's default assert_close
    # tolerance (rtol 1.3e-6 = 22 U32, atol 1e-5) on logits of O(1)
    torch.testing.assert_close(got["logits"], torch.stack(plain.scores)[: len(got["tokens"]), 0].float())
