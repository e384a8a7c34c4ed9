"""``model.generate`` through our cache with its decode steps graphed (adapters.hf.graphed_decode.GraphedForward):
the same tokens and scores as the eager ``generate`` (its sampling and logits processors untouched),
the cache handed back as the eager steps leave it, a padded batch left eager, the model's forward
restored; on CUDA the replayed steps equal the same steps run eagerly, byte for byte."""
from __future__ import annotations

import pytest
import torch

from adapters.hf.graphed_decode import GraphedForward
from adapters.hf.attach import attach
from adapters.hf.compat import cache_kwargs
from adapters.cache.config import CacheConfig
from tests.adapters.hf.test_graphed_decode import _layer_state, _lively, _prompts
from helpers.tiny_lm import tiny_causal_lm

NEW = 14


def _generate(lm, ids, cfg, graphed: str | None, mask=None, **kw):
    """-> (generate's output, the cache, the GraphedForward or None). ``graphed``: None (eager), or
    'static' / 'capture' (GraphedForward's capture flag)."""
    model = lm.model
    mask = torch.ones_like(ids) if mask is None else mask
    with torch.no_grad(), attach(model) as new_cache:
        cache = new_cache(cfg)
        fw = None if graphed is None else GraphedForward(model, cache, NEW - 1, capture=graphed == "capture")
        torch.manual_seed(0)  # generate samples from the global generator
        with fw or torch.no_grad():
            out = model.generate(ids, attention_mask=mask, max_new_tokens=NEW, min_new_tokens=NEW, pad_token_id=0,
                                 return_dict_in_generate=True, output_scores=True, **cache_kwargs(model, cache), **kw)
    return out, cache, fw


@pytest.mark.parametrize("kw", [dict(do_sample=False, repetition_penalty=1.3), dict(do_sample=True, top_k=20)],
                         ids=["greedy-with-a-processor", "sampling"])
@pytest.mark.parametrize("cfg", [CacheConfig(codec="none"), CacheConfig(codec="octopus", bits=3, residual=8),
                                 CacheConfig(codec="qjl", bits=3, residual=0)], ids=["native", "octopus", "qjl"])
def test_generate_takes_its_decode_steps_in_the_static_layout(cfg, kw):
    lm = _lively(tiny_causal_lm())
    ids = torch.tensor(_prompts(2, 40))
    eager, ce, _ = _generate(lm, ids, cfg, None, **kw)
    static, cs, fw = _generate(lm, ids, cfg, "static", **kw)
    assert fw.replayed == NEW - 1 and fw.calls == NEW - 1  # every decode step, none left to the model
    assert torch.equal(static.sequences, eager.sequences)
    for a, b in zip(eager.scores, static.scores):  # float rounding only (a longer, masked read): another order and
        # length of each attention row's float32 sums (U32 of their terms each), through the tiny model to its
        # scaled-up logits (O(10), _lively): ~10^3 U32 of them
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)
    assert _layer_state(cs) == _layer_state(ce) and cs.stats() == ce.stats()
    assert "forward" not in vars(lm.model)  # the class's forward again


def test_a_padded_batch_is_left_to_the_model():
    lm = _lively(tiny_causal_lm())
    ids = torch.tensor(_prompts(2, 40))
    mask = torch.ones_like(ids)
    mask[1, :7] = 0  # the second prompt is 7 tokens shorter, left-padded
    cfg = CacheConfig(codec="octopus", bits=3, residual=8)
    eager, _, _ = _generate(lm, ids, cfg, None, mask=mask)
    static, _, fw = _generate(lm, ids, cfg, "static", mask=mask)
    assert fw.replayed == 0 and fw.calls == NEW - 1
    assert torch.equal(static.sequences, eager.sequences)
    assert all(torch.equal(a, b) for a, b in zip(eager.scores, static.scores))  # the model's own steps


def test_the_forward_is_restored_when_generate_raises():
    lm = tiny_causal_lm()
    own = lm.model.forward
    lm.model.forward = own  # an instance attribute set before (as accelerate's hooks do) is put back
    with torch.no_grad(), attach(lm.model) as new_cache:
        cache = new_cache(CacheConfig(codec="octopus", bits=3, residual=8))
        with pytest.raises(ValueError), GraphedForward(lm.model, cache, 8, capture=False):
            lm.model.generate(torch.tensor(_prompts(1, 20)), max_new_tokens=-3, **cache_kwargs(lm.model, cache))
    assert vars(lm.model)["forward"] is own


def test_the_causal_lm_graphs_generate_only_where_asked():
    lm = tiny_causal_lm()
    with torch.no_grad(), attach(lm.model) as new_cache:
        cache = new_cache(CacheConfig(codec="octopus", bits=3, residual=8))
        lm.graphs = "off"
        assert not isinstance(lm.graphed_generate(cache, 8), GraphedForward)
        lm.graphs = "auto"  # auto on a CPU: eager
        assert not isinstance(lm.graphed_generate(cache, 8), GraphedForward)
        lm.graphs = "static"
        assert isinstance(lm.graphed_generate(cache, 8), GraphedForward)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
@pytest.mark.parametrize("cfg", [CacheConfig(), CacheConfig(codec="octopus", bits=3)], ids=["native", "octopus"])
def test_replayed_generate_steps_equal_the_same_steps_run_eagerly(cfg):
    lm = tiny_causal_lm(head_dim=128, hidden=256, heads=8, kv_heads=2)
    lm.model.to("cuda", torch.bfloat16)
    ids = torch.tensor(_prompts(2, 300), device="cuda")
    static, cs, _ = _generate(lm, ids, cfg, "static", do_sample=True, top_k=50)
    graphed, cg, fw = _generate(lm, ids, cfg, "capture", do_sample=True, top_k=50)
    assert fw.replayed == NEW - 1
    assert torch.equal(graphed.sequences, static.sequences)
    assert all(torch.equal(a, b) for a, b in zip(static.scores, graphed.scores))
    assert cg.stats() == cs.stats()


def test_a_forward_of_several_tokens_inside_the_block_hands_the_cache_back_first():
    """Two generate calls in one block, the second fed its first call's output plus more tokens: the
    prefill of those tokens runs eagerly on a cache the graph has handed back, as without the block."""
    lm = _lively(tiny_causal_lm())
    ids = torch.tensor(_prompts(1, 40))
    cfg = CacheConfig(codec="octopus", bits=3, residual=8)
    outs = []
    for graphed in (False, True):
        with torch.no_grad(), attach(lm.model) as new_cache:
            cache = new_cache(cfg)
            fw = GraphedForward(lm.model, cache, 40, capture=False) if graphed else torch.no_grad()
            with fw:
                kw = dict(max_new_tokens=8, min_new_tokens=8, do_sample=False, pad_token_id=0, **cache_kwargs(lm.model, cache))
                first = lm.model.generate(ids, attention_mask=torch.ones_like(ids), **kw)
                more = torch.cat([first, torch.tensor([[5, 6, 7, 8, 9]])], 1)
                outs.append(lm.model.generate(more, attention_mask=torch.ones_like(more), **kw))
    assert torch.equal(outs[0], outs[1])
