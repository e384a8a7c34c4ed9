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
from adapters.hf.cache import attach
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
