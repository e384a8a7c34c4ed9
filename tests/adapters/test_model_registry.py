"""adapters/registry.py: models are discovered from the package's modules, a name registers once;
adapters/protocol.py: every registered tiny model is a ModelAdapter whose policy sets the window."""
from __future__ import annotations

import sys

import pytest

from adapters import registry
from adapters.cache.config import CacheConfig
from adapters.protocol import CachePolicy, Geometry, ModelAdapter
from registry import Registry


@pytest.fixture
def empty_registry(monkeypatch):
    monkeypatch.setattr(registry, "REGISTRY", Registry("model"))
    return registry


def test_every_adapter_module_is_discovered():
    names = set(registry.list_models())
    assert {"smollm2-135m", "hf", "causvid-tiny", "causal-forcing", "aar-tiny", "aar"} <= names
    assert {registry.get_model(n).modality for n in names} == {"text", "video", "audio"}


def test_discover_imports_a_new_module_without_a_list(tmp_path, monkeypatch, empty_registry):
    pkg = tmp_path / "extra_models_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "toy.py").write_text("from adapters.registry import register_model\n\n"
                                "@register_model('toy-model', modality='text')\n"
                                "def load(path=None, device='auto', dtype='auto'):\n    return None\n")
    (pkg / "_private.py").write_text("raise RuntimeError('modules named _* are not imported')\n")
    (pkg / "needs_missing_dep.py").write_text("import a_package_that_is_not_installed_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(empty_registry, "REGISTRY", Registry("model", "extra_models_pkg"))
    try:
        empty_registry.REGISTRY.discover()
    finally:
        for m in [m for m in sys.modules if m.startswith("extra_models_pkg")]:
            del sys.modules[m]
    assert list(empty_registry.REGISTRY.entries) == ["toy-model"]
    assert "a_package_that_is_not_installed_xyz" in empty_registry.REGISTRY.unavailable["needs_missing_dep"]
    # the registry as discovered above: discovery runs once
    with pytest.raises(ValueError, match=r"Unknown model 'nope'. Available: toy-model; 'needs_missing_dep' is "
                                         r"unavailable: needs 'a_package_that_is_not_installed_xyz'"):
        empty_registry.get_model("nope")


def test_a_duplicate_name_is_rejected(empty_registry):
    @empty_registry.register_model("twice", modality="audio")
    def first(path=None, device="auto", dtype="auto"):
        return None

    with pytest.raises(ValueError, match=r"model 'twice' registered twice: by .*first and by .*second"):
        @empty_registry.register_model("twice", modality="audio")
        def second(path=None, device="auto", dtype="auto"):
            return None

    assert empty_registry.REGISTRY.entries["twice"].load is first


def test_a_model_of_the_probe_or_of_an_undeclared_modality_is_refused(empty_registry):
    from harness.run.config import RunError
    from harness.runner import check_modality

    with pytest.raises(ValueError, match="'probe' measures a codec alone"):
        empty_registry.register_model("prober", modality="probe")
    empty_registry.register_model("nose", modality="smell")(lambda path=None, device="auto", dtype="auto": None)
    # its modality is checked when a run resolves, once every metrics module has declared its own
    with pytest.raises(RunError, match=r"model 'nose' has modality 'smell', which no metrics module declares "
                                       r"\(declared: audio, text, video\)"):
        check_modality(empty_registry.REGISTRY.entries["nose"])


def test_cache_policy_applies_window_and_protection():
    run = CacheConfig(codec="octopus", bits=2, residual=32, protect="boundary-1")
    assert CachePolicy().apply(run) == run  # size None: the run's --residual, --protect
    aar = CachePolicy("append", 1, note="one scale").apply(run)
    assert (aar.residual, aar.residual_unit, aar.protect) == (1, "append", "boundary-1")
    assert CachePolicy("append", 1).apply(aar) == aar  # idempotent
    assert CachePolicy(protect=[0]).apply(run).protect == [0]
    assert CachePolicy.from_json(CachePolicy("token", 7, [1], "x").to_json()) == CachePolicy("token", 7, [1], "x")
    with pytest.raises(ValueError, match=r"unknown window unit 'frame'. Available: token, append"):
        CachePolicy("frame", 1)


@pytest.mark.parametrize("name,modality", [("causvid-tiny", "video"), ("aar-tiny", "audio")])
def test_tiny_models_implement_the_protocol(name, modality):
    model = registry.get_model(name).load(None, "cpu", "float32")
    assert isinstance(model, ModelAdapter) and model.modality == modality and model.name == name
    assert isinstance(model.geometry, Geometry)
    # the network's own shape: one cached layer per transformer block, kv_heads * head_dim key features
    blocks = model.transformer.blocks if modality == "video" else model.aar.blocks
    key_features = (blocks[0].attn1.to_k.weight.shape[0] if modality == "video"
                    else blocks[0].attn.mat_qkv.weight.shape[0] // 3)  # q, k and v stacked
    layers, kv_heads, head_dim = model.geometry
    assert layers == len(blocks) > 0 and kv_heads * head_dim == key_features
    d = model.describe()
    assert d["name"] == name and (d["layers"], d["kv_heads"], d["head_dim"]) == tuple(model.geometry)
    run = CacheConfig(codec="kivi", bits=2, residual=5)
    cfg = model.cache_config(run)
    if modality == "video":  # one latent frame of tokens, whatever --residual says
        assert (cfg.residual, cfg.residual_unit) == (model.tokens_per_frame, "token")
        assert model.cache_config(run, window=2).residual == 2 * model.tokens_per_frame
    else:  # one native scale
        assert (cfg.residual, cfg.residual_unit) == (1, "append")
    assert model.new_cache(run).config == cfg


def test_text_model_keeps_the_runs_window():
    from helpers.tiny_lm import tiny_causal_lm

    lm = tiny_causal_lm("llama")
    assert isinstance(lm, ModelAdapter) and lm.modality == "text" and lm.geometry == Geometry(2, 2, 32)
    run = CacheConfig(codec="kivi", bits=2, residual=5)
    assert lm.cache_config(run) == run and lm.cache_config(run, window=3).residual == 3
