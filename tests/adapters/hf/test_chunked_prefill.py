"""adapters/hf/prefill: a prompt prefilled in chunks through a native cache, then replayed into the rollout's
cache, gives what the one-piece prefill gives, to float rounding: the same greedy tokens, the same cache
bytes, logits within the rounding of matmuls of other shapes; for the baseline and every codec, shared
or not, one prompt or a left-padded batch (a chunk of nothing but padding included)."""
from __future__ import annotations

import pytest
import torch
from helpers.tiny_lm import tiny_causal_lm
from transformers import DynamicCache

from adapters.cache.config import CacheConfig
from adapters.hf.compat import cache_kwargs
from adapters.hf.prefill import chunk_bounds, chunk_pads, native_prefill

# chunked and whole forwards sum each attention and matmul over the same terms in other blockings: float32
# (U32 each) through the tiny model's 2 layers to logits of O(1), as a batch against one sequence: ~300 U32
ATOL = 2e-5
CONFIGS = {"native": None, "none": CacheConfig(), "kivi": CacheConfig(codec="kivi", bits=2, residual=8),
           "octopus": CacheConfig(codec="octopus", bits=2, residual=8)}


def test_bounds_and_pads_of_a_chunk():
    assert chunk_bounds(10, None) == [(0, 10)] and chunk_bounds(10, 10) == [(0, 10)] and chunk_bounds(10, 64) == [(0, 10)]
    assert chunk_bounds(10, 4) == [(0, 4), (4, 8), (8, 10)]
    with pytest.raises(ValueError, match=">= 1 token"):
        chunk_bounds(10, 0)
    # sequence 0 opens with 6 pads, sequence 1 with none: its pads fall in the first two chunks of 4
    assert [chunk_pads([6, 0], s, e) for s, e in chunk_bounds(10, 4)] == [[4, 0], [2, 0], [0, 0]]
    assert chunk_pads(None, 0, 4) is None


@pytest.fixture(scope="module")
def lm():
    return tiny_causal_lm("qwen2")


def _prompts():
    g = torch.Generator().manual_seed(3)
    return [torch.randint(0, 256, (n,), generator=g).tolist() for n in (90, 35)]


@torch.no_grad()
def test_native_prefill_in_chunks_is_the_whole_forward(lm):
    """The chunks' logits, in order, and the native cache they leave: those of one forward."""
    x = torch.tensor([_prompts()[0]])
    whole = lm.model(x, **cache_kwargs(lm.model, DynamicCache(config=lm.model.config)), use_cache=True).logits.float()
    layers, logits = native_prefill(lm.model, x, {}, chunk=16)
    assert logits.shape == whole.shape
    torch.testing.assert_close(logits, whole, rtol=0, atol=ATOL)
    last_layers, last = native_prefill(lm.model, x, {"logits_to_keep": 1}, chunk=16)
    assert last.shape == (1, 1, whole.shape[-1])  # only the last column kept
    torch.testing.assert_close(last[:, 0], whole[:, -1], rtol=0, atol=ATOL)
    for a, b in zip(layers, last_layers):
        assert a.keys.shape == (1, 2, 90, 32) and torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


@torch.no_grad()
@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("share", [True, False])
def test_a_chunked_greedy_batch_is_the_unchunked_one(lm, name, share):
    """A left-padded batch (90 and 35 tokens: with chunks of 16 the short prompt's first three chunks are all
    padding): the same tokens, logits to float rounding, and a cache holding the same bytes."""
    cfg, prompts, runs = CONFIGS[name], _prompts(), {}
    lm.share_prefill = share
    try:
        for chunk in (None, 16, 7):
            lm.prefill_chunk = chunk
            lm._shared.release()
            runs[chunk] = lm.greedy(prompts, 5, cfg, force="self")
    finally:
        lm.prefill_chunk, lm.share_prefill = None, True
    ref = runs[None]
    for chunk in (16, 7):
        for got, want in zip(runs[chunk], ref):
            assert got["tokens"] == want["tokens"]
            torch.testing.assert_close(got["logits"], want["logits"], rtol=0, atol=ATOL)
            torch.testing.assert_close(got["forced_logits"], want["forced_logits"], rtol=0, atol=ATOL)
            if cfg is not None:
                b = got["sequence"]
                assert got["cache"].kv.stats(b) == want["cache"].kv.stats(b)
                assert got["cache"].kv.nbytes(b) == want["cache"].kv.nbytes(b)


@torch.no_grad()
@pytest.mark.parametrize("name", ["native", "kivi"])
def test_teacher_forcing_emits_every_column_of_a_chunked_prefix(lm, name):
    """Perplexity's prefix, prefilled in chunks: each of its columns' logits is emitted, then the later
    chunks read the cache the replay filled, as after a one-piece prefix."""
    ids, got = _prompts()[0], {}
    for chunk in (None, 12):
        lm.prefill_chunk, out = chunk, []
        lm._shared.release()
        try:
            cache = lm.teacher_force(ids, [50, 20, 20], CONFIGS[name], lambda s, lg: out.append((s, lg)))
        finally:
            lm.prefill_chunk = None
        got[chunk] = (out, cache)
    (whole, cache_whole), (chunked, cache_chunked) = got[None], got[12]
    assert [s for s, _ in chunked] == [s for s, _ in whole] == [0, 50, 70]
    assert chunked[0][1].shape == (50, lm.model.config.vocab_size)
    torch.testing.assert_close(torch.cat([lg for _, lg in chunked]), torch.cat([lg for _, lg in whole]),
                               rtol=0, atol=ATOL)
    if name != "native":
        assert cache_chunked.kv.stats() == cache_whole.kv.stats()


@torch.no_grad()
def test_a_conversation_with_a_chunked_context(lm):
    context, questions = _prompts()[0], [[5, 6, 7], [8, 9]]
    runs = {}
    for chunk in (None, 32):
        lm.prefill_chunk = chunk
        lm._shared.release()
        try:
            runs[chunk] = lm.converse(context, questions, 4, CONFIGS["octopus"],
                                      on_turn=lambda cache: cache.kv.stats(0))
        finally:
            lm.prefill_chunk = None
    assert [(t["tokens"], t["fed"], t["after"]) for t in runs[32]] == \
        [(t["tokens"], t["fed"], t["after"]) for t in runs[None]]


def test_the_run_records_the_chunk_in_model_json(lm):
    assert lm.describe()["prefill_chunk"] is None
    lm.prefill_chunk = 64
    try:
        assert lm.describe()["prefill_chunk"] == 64
    finally:
        lm.prefill_chunk = None
