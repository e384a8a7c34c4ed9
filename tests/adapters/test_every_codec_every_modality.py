"""Every registered codec, at one bit width, once through each modality's adapter on its tiny model:
text (tiny random Qwen2 and Llama), video (``causvid-tiny``), audio (``aar-tiny``). The outputs
must be finite and the cache must really have compressed (key bits per coordinate below the
native float32 width, checked with the same function that fills the report rows)."""
from __future__ import annotations

import pytest
import torch
from tiny_lm import tiny_causal_lm

from adapters.cache_stats import cache_row_stats
from adapters.kv_cache import CacheConfig
from adapters.registry import get_model
from kernels import list_codecs, private_generator

NATIVE_BITS = 32.0  # the tiny models run in float32
#: 'none' is the uncompressed baseline: nothing to compress
CODECS = [c for c in list_codecs() if c != "none"]


def _bits(codec: str) -> int:
    """The smallest of 2..4 the codec supports."""
    return min(b for b in list_codecs()[codec] if 2 <= b <= 4)


def _config(codec: str, residual: int = 8) -> CacheConfig:
    return CacheConfig(codec=codec, bits=_bits(codec), residual=residual)


def _check_compressed(cache) -> None:
    s = cache_row_stats(cache)
    assert 0 < s["bits_per_coord"] < NATIVE_BITS and s["cache_bytes"] < s["uncompressed_bytes"], s


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def lm(request):
    return tiny_causal_lm(request.param)


@pytest.fixture(scope="module")
def video():
    return get_model("causvid-tiny").load(None, "cpu", "float32")


@pytest.fixture(scope="module")
def audio():
    return get_model("aar-tiny").load(None, "cpu", "float32")


@pytest.mark.parametrize("codec", CODECS)
def test_text(lm, codec):
    ids = torch.randint(0, 256, (40,), generator=private_generator("every-codec-text")).tolist()
    logits = []
    cache = lm.teacher_force(ids, [16, 8, 8, 8], _config(codec), lambda start, lg: logits.append(lg))
    assert torch.isfinite(torch.cat(logits)).all()
    _check_compressed(cache.kv)


@pytest.mark.parametrize("codec", CODECS)
def test_video(video, codec):
    cache = video.new_cache(_config(codec))
    latents = video.rollout(video.encode_prompt("a red fox"), cache, private_generator("every-codec-video"))
    assert torch.isfinite(latents).all()
    _check_compressed(cache)


@pytest.mark.parametrize("codec", CODECS)
def test_audio(audio, codec):
    emb = torch.randn(1, audio.aar.cfg.cond_in, generator=private_generator("every-codec-audio"))
    r = audio.rollout(emb, _config(codec), private_generator("every-codec-audio-sampling"))
    assert torch.isfinite(r.audio).all() and all(torch.isfinite(lg).all() for lg in r.logits)
    _check_compressed(r.cache)
