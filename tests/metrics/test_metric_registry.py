"""metrics/registry.py: one name per quantity across modalities, each with its direction, scale
and display name; duplicates and unknown names are one-line errors."""
from __future__ import annotations

import pytest

from metrics import METRICS, define_metric, get_metric, list_metrics, register_metric
from metrics.registry import SCALES


def test_shared_quantities_have_one_name_across_modalities():
    assert set(get_metric("kl").modalities) == {"text", "audio"}
    assert set(get_metric("top1_agree").modalities) == {"text", "audio"}
    assert set(get_metric("latent_cos").modalities) == {"video", "audio"}
    for old in ("tf_kl", "tf_token_agreement", "latent_cosine"):
        assert old not in list_metrics()


def test_every_metric_has_direction_scale_display_and_an_implementation():
    for name, m in list_metrics().items():
        assert m.higher_is_better in (True, False, None), name
        assert m.scale in SCALES and m.display and m.impls, name
    assert get_metric("perplexity").scale == "log" and get_metric("psnr").scale == "dB"
    assert get_metric("kl").display == "KL (nats)"


def test_duplicates_and_unknowns_are_rejected():
    list_metrics()
    with pytest.raises(ValueError, match="metric 'kl' is already defined"):
        define_metric("kl", higher_is_better=False)
    with pytest.raises(ValueError, match="metric 'kl' already has a text implementation"):
        register_metric("kl", "text")(lambda a, b: 0.0)
    with pytest.raises(ValueError, match="metric 'bleu' is not defined"):
        register_metric("bleu", "text")
    with pytest.raises(ValueError, match="unknown modality 'image'. Allowed: text, video, audio, probe"):
        register_metric("kl", "image")
    with pytest.raises(ValueError, match="unknown scale 'ln'. Allowed: linear, log, dB"):
        define_metric("test-ln", higher_is_better=True, scale="ln")
    with pytest.raises(ValueError, match="metric 'lsd' has no 'text' implementation. Available: audio"):
        get_metric("lsd").impl("text")
    assert "test-ln" not in METRICS and "bleu" not in METRICS
