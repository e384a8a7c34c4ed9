"""adapters/hf/arch.py and the compressed cache on tiny random models of real transformers
architectures (Llama, Qwen2 with sliding layers, Qwen3, Mistral, Phi-3, Gemma 2, Gemma 3 text),
each built here from its own config class: codec 'none' reproduces the model's own chunked and
greedy logits bit for bit; a codec compresses the full-attention layers while sliding-window layers
stay transformers' own (their bytes counted); Gemma 2's logit soft-cap reaches the compressed
attention; what cannot be served is one line naming why, before any weight is read."""
from __future__ import annotations

import pytest
import torch
import transformers as tf
from helpers.output_checks import assert_moved_less_than_lost, kl
from helpers.tiny_lm import byte_tokenizer
from transformers import DynamicCache
from transformers.cache_utils import DynamicSlidingWindowLayer

import adapters.hf.attach as hf_attach
import adapters.hf.cache as hf_cache
from adapters.hf.compat import cache_kwargs
from adapters.hf.arch import UnservableModel, attention_softcap, decoder_arch, servable
from adapters.hf.cache import CompressedLayer
from adapters.hf.attach import attach
from adapters.hf.causal_lm import CausalLM
from adapters.cache.config import CacheConfig
from adapters.registry import get_model

V, WINDOW = 257, 8  # the byte tokenizer's vocabulary; a sliding window well under the test sequence
IDS = torch.randint(0, V - 1, (48,), generator=torch.Generator().manual_seed(0)).tolist()
CHUNKS = [20, 12, 8, 8]
ARCHS = ("llama", "qwen2", "qwen3", "mistral", "phi3", "gemma2", "gemma3")
#: the layers each tiny config makes sliding-window (by its own rules: layer_types or sliding_window)
SLIDING = {"llama": [], "qwen2": [2, 3], "qwen3": [], "mistral": [0, 1, 2, 3], "phi3": [],
           "gemma2": [0, 2], "gemma3": [0, 1, 2, 3, 4]}
OCTOPUS = CacheConfig(codec="octopus", bits=4, residual=4)


def tiny_config(arch: str, sliding_window: int | None = WINDOW, **kw):
    """A tiny config of the real architecture: 4 layers (Gemma 3: 6, its 5:1 pattern), hidden 64,
    GQA (4 query heads on 2 KV heads of width 32; Phi-3: 2 on 1, fused qkv, half-rotary)."""
    common = dict(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=32, max_position_embeddings=512, pad_token_id=V - 1,
                  eos_token_id=V - 1, bos_token_id=None, tie_word_embeddings=True, initializer_range=0.1)
    if arch == "llama":
        return tf.LlamaConfig(**common, **kw)
    if arch == "qwen2":  # the last two layers (>= max_window_layers) slide
        return tf.Qwen2Config(**common, use_sliding_window=True, sliding_window=sliding_window, max_window_layers=2,
                              **kw)
    if arch == "qwen3":  # q/k norms
        return tf.Qwen3Config(**common, **kw)
    if arch == "mistral":  # every layer slides
        return tf.MistralConfig(**common, sliding_window=sliding_window, **kw)
    if arch == "phi3":
        common.update(num_attention_heads=2, num_key_value_heads=1)
        del common["head_dim"]
        return tf.Phi3Config(**common, partial_rotary_factor=0.5, **kw)
    if arch == "gemma2":  # alternating sliding / full, logit soft-capping, query_pre_attn_scalar scaling
        kw = {"attn_logit_softcapping": 2.0, "initializer_range": 0.2, **kw}
        return tf.Gemma2Config(**{**common, **kw}, sliding_window=sliding_window, query_pre_attn_scalar=24)
    if arch == "gemma3":  # text only; five sliding layers, then one full
        common["num_hidden_layers"] = 6
        return tf.Gemma3TextConfig(**common, sliding_window=sliding_window, query_pre_attn_scalar=24, **kw)
    raise ValueError(arch)


def tiny_lm(arch: str, seed: int = 0, **kw) -> CausalLM:
    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_config(tiny_config(arch, **kw)).eval()
    model.generation_config.eos_token_id = V - 1
    return CausalLM(model, byte_tokenizer(), f"tiny-{arch}", "(in memory)")


@torch.no_grad()
def model_chunked(model, ids=IDS, chunks=CHUNKS) -> tuple[torch.Tensor, DynamicCache]:
    """The model's own chunked logits [T, V] with a DynamicCache (independent of CausalLM), and the cache."""
    x, cache, out, s = torch.tensor([ids]), DynamicCache(config=model.config), [], 0
    for n in chunks:
        out.append(model(x[:, s:s + n], **cache_kwargs(model, cache), use_cache=True).logits[0].float())
        s += n
    return torch.cat(out), cache


def forced(lm: CausalLM, cfg, ids=IDS):
    logits = []
    cache = lm.teacher_force(ids, CHUNKS, cfg, lambda s, lg: logits.append(lg))
    return torch.cat(logits), cache


@pytest.mark.parametrize("arch", ARCHS)
def test_none_is_the_model_itself(arch):
    """Codec 'none' through the compressed cache: chunked teacher forcing and greedy decoding give the
    model's own logits bit for bit; sliding layers are transformers' own cache layer, holding what a
    DynamicCache holds, and the cache's byte count is that DynamicCache's."""
    lm = tiny_lm(arch)
    arch_ = decoder_arch(lm.model.config)
    assert list(arch_.native) == SLIDING[arch]
    ref, native = model_chunked(lm.model)
    got, cache = forced(lm, CacheConfig())
    assert torch.equal(got, ref)
    lm.share_prefill = False  # the prefill run live through the cache, not replayed from a shared one
    assert torch.equal(forced(lm, CacheConfig())[0], ref)
    lm.share_prefill = True
    base = lm.greedy(IDS[:40], 5, None, force="self")
    none = lm.greedy(IDS[:40], 5, CacheConfig(), force=base["tokens"])
    assert none["tokens"] == base["tokens"]
    assert torch.equal(none["logits"], base["logits"]) and torch.equal(none["forced_logits"], base["forced_logits"])
    for i, (ours, theirs) in enumerate(zip(cache.layers, native.layers)):
        assert isinstance(ours, DynamicSlidingWindowLayer) == (i in SLIDING[arch])
        if i in SLIDING[arch]:
            assert ours.keys.shape[-2] == WINDOW - 1 and torch.equal(ours.keys, theirs.keys)
    held = sum(t.numel() * t.element_size() for layer in native.layers for t in (layer.keys, layer.values))
    assert cache.kv.stats()["cache_bytes"] == cache.kv.stats()["uncompressed_bytes"] == held
    assert cache.kv.stats()["cache_bits_per_coord"] == 32  # float32


@pytest.mark.parametrize("arch,no_window", [("mistral", {"sliding_window": None}), ("qwen2", {"sliding_window": None}),
                                            ("gemma3", {"layer_types": ["full_attention"] * 6})])
def test_the_sliding_window_matters(arch, no_window):
    """The windows are small enough that the tests above would see them dropped: the same weights
    without a window give other logits."""
    assert not decoder_arch(tiny_config(arch, **no_window)).native
    windowed, full = model_chunked(tiny_lm(arch).model)[0], model_chunked(tiny_lm(arch, **no_window).model)[0]
    assert (windowed - full).abs().max() > 0.05


@torch.no_grad()
@pytest.mark.parametrize("arch", [a for a in ARCHS if len(SLIDING[a]) < 4])
def test_a_codec_compresses_full_layers_and_keeps_sliding_ones_native(arch):
    """Octopus at 4 bits: every full-attention layer commits all but the 4-token window (fewer bits
    than native), every sliding layer is transformers' own layer with no codec; the rate counts the
    sliding layers' bytes as native; the logits move, by much less than losing the context does,
    and the codec's score path agrees with decode-then-attend."""
    lm = tiny_lm(arch)
    ref, other = model_chunked(lm.model)[0], model_chunked(lm.model, [7] * 20 + IDS[20:])[0]
    got, cache = forced(lm, OCTOPUS)
    rec, _ = forced(lm, CacheConfig(codec="octopus", bits=4, residual=4, attend="reconstruct"))
    assert torch.equal(got[:20], ref[:20])  # the prefill is plain attention
    assert_moved_less_than_lost(kl(ref[20:], got[20:]), kl(ref[20:], other[20:]))
    # score path (rotated-frame float32 dots, 2 d + 8 rounding steps a score) against decode-then-attend (d):
    # U32 of each score's terms, through the tiny model's layers to logits of O(1), ~10^3 U32
    torch.testing.assert_close(got, rec, rtol=1e-4, atol=1e-4)
    _, n_kv, head_dim = lm.geometry
    coords = bytes_ = 0
    for i, (layer, kv) in enumerate(zip(cache.layers, cache.kv.layers)):
        if i in SLIDING[arch]:
            assert type(layer) is hf_cache.NativeSlidingLayer and kv.codec is None and kv.committed == 0
            assert layer.keys.shape[-2] == WINDOW - 1
            tensors = (layer.keys, layer.values)
        else:
            assert type(layer) is CompressedLayer and kv.codec is not None
            assert kv.committed == (48 - 4) // kv.codec.token_block * kv.codec.token_block
            tensors = (kv.window_k, kv.window_v)
            bytes_ += sum(s.nbytes() for s in kv.key_states + kv.value_states)
            coords += 2 * kv.committed * n_kv * head_dim
        bytes_ += sum(t.numel() * t.element_size() for t in tensors)
        coords += sum(t.numel() for t in tensors)
    s = cache.kv.stats()
    assert s["bits_per_coord"] < 16 and s["cache_bytes"] == bytes_ < s["uncompressed_bytes"]
    assert s["cache_bits_per_coord"] == 8 * bytes_ / coords  # one correctly rounded division of the same integers
    cache.kv.assert_compressed()
    native = lm.describe().get("native_layers", {})
    assert native == ({"sliding": SLIDING[arch]} if SLIDING[arch] else {})


@torch.no_grad()
def test_gemma2_softcap_reaches_the_compressed_attention(monkeypatch):
    """Gemma 2's attention logit soft-cap (2.0 here, on scores large enough to feel it) is applied by
    the compressed path: with it the logits stay near native; dropping it (the kwarg swallowed)
    moves them several times further."""
    lm = tiny_lm("gemma2")
    assert lm.model.config._attn_implementation == "eager"  # sdpa cannot soft-cap: the model's own choice
    ref = model_chunked(lm.model)[0][20:]
    got = forced(lm, OCTOPUS)[0][20:]
    monkeypatch.setattr(hf_attach, "attention_softcap", lambda *a: attention_softcap(*a) and None)
    dropped = forced(lm, OCTOPUS)[0][20:]
    assert (got - ref).norm() * 4 < (dropped - ref).norm()


def test_every_sliding_layer_leaves_nothing_to_compress():
    """Mistral with a window on every layer: served natively, but a codec is refused by name."""
    lm = tiny_lm("mistral")
    with pytest.raises(UnservableModel, match="every layer .* sliding window \\(8 tokens\\).*nothing for codec "
                                              "'octopus' to compress"):
        forced(lm, OCTOPUS)


def _unservable_configs():
    small = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2)
    return {
        "bloom": (tf.BloomConfig(vocab_size=64, hidden_size=32, n_layer=2, n_head=2),
                  r"its attention does not go through transformers' attention interface "
                  r"\(BloomForCausalLM._supports_attention_backend is False\)"),
        "mamba": (tf.MambaConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2),
                  r"it has recurrent \(state-space / linear-attention\) layers.*\('linear_attention': layers 0, 1\)"),
        "jamba": (tf.JambaConfig(**small, num_key_value_heads=1, intermediate_size=64, num_experts=2,
                                 attn_layer_period=2, attn_layer_offset=1),
                  r"it has recurrent .*\('linear_attention': layers 0\)"),
        "gpt_oss": (tf.GptOssConfig(**small, num_key_value_heads=1, head_dim=16, intermediate_size=32,
                                    num_local_experts=2, num_experts_per_tok=1),
                    r"its attention \(GptOssAttention\) adds learned attention sinks"),
        "bert": (tf.BertConfig(**small, intermediate_size=64),
                 r"its attention module BertSelfAttention is not causal"),
        "bart": (tf.BartConfig(vocab_size=64, d_model=32, encoder_layers=1, decoder_layers=1),
                 r"it is an encoder-decoder model"),
        "deepseek_v3": (tf.DeepseekV3Config(**small, kv_lora_rank=16, q_lora_rank=None),
                        r"it uses multi-head latent attention \(kv_lora_rank=16\)"),
        "gemma4_text": (tf.Gemma4TextConfig(**small, intermediate_size=64, num_key_value_heads=1, head_dim=16,
                                            global_head_dim=32, num_kv_shared_layers=0, sliding_window=8,
                                            layer_types=["sliding_attention", "full_attention"],
                                            hidden_size_per_layer_input=0),
                        r"its layers differ in key/value geometry \(KV heads, head_dim\): \(1, 16\) in layers 0; "
                        r"\(1, 32\) in layers 1"),
    }


@pytest.mark.parametrize("name", list(_unservable_configs()))
def test_unservable_is_one_line_naming_why(name):
    config, why = _unservable_configs()[name]
    with pytest.raises(UnservableModel, match=rf"^model type '{name}'( \(\w+\))? cannot be served behind the "
                                              rf"compressed KV cache: {why}") as e:
        servable(config)
    assert "\n" not in str(e.value)


def test_unservable_refused_before_weights_and_before_attach(tmp_path, monkeypatch):
    """Through the 'hf' loader, from config.json alone: no weights are read (there are none); a
    built model is refused by attach before its attention is touched."""
    config, _ = _unservable_configs()["gpt_oss"]
    config.save_pretrained(tmp_path)
    monkeypatch.setattr(tf.AutoModelForCausalLM, "from_pretrained",
                        lambda *a, **k: pytest.fail("weights were read"))
    with pytest.raises(ValueError, match=r"model 'hf' at .*: model type 'gpt_oss' .*learned attention sinks"):
        get_model("hf").load(str(tmp_path), "cpu", "float32")
    torch.manual_seed(0)
    bloom = tf.BloomForCausalLM(_unservable_configs()["bloom"][0]).eval()
    before = bloom.config._attn_implementation
    with pytest.raises(UnservableModel, match="attention interface"):
        with attach(bloom):
            pass
    assert bloom.config._attn_implementation == before


def test_attention_calls_we_cannot_honour_raise():
    """What reaches the compressed attention and cannot be honoured raises, naming it; harmless
    arguments pass and the softcap is returned."""
    lm = tiny_lm("llama")
    attn = lm.model.model.layers[1].self_attn
    assert attention_softcap(attn, 0.0, {"position_ids": torch.arange(3), "use_cache": True, "softcap": 5.0}) == 5.0
    for kwargs, dropout, why in [({"s_aux": torch.zeros(4)}, 0.0, "attention sinks"),
                                 ({"sliding_window": 16}, 0.0, "sliding window of 16 tokens"),
                                 ({"is_causal": False}, 0.0, "not causal"),
                                 ({}, 0.1, r"dropout 0.1 \(training mode\): call model.eval\(\)"),
                                 ({"cu_seq_lens_q": torch.zeros(2)}, 0.0, "passes cu_seq_lens_q")]:
        with pytest.raises(UnservableModel, match=f"layer 1 \\(LlamaAttention\\) .*{why}"):
            attention_softcap(attn, dropout, kwargs)


@torch.no_grad()
@pytest.mark.parametrize("share_prefill", [True, False])
def test_keys_of_another_geometry_are_refused(share_prefill):
    """A config that does not describe the model's keys (here: one KV head claimed, two built): the
    first keys that reach the cache, live or replayed from a shared prefill, raise, naming both."""
    lm = tiny_lm("llama")
    lm.share_prefill = share_prefill
    lm.model.config.num_key_value_heads = 1
    with pytest.raises(UnservableModel, match=r"layer 0 caches keys \(1, 2, 20, 32\).*1 KV heads of width 32"):
        forced(lm, CacheConfig())


@pytest.mark.parametrize("arch", ["qwen3", "mistral", "gemma2"])
def test_load_checkpoint_of_a_new_type(tmp_path, arch):
    """A tiny checkpoint saved here loads through the 'hf' model; describe() says which layers stay
    native; codec 'none' through the loaded model is its own forward."""
    lm = tiny_lm(arch)
    lm.model.save_pretrained(tmp_path)
    lm.tokenizer.save_pretrained(tmp_path)
    loaded = get_model("hf").load(str(tmp_path), "cpu", "float32")
    d = loaded.describe()
    assert d["model_type"] == lm.model.config.model_type and loaded.geometry == lm.geometry
    assert d.get("native_layers", {}) == ({"sliding": SLIDING[arch]} if SLIDING[arch] else {})
    assert torch.equal(forced(loaded, CacheConfig())[0], model_chunked(lm.model)[0])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_softcap_decode_stays_on_the_reference(monkeypatch):
    """On CUDA, 'auto' sends decode steps to the fused kernels, except where the model soft-caps its
    logits (Gemma 2): those take the PyTorch reference, so 'auto' gives backend 'torch''s logits."""
    triton_da = pytest.importorskip("kernels.triton.decode_attention")
    monkeypatch.setattr(triton_da, "decode_attention_fused", lambda *a, **k: pytest.fail("fused kernel ran"))
    try:
        from kernels.cuda import decode_lut
        monkeypatch.setattr(decode_lut, "decode_attention_lut", lambda *a, **k: pytest.fail("fused kernel ran"))
    except ImportError:  # no CuPy: Triton would take the calls
        pass
    lm = tiny_lm("gemma2")
    lm.model.to("cuda", torch.bfloat16)
    runs = [lm.greedy(IDS[:40], 6, CacheConfig(codec="octopus", bits=4, residual=4, backend=b), force="self")
            for b in ("torch", "auto")]
    assert runs[0]["tokens"] == runs[1]["tokens"] and len(runs[0]["tokens"]) == 6
    assert torch.equal(runs[0]["logits"], runs[1]["logits"])


@pytest.mark.parametrize("arch", ["qwen2", "gemma2"])
def test_sliding_models_take_no_padded_batch(arch):
    """A native sliding window counts pad columns (a pad between a sequence's tokens pushes real
    tokens out), so prompts of different lengths on a model with sliding layers are refused with one
    line naming the fix, on every path that pads: teacher forcing, greedy and model.generate (which
    reads the padding from its 2-D mask); a batch of one length still runs, equal to batch 1, and the
    tasks' automatic batch size is 1 for such a model."""
    from harness.tasks.base import Task

    lm = tiny_lm(arch)
    assert lm.sliding_layers == tuple(SLIDING[arch])
    short, long_ = IDS[:30], IDS
    for cfg in (None, OCTOPUS):
        with pytest.raises(ValueError, match="sliding-window layers .* --batch-size 1"):
            lm.teacher_force([long_, short], [[20, 28], [20, 10]], cfg, lambda *a: None)
        with pytest.raises(ValueError, match="sliding-window layers .* --batch-size 1"):
            lm.greedy([long_, short], 3, cfg)
    x = torch.tensor([long_[:12], [V - 1] * 3 + long_[:9]])
    mask = torch.ones_like(x)
    mask[1, :3] = 0
    with attach(lm.model) as new_cache, pytest.raises(ValueError, match="sliding-window layers"):
        lm.model.generate(x, attention_mask=mask, **cache_kwargs(lm.model, new_cache(OCTOPUS)), max_new_tokens=2,
                          do_sample=False)
    one = lm.greedy(IDS[:40], 3, OCTOPUS, force="self")
    both = lm.greedy([IDS[:40], IDS[:40]], 3, OCTOPUS, force="self")
    for r in both:
        assert r["tokens"] == one["tokens"]
        # a batch of two sums in another blocking: ~300 U32 of O(1) logits (tests/adapters/cache/test_padded_batch.py)
        torch.testing.assert_close(r["forced_logits"], one["forced_logits"], rtol=0, atol=2e-5)
    assert Task().prompts_per_batch(lm) == 1 and Task().prompts_per_batch(tiny_lm("llama")) == 8


@pytest.mark.parametrize("arch", ["qwen2", "gemma2"])
@torch.no_grad()
def test_repeat_batch_repeats_sliding_layers_too(arch):
    """A batch-1 compressed cache (full layers compressed, sliding layers native) repeated to 3
    sequences: the next token's logits of each copy equal batch 1's, the sliding layers hold 3
    sequences, and each copy's byte counts are the original's."""
    lm = tiny_lm(arch)
    nxt = torch.tensor([[IDS[5]]])
    _, one = forced(lm, OCTOPUS)
    _, three = forced(lm, OCTOPUS)
    stats = three.kv.stats()
    three.repeat_batch(3)
    assert all(three.kv.stats(b) == stats for b in range(3))
    for i in SLIDING[arch]:
        assert three.layers[i].keys.shape[0] == 3
    with attach(lm.model):  # the compressed attention, as CausalLM runs it
        want = lm.model(nxt, **cache_kwargs(lm.model, one), use_cache=True).logits[0, -1]
        got = lm.model(nxt.expand(3, 1), **cache_kwargs(lm.model, three), use_cache=True).logits[:, -1]
    # a batch of three sums in another blocking: float32 through the tiny model, logits of O(1), ~100 U32
    torch.testing.assert_close(got, want.expand(3, -1), rtol=1e-5, atol=1e-5)
    alone = lm.model(nxt).logits[0, -1]  # the token without its context: what a cache attending nothing gives
    assert not torch.allclose(alone, want, atol=1e-3)  # the context moves logits far beyond any rounding
