"""Every registered codec, at one bit width, once through each modality's adapter on its tiny model:
text (tiny random Qwen2 and Llama), video (``causvid-tiny``), audio (``aar-tiny``). The cache must
really have compressed (key bits per coordinate below the native float32 width, checked with the
same function that fills the report rows), and the outputs are compared with the uncompressed run's:
what reads no compressed token (the prefill, the first video block, the first audio scale) is
bit-identical; what reads them moves, by more than float rounding and by much less than losing that
context does (tests/helpers/output_checks.py). An engine that attends the tokens in flight as it stores them
(llama.cpp, ExLlamaV3, LMDeploy) moves the first chunk too, by as little; a codec that refuses the tiny models'
head dim (32: ExLlamaV2's groups of 64, mlx's of 64 and 128) is skipped with its reason."""
from __future__ import annotations

import pytest
import torch
from helpers.output_checks import assert_moved_less_than_lost, kl
from helpers.tiny_lm import tiny_causal_lm

from adapters.cache.stats import cache_row_stats
from adapters.cache.config import CacheConfig
from adapters.registry import get_model
from kernels import codec_class, list_codecs, make_codec, private_generator

NATIVE_BITS = 32.0  # the tiny models run in float32
#: 'none' is the uncompressed baseline: nothing to compress
CODECS = [c for c in list_codecs() if c != "none"]


def _bits(codec: str) -> int:
    """The smallest of 2..4 the codec supports, else its smallest (an engine's 8-bit preset)."""
    supported = list_codecs()[codec]
    return min((b for b in supported if 2 <= b <= 4), default=min(supported))


#: a codec's options here: TensorRT-LLM's int8 cache takes a calibrated per-layer scale (ModelOpt's amax / 127); the
#: tiny models' keys and values stay within 127 / 32
OPTIONS = {"trtllm-int8": {"kv_scale": 1 / 32}}


def _config(codec: str, residual: int = 8) -> CacheConfig:
    return CacheConfig(codec=codec, bits=_bits(codec), residual=residual, options=OPTIONS.get(codec, {}))


def _runs_on(codec: str, model) -> None:
    """Skip a codec that refuses the model's head dim, with its reason."""
    why = codec_class(codec).head_dim_unsupported(model.geometry[2])
    if why is not None:
        pytest.skip(why)


def _first_native(codec: str) -> bool:
    """Whether the first chunk (block, scale) is attended natively: not by an engine that stores tokens first."""
    return not make_codec(codec, _bits(codec), 32, **OPTIONS.get(codec, {})).stores_before_attending(0)


def _check_compressed(cache) -> None:
    s = cache_row_stats(cache)
    assert 0 < s["bits_per_coord"] < NATIVE_BITS and s["cache_bytes"] < s["uncompressed_bytes"], s


TEXT_CHUNKS = [16, 8, 8, 8, 8, 8]  # 56 tokens: kivi (blocks of 32) has 32 committed when the last chunk reads


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def lm(request):
    return tiny_causal_lm(request.param)


@pytest.fixture(scope="module")
def text_ids():
    return torch.randint(0, 256, (sum(TEXT_CHUNKS),), generator=private_generator("every-codec-text")).tolist()


def _teacher_forced(lm, ids, config):
    logits = []
    cache = lm.teacher_force(ids, TEXT_CHUNKS, config, lambda start, lg: logits.append(lg))
    return torch.cat(logits), cache


@pytest.fixture(scope="module")
def text_refs(lm, text_ids):
    """(uncompressed logits, uncompressed logits with the first 8 tokens, compressed from the first chunk on,
    replaced by others)."""
    other = torch.randint(0, 256, (8,), generator=private_generator("every-codec-text-other")).tolist()
    return _teacher_forced(lm, text_ids, None)[0], _teacher_forced(lm, other + text_ids[8:], None)[0]


@pytest.fixture(scope="module")
def video():
    return get_model("causvid-tiny").load(None, "cpu", "float32")


@pytest.fixture(scope="module")
def video_refs(video):
    """(uncompressed latents for 'a red fox', uncompressed latents for another prompt, same noise)."""
    def native(prompt):
        return video.rollout(video.encode_prompt(prompt), video.new_cache(CacheConfig()),
                             private_generator("every-codec-video"))
    return native("a red fox"), native("a blue whale")


@pytest.fixture(scope="module")
def audio():
    return get_model("aar-tiny").load(None, "cpu", "float32")


@pytest.fixture(scope="module")
def audio_refs(audio):
    """(conditioning, the uncompressed free-running rollout, its tokens teacher-forced under other conditioning)."""
    emb = torch.randn(1, audio.aar.cfg.cond_in, generator=private_generator("every-codec-audio"))
    native = audio.rollout(emb, CacheConfig(), private_generator("every-codec-audio-sampling"))
    other = torch.randn(1, audio.aar.cfg.cond_in, generator=private_generator("every-codec-audio-other"))
    return emb, native, audio.rollout(other, CacheConfig(), teacher=native.tokens)


@pytest.mark.parametrize("codec", CODECS)
def test_text(lm, text_ids, text_refs, codec):
    _runs_on(codec, lm)
    logits, cache = _teacher_forced(lm, text_ids, _config(codec))
    _check_compressed(cache.kv)
    native, other = text_refs
    p = TEXT_CHUNKS[0] if _first_native(codec) else 0
    assert torch.equal(logits[:p], native[:p])  # the prefill attends natively, unless the engine stores it first
    assert_moved_less_than_lost(kl(native[p:], logits[p:]), kl(native[p:], other[p:]))


@pytest.mark.parametrize("codec", CODECS)
def test_video(video, video_refs, codec):
    _runs_on(codec, video)
    cache = video.new_cache(_config(codec))
    latents = video.rollout(video.encode_prompt("a red fox"), cache, private_generator("every-codec-video"))
    _check_compressed(cache)
    native, other = video_refs
    f = video.spec.frames_per_block if _first_native(codec) else 0
    assert torch.equal(latents[:, :, :f], native[:, :, :f])  # block 0 attends to an empty cache
    assert_moved_less_than_lost(float((latents - native)[:, :, f:].norm()), float((other - native)[:, :, f:].norm()),
                                quadratic=False)


@pytest.mark.parametrize("codec", CODECS)
def test_audio(audio, audio_refs, codec):
    _runs_on(codec, audio)
    emb, native, other = audio_refs
    r = audio.rollout(emb, _config(codec), private_generator("every-codec-audio-sampling"))
    assert torch.isfinite(r.audio).all()
    _check_compressed(r.cache)
    if _first_native(codec):
        assert torch.equal(r.logits[0], native.logits[0])  # scale 0 reads only its own (native) tokens
    # the baseline's tokens teacher-forced through the compressed cache: every later scale reads it
    tf = audio.rollout(emb, _config(codec), teacher=native.tokens)
    start = 1 if _first_native(codec) else 0
    flat = lambda logits: torch.cat([lg.reshape(-1, lg.shape[-1]) for lg in logits[start:]])  # noqa: E731
    assert_moved_less_than_lost(kl(flat(native.logits), flat(tf.logits)), kl(flat(native.logits), flat(other.logits)))
