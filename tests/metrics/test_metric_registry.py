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
    with pytest.raises(ValueError, match=r"metric 'kl' registered twice: by metrics\.shared and by "
                                         r"(\w+\.)*test_metric_registry$"):
        define_metric("kl", higher_is_better=False)
    with pytest.raises(ValueError, match=r"metric 'lsd' registered twice: by metrics\.audio\.\w+ and by "
                                         r".*test_duplicates_and_unknowns_are_rejected\.<locals>\.<lambda>$"):
        register_metric("lsd", "text", higher_is_better=False)(lambda a, b: 0.0)
    with pytest.raises(ValueError, match="metric 'kl' already has a text implementation"):
        register_metric("kl", "text")(lambda a, b: 0.0)
    with pytest.raises(ValueError, match="metric 'bleu' is not defined"):
        register_metric("bleu", "text")
    with pytest.raises(ValueError, match=r"unknown modality 'image'. Declared \(by the metrics modules\): "
                                         r"audio, probe, text, video"):
        register_metric("kl", "image")
    with pytest.raises(ValueError, match="unknown scale 'ln'. Allowed: linear, log, dB"):
        define_metric("test-ln", higher_is_better=True, scale="ln")
    with pytest.raises(ValueError, match="metric 'lsd' has no 'text' implementation. Available: audio"):
        get_metric("lsd").impl("text")
    assert "test-ln" not in METRICS and "bleu" not in METRICS


def test_every_module_of_the_package_is_discovered():
    """No hand-kept list: every metrics module is imported and registers what it defines."""
    import importlib
    import pkgutil

    import metrics
    from metrics import list_metrics

    mods = [i.name for i in pkgutil.iter_modules(metrics.__path__) if i.name not in ("registry", "shared")]
    assert {"text", "video", "audio", "probe"} <= set(mods)
    registered = {fn.__module__ for m in list_metrics().values() for fn in m.impls.values()}
    for name in mods:
        mod = importlib.import_module(f"metrics.{name}")
        if any(getattr(v, "__module__", None) == mod.__name__ for v in vars(mod).values() if callable(v)):
            assert f"metrics.{name}" in registered, f"metrics.{name} registers nothing"
