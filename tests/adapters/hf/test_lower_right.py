"""adapters/hf/lower_right: a causal chunk against its whole prefix is attended with no mask in memory (the
mask interface answers None for exactly that pattern, SDPA computes causal_lower_right) and gives the keys
the materialized mask keeps; every other pattern (padding, a sliding window, a decode step, a whole prompt,
queries that are not the last positions) keeps transformers' own mask."""
from __future__ import annotations

import pytest
import torch
from helpers.tiny_lm import tiny_causal_lm
from helpers.tolerances import attention_atol
from transformers import DynamicCache
from transformers.masking_utils import causal_mask_function, sdpa_mask, sliding_window_causal_mask_function

import adapters.hf.lower_right as lower_right_module
from adapters.hf.attach import attach
from adapters.hf.compat import cache_kwargs
from adapters.hf.lower_right import chunk_mask, lower_right
from adapters.hf.prefill import native_prefill


@pytest.mark.parametrize("case", [
    dict(q_length=1, kv_length=9, q_offset=8),  # a decode step: transformers' own None
    dict(q_length=9, kv_length=9),  # a whole prompt: transformers' own None
    dict(q_length=4, kv_length=9, q_offset=5, attention_mask=torch.tensor([[0] + [1] * 8])),  # a pad
    dict(q_length=4, kv_length=9, q_offset=5, local_size=3,
         mask_function=sliding_window_causal_mask_function(3)),  # a sliding window
    dict(q_length=4, kv_length=9, q_offset=3),  # queries that are not the last positions
])
def test_every_other_pattern_keeps_transformers_mask(case):
    got, want = chunk_mask(batch_size=1, **case), sdpa_mask(batch_size=1, **case)
    assert (got is None and want is None) or torch.equal(got, want)


def test_a_causal_chunk_against_its_prefix_has_no_mask_and_keeps_the_same_keys():
    kept = sdpa_mask(batch_size=2, q_length=4, kv_length=9, q_offset=5, attention_mask=torch.ones(2, 9, dtype=torch.long))
    assert chunk_mask(batch_size=2, q_length=4, kv_length=9, q_offset=5, mask_function=causal_mask_function,
                      attention_mask=torch.ones(2, 9, dtype=torch.long)) is None
    # the materialized mask keeps, for query i of 4 (position 5 + i), keys 0 .. 5 + i: causal_lower_right(4, 9)
    from torch.nn.attention.bias import causal_lower_right

    lr = causal_lower_right(4, 9)._materialize(torch.device("cpu"))
    assert torch.equal(kept[0, 0], lr) and torch.equal(kept[1, 0], lr)


def test_the_attention_of_a_none_mask_is_the_masked_attention():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 5, 16, generator=g), torch.randn(2, 2, 12, 16, generator=g),
               torch.randn(2, 2, 12, 16, generator=g))
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal = 2, True
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    sdpa = ALL_ATTENTION_FUNCTIONS["sdpa"]
    mask = sdpa_mask(batch_size=2, q_length=5, kv_length=12, q_offset=7)
    got, _ = lower_right(sdpa)(module, q, k, v, None, scaling=0.25)
    want, _ = sdpa(module, q.double(), k.double(), v.double(), mask, scaling=0.25)
    # both against float64: each float32 attention within attention_atol of it
    atol = attention_atol(float(q.norm(dim=-1).max()), float(k.norm(dim=-1).max()), float(v.abs().max()), 0.25,
                          n=16, t=12)
    torch.testing.assert_close(got.double(), want, rtol=0, atol=atol)
    # a mask given, or as many queries as keys, goes to transformers' function unchanged
    assert torch.equal(lower_right(sdpa)(module, q, k, v, mask, scaling=0.25)[0], sdpa(module, q, k, v, mask, scaling=0.25)[0])


@torch.no_grad()
def test_a_chunked_prefill_builds_no_chunk_by_prefix_mask(monkeypatch):
    """Attached, a prompt prefilled in chunks asks transformers for no [B, 1, chunk, T] mask, and its logits are
    those of the whole forward (as test_chunked_prefill checks them: the same rounding bound)."""
    from tests.adapters.hf.test_chunked_prefill import ATOL

    lm = tiny_causal_lm("qwen2")
    x = torch.randint(0, 256, (1, 70), generator=torch.Generator().manual_seed(1))
    whole = lm.model(x, **cache_kwargs(lm.model, DynamicCache(config=lm.model.config)), use_cache=True).logits.float()
    built = []
    real = lower_right_module.sdpa_mask
    monkeypatch.setattr(lower_right_module, "sdpa_mask", lambda *a, **k: built.append(a[1:3]) or real(*a, **k))
    with attach(lm.model):
        _, logits = native_prefill(lm.model, x, {}, chunk=16)
    assert (16, 16) in built  # the first chunk asked the harness's mask interface (transformers' own None)
    assert not [(q, t) for q, t in built if 1 < q < t]
    torch.testing.assert_close(logits, whole, rtol=0, atol=ATOL)


def test_transformers_upper_left_none_is_spelled_out():
    """transformers answers None for an empty static cache's prefill (fewer queries than keys, upper-left: query i
    sees keys 0..i): every reader here takes None as lower-right, so the mask is materialized; and a 2-D mask
    shorter than the keys (sdpa_mask pads it masked) is no plain chunk."""
    case = dict(batch_size=1, q_length=4, kv_length=9, q_offset=0)
    assert sdpa_mask(**case) is None
    assert torch.equal(chunk_mask(**case), sdpa_mask(**case, allow_is_causal_skip=False))
    short = dict(batch_size=1, q_length=4, kv_length=9, q_offset=5, attention_mask=torch.ones(1, 6, dtype=torch.bool))
    assert torch.equal(chunk_mask(**short), sdpa_mask(**short))


@torch.no_grad()
def test_a_static_cache_prefill_attached_is_the_models_own():
    """attach promises the model's own attention for a cache that is not ours: a transformers StaticCache's
    prefill (12 queries, 32 slots) gives the logits it gives unattached, to the rounding of attention over other
    blockings (its keys cut to 12 and is_causal there, a materialized mask over 32 here: test_chunked_prefill's
    bound; read as lower-right causal, the queries attended the empty slots and moved the logits by 1.15)."""
    from tests.adapters.hf.test_chunked_prefill import ATOL

    from transformers import StaticCache

    lm = tiny_causal_lm("qwen2")
    x = torch.randint(0, 256, (1, 12), generator=torch.Generator().manual_seed(0))
    ref = lm.model(x, **cache_kwargs(lm.model, StaticCache(config=lm.model.config, max_cache_len=32)),
                   use_cache=True).logits
    with attach(lm.model):
        got = lm.model(x, **cache_kwargs(lm.model, StaticCache(config=lm.model.config, max_cache_len=32)),
                       use_cache=True).logits
    torch.testing.assert_close(got, ref, rtol=0, atol=ATOL)


def test_a_module_that_is_not_causal_keeps_transformers_attention():
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    calls = []
    module = torch.nn.Module()
    module.is_causal = False
    q, k = torch.zeros(1, 2, 3, 8), torch.zeros(1, 2, 5, 8)
    lower_right(lambda *a, **kw: calls.append(1) or ("theirs", None))(module, q, k, k, None)
    assert calls == [1]
    assert ALL_ATTENTION_FUNCTIONS["sdpa"] is not None
