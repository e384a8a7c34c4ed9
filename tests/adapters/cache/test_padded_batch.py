"""Left-padded batches through the compressed cache (adapters/cache/padded_batch.py, the ragged paths of
adapters/cache/kv_cache.py, adapters/hf/cache.py and adapters/hf/causal_lm.py, adapters/cache/encoded_store.py):
every prompt of a batch of different lengths gets what it gets alone (logits to float rounding,
the same committed tokens, bytes and row statistics), so no pad enters a codec state or a KIVI
group; the append-only store reads back what concatenating the states gives."""
from __future__ import annotations

import pytest
import torch
from helpers.decode_checks import out_rtol
from helpers.tiny_lm import tiny_causal_lm
from helpers.tolerances import attention_atol

from adapters.hf.compat import cache_kwargs
from adapters.cache.encoded_store import EncodedStore
from adapters.cache.config import CacheConfig
from adapters.cache.layer_kv import LayerKV
from kernels import Encoded, make_codec

#: float32 batched matmuls sum in another order than batch 1's (as tests/adapters/hf/test_hf_causal_lm.py)
ATOL = 2e-5  # a padded batch's products sum in another blocking: float32 (U32 of the terms each) through the
# tiny model's 2 layers to logits of O(1), ~300 U32 (tests/adapters/hf/test_hf_causal_lm.py's batch test)
LENGTHS = (100, 61, 83)
# one plan per prompt, of different shapes: at the last step prompt 1 has nothing left (padding only)
PLANS = ([60, 16, 16, 8], [37, 24], [51, 16, 16])
CONFIGS = {
    "none": CacheConfig(residual=8),
    "octopus": CacheConfig(codec="octopus", bits=3, residual=8, protect=[0]),  # layer 0 native: padded columns
    "kivi": CacheConfig(codec="kivi", bits=2, residual=8),  # groups of 32 tokens from each prompt's first token
    "turboquant-prod": CacheConfig(codec="turboquant-prod", bits=3, residual=8),  # a score estimator
}


@pytest.fixture(scope="module")
def lm():
    return tiny_causal_lm("qwen2")


@pytest.fixture(scope="module")
def prompts():
    g = torch.Generator().manual_seed(3)
    return [torch.randint(0, 256, (n,), generator=g).tolist() for n in LENGTHS]


def _per_sequence(cache, b: int) -> dict:
    """What a row learns about sequence b of a cache, and the committed keys as it would decode them."""
    kv = cache.kv
    out = {"stats": kv.stats(b), "bytes": kv.nbytes(b),
           "committed": [layer.seq_committed[b] for layer in kv.layers],
           "window": [layer.seq_window[b] for layer in kv.layers]}
    keys = []
    for layer in kv.layers:
        if layer.codec is not None and layer.seq_committed[b]:
            keys.append(layer.codec.decode(layer.compressed_keys())[b:b + 1, :, :layer.seq_committed[b]])
    return out, keys


@torch.no_grad()
@pytest.mark.parametrize("codec", sorted(CONFIGS))
def test_teacher_forced_batch_gives_each_prompt_what_it_gets_alone(lm, prompts, codec):
    cfg = CONFIGS[codec]
    got = [[] for _ in prompts]
    cache = lm.teacher_force(prompts, PLANS, cfg, lambda b, start, lg: got[b].append((start, lg)))
    for b, (ids, plan) in enumerate(zip(prompts, PLANS)):
        alone = []
        single = lm.teacher_force(ids, plan, cfg, lambda start, lg: alone.append((start, lg)))
        assert [s for s, _ in got[b]] == [s for s, _ in alone]  # the same chunks, at the same starts
        torch.testing.assert_close(torch.cat([lg for _, lg in got[b]]), torch.cat([lg for _, lg in alone]),
                                   rtol=0, atol=ATOL)
        mine, keys = _per_sequence(cache, b)
        want, want_keys = _per_sequence(single, 0)
        assert mine == want  # committed tokens, window, bytes and the row's rate fields: exactly batch 1's
        assert mine["stats"]["uncompressed_bytes"] == 2 * 2 * len(ids) * 2 * 32 * 4  # layers*kv*T*heads*d*fp32
        # the committed keys decode to batch 1's: a pad in a codec state, or a KIVI group not starting at the
        # prompt's first token, changes a whole group's scale and zero
        for k, w in zip(keys, want_keys):  # the same codes of keys that those forwards computed to ~ATOL
            torch.testing.assert_close(k, w, rtol=0, atol=1e-5)
    if codec != "none":
        assert len({layer.seq_committed[1] for layer in cache.kv.layers if layer.codec is not None}) == 1
        assert any(layer.padded for layer in cache.kv.layers)


@torch.no_grad()
@pytest.mark.parametrize("codec", ["none", "kivi", "octopus"])
def test_batched_greedy_gives_each_prompt_what_it_gets_alone(lm, prompts, codec, monkeypatch):
    """Prompts of different lengths decode together; a prompt that stops at EOS early is fed padding
    from then on, so its tokens, logits, forced logits and cache are those of its own run."""
    cfg = CONFIGS[codec]
    free = lm.greedy(prompts[1], 6, cfg)["tokens"]
    monkeypatch.setattr(type(lm), "eos_ids", lambda self: {free[0]})  # prompt 1 stops at its first token
    forces = [prompts[0][:5], prompts[1][:1], prompts[2][:9]]  # forced continuations of other lengths
    batch = lm.greedy(prompts, 6, cfg, force=forces)
    assert [len(r["tokens"]) for r in batch] == [6, 1, 6]  # the random model repeats one token per prompt
    for b, (ids, force) in enumerate(zip(prompts, forces)):
        alone = lm.greedy(ids, 6, cfg, force=force)
        r = batch[b]
        assert r["sequence"] == b and r["tokens"] == alone["tokens"]
        torch.testing.assert_close(r["logits"], alone["logits"], rtol=0, atol=ATOL)
        torch.testing.assert_close(r["forced_logits"], alone["forced_logits"], rtol=0, atol=ATOL)
        assert r["forced_logits"].shape[0] == len(force)
        assert _per_sequence(r["cache"], b)[0] == _per_sequence(alone["cache"], 0)[0]
    selfs = lm.greedy(prompts, 6, cfg, force="self")
    for b, r in enumerate(selfs):
        assert r["forced_logits"].shape[0] == len(r["tokens"])


@torch.no_grad()
def test_shared_prefill_of_a_padded_batch_is_bit_identical(prompts):
    """A padded prefill computed once and replayed gives exactly what running it through the cache gives."""
    out = {}
    for share in (True, False):
        lm = tiny_causal_lm("qwen2")
        lm.share_prefill = share
        got = []
        lm.teacher_force(prompts, PLANS, CONFIGS["kivi"], lambda b, s, lg: got.append(lg))
        out[share] = got
    assert all(torch.equal(a, b) for a, b in zip(out[True], out[False]))


def _states(codec, sizes, B=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [codec.encode(torch.randn(B, 2, n, 64, generator=g)) for n in sizes]


@pytest.mark.parametrize("name,bits", [("kivi", 2), ("octopus", 3)])
def test_store_reads_what_concatenation_gives(name, bits):
    """Appends (capacity doubling on the way) read back as the concatenation of the states, per
    sequence where sequences append different counts; bytes count real rows only; a fork copies
    on write."""
    codec = make_codec(name, bits, 64, num_heads=2)
    G = codec.token_block
    store = EncodedStore(3)
    ev = _states(codec, [G, 3 * G, G, 2 * G])  # every sequence: one length
    for s in ev:
        store.append(s)
    assert store.view().tensors.keys() == ev[0].tensors.keys()
    for k, t in Encoded.cat(ev).tensors.items():
        assert torch.equal(store.view().tensors[k], t)
    assert store.nbytes() == Encoded.cat(ev).nbytes()
    # ragged: sequence 1 appends more; each sequence's rows are its own states in order
    other = store.fork()
    extra = _states(codec, [2 * G, G], B=1, seed=1)
    for s in extra:
        other.append(s, [1])
    both = _states(codec, [G], B=2, seed=2)[0]
    other.append(both, [0, 2])
    view = other.view()
    assert view.num_tokens == 10 * G and other.tokens == [8 * G, 10 * G, 8 * G]
    pick = lambda s, i: Encoded({k: t[i:i + 1] for k, t in s.tensors.items()}, (1, *s.shape[1:]), s.dtype)  # noqa: E731
    for b, mine in ((0, [pick(both, 0)]), (1, extra), (2, [pick(both, 1)])):
        want = Encoded.cat([pick(s, b) for s in ev] + mine)
        for k, t in want.tensors.items():
            rows = t.shape[-2]
            assert torch.equal(view.tensors[k][b:b + 1, :, :rows], t)
        assert other.nbytes(b) == want.nbytes()
    for k, t in Encoded.cat(ev).tensors.items():  # the original did not see the fork's writes
        assert torch.equal(store.view().tensors[k], t)


@torch.no_grad()
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_ragged_decode_step_equals_each_sequence_alone(backend, monkeypatch):
    """A decode step over sequences of different lengths: backend 'triton' (here Triton's
    interpreter, on CUDA the fused kernel) goes through kernels.attention.decode_attention with
    per-sequence lengths and window lengths; 'torch' through the PyTorch core. Each sequence's
    output equals that of a layer that held only its tokens."""
    if backend == "triton":
        pytest.importorskip("triton")
        from kernels.triton import available

        if not available(torch.device("cpu")) and not torch.cuda.is_available():
            pytest.skip("no way to run Triton here")
    import adapters.cache.layer_kv as kvc

    calls = []
    real = kvc.decode_attention
    monkeypatch.setattr(kvc, "decode_attention", lambda *a, **kw: calls.append(kw) or real(*a, **kw))
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    codec = make_codec("octopus", 2, 64, num_heads=2, device=dev)
    cfg = CacheConfig(codec="octopus", bits=2, residual=4, backend=backend)
    g = torch.Generator().manual_seed(7)
    lengths, T = (21, 3, 14), 21  # sequence 1: nothing committed, a shorter window
    k, v, q = (torch.randn(3, h, n, 64, generator=g).to(dev) for h, n in ((2, T + 1), (2, T + 1), (4, 1)))
    layer = LayerKV(codec, cfg)
    pads = [T - n for n in lengths]
    layer.append(k[..., :T, :], v[..., :T, :], pads)  # left-padded: the pads are dropped
    assert layer.seq_lengths == list(lengths) and layer.padded
    out = layer.attend(q, k_new=k[..., T:, :], v_new=v[..., T:, :])
    for b, n in enumerate(lengths):
        alone = LayerKV(codec, cfg)
        alone.append(k[b:b + 1, :, T - n:T], v[b:b + 1, :, T - n:T])
        want = alone.attend(q[b:b + 1], k_new=k[b:b + 1, :, T:], v_new=v[b:b + 1, :, T:])
        # the torch path: one float32 attention in another blocking (a codec's rotated-frame scores: 2 d + 8
        # rounding steps), within twice attention_atol of the other; the fused kernel: five fp16 roundings of each
        # term, to first order a fraction out_rtol of max |v|
        rk, rv = alone.reconstruct()
        rk, rv = torch.cat([rk, k[b:b + 1, :, T:]], -2), torch.cat([rv, v[b:b + 1, :, T:]], -2)
        tol = (2 * attention_atol(float(q.norm(dim=-1).max()), float(rk.norm(dim=-1).max()), float(rv.abs().max()),
                                  1 / 8, 2 * 64 + 8, n + 1) if backend == "torch"
               else out_rtol(torch.float32) * float(rv.abs().max()))
        torch.testing.assert_close(out[b:b + 1], want, rtol=0, atol=tol)
    if backend == "triton":
        assert calls and calls[0]["lengths"] is not None and calls[0]["window_lengths"] is not None
    else:
        assert not calls


@torch.no_grad()
def test_generate_on_a_left_padded_batch_reads_the_padding_from_the_mask(lm, prompts):
    """``model.generate`` with a left-padded batch and its attention mask (what lm-eval's batches do):
    the attached cache takes the padding from the mask, so each row generates what it does alone."""
    from adapters.hf.attach import attach

    T = max(LENGTHS)
    x = torch.tensor([[0] * (T - len(p)) + p for p in prompts])
    mask = (torch.arange(T) >= torch.tensor([T - len(p) for p in prompts])[:, None]).long()
    kw = dict(max_new_tokens=4, min_new_tokens=4, do_sample=False, output_logits=True, return_dict_in_generate=True)
    with attach(lm.model) as new_cache:
        cache = new_cache(CONFIGS["kivi"])
        out = lm.model.generate(x, attention_mask=mask, **cache_kwargs(lm.model, cache), **kw)
        for b, p in enumerate(prompts):
            alone = new_cache(CONFIGS["kivi"])
            ref = lm.model.generate(torch.tensor([p]), **cache_kwargs(lm.model, alone), **kw)
            assert out.sequences[b, T:].tolist() == ref.sequences[0, len(p):].tolist()
            torch.testing.assert_close(torch.stack(out.logits)[:, b], torch.stack(ref.logits)[:, 0], rtol=0, atol=ATOL)
            assert cache.kv.stats(b) == alone.kv.stats()
        with pytest.raises(ValueError, match="left-padded"):
            lm.model.generate(x, attention_mask=mask.flip(-1), **cache_kwargs(lm.model, new_cache(CONFIGS["kivi"])),
                              **kw)


def test_left_padded_feed_counts_positions_per_sequence():
    from adapters.cache.padded_batch import LeftPadded

    feed = LeftPadded(2, pad_id=7, device="cpu")
    x, kw, pads = feed.step([[1, 2], [3, 4]])  # one length: the bare tensor, as an unpadded batch
    assert x.tolist() == [[1, 2], [3, 4]] and kw == {} and pads is None
    x, kw, pads = feed.step([[5, 6, 8], [9]])
    assert x.tolist() == [[5, 6, 8], [7, 7, 9]] and pads == [0, 2]
    assert kw["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 1]]
    assert kw["position_ids"].tolist() == [[2, 3, 4], [0, 0, 2]]
    branch = feed.fork()
    x, kw, pads = feed.step([[], [10]])
    assert x.tolist() == [[7], [10]] and pads == [1, 0] and kw["position_ids"].tolist() == [[0], [3]]
    assert branch.seen == [5, 3] and feed.seen == [5, 4]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@torch.no_grad()
def test_cuda_batched_greedy_through_the_fused_kernels(monkeypatch):
    """On CUDA (backend 'auto'), decode steps of a padded batch go through the fused kernels with
    per-sequence lengths; every prompt gets what it gets alone (to the kernels' fp16 dots)."""
    import adapters.cache.layer_kv as kvc

    lengths = []
    real = kvc.decode_attention
    monkeypatch.setattr(kvc, "decode_attention", lambda *a, **kw: lengths.append(kw["lengths"]) or real(*a, **kw))
    lm = tiny_causal_lm("qwen2", layers=2, hidden=256, heads=4, kv_heads=2, head_dim=64)
    lm.model.to("cuda")
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (300, 171, 240)]
    for codec in ("octopus", "turboquant-prod", "kivi"):
        cfg = CacheConfig(codec=codec, bits=3 if codec != "kivi" else 2, residual=8)
        batch = lm.greedy(prompts, 8, cfg, force="self")
        for b, p in enumerate(prompts):
            alone = lm.greedy(p, 8, cfg, force=batch[b]["tokens"])
            assert batch[b]["tokens"] == alone["tokens"], codec
            # the kernels' fp16 dots, batched against alone (other splits and lengths): ~5 U16 (2.4e-3) of each term,
            # through the 2-layer, 256-wide model to logits of O(1-10)
            torch.testing.assert_close(batch[b]["logits"], alone["logits"], rtol=0, atol=2e-2)
            torch.testing.assert_close(batch[b]["forced_logits"], alone["forced_logits"], rtol=0, atol=2e-2)
            assert _per_sequence(batch[b]["cache"], b)[0] == _per_sequence(alone["cache"], 0)[0]
    assert any(t is not None for t in lengths)  # ragged steps reached decode_attention with lengths
