"""Loading the released causal Wan formats (CausVid, Causal Forcing generators; Wan's T5 and VAE files) on tiny
random models with the real key names: renames written independently of the code under test, key errors listed,
no code run from a pickle, folder layouts."""
from __future__ import annotations

import re

import pytest
import torch

from adapters.wan.build import build_transformer
from adapters.wan.checkpoint import (CheckpointKeyError, load_released_generator, load_t5_original,
                                     wan_layout)
from adapters.loading import random_init_
from adapters.wan.tiny import TINY_TRANSFORMER, TINY_UMT5


# --- reference renames, written independently of the code under test ----------------------------
_DIFFUSERS_TO_WAN = [  # diffusers WanTransformer3DModel name -> Wan-native name (the released checkpoints)
    (r"^condition_embedder\.time_embedder\.linear_1\.", "time_embedding.0."),
    (r"^condition_embedder\.time_embedder\.linear_2\.", "time_embedding.2."),
    (r"^condition_embedder\.text_embedder\.linear_1\.", "text_embedding.0."),
    (r"^condition_embedder\.text_embedder\.linear_2\.", "text_embedding.2."),
    (r"^condition_embedder\.time_proj\.", "time_projection.1."),
    (r"\.attn1\.to_out\.0\.", ".self_attn.o."), (r"\.attn2\.to_out\.0\.", ".cross_attn.o."),
    (r"\.attn1\.to_([qkv])\.", r".self_attn.\1."), (r"\.attn2\.to_([qkv])\.", r".cross_attn.\1."),
    (r"\.attn1\.norm_", ".self_attn.norm_"), (r"\.attn2\.norm_", ".cross_attn.norm_"),
    (r"^(blocks\.\d+)\.norm2\.", r"\1.norm3."),
    (r"\.ffn\.net\.0\.proj\.", ".ffn.0."), (r"\.ffn\.net\.2\.", ".ffn.2."),
    (r"^(blocks\.\d+)\.scale_shift_table$", r"\1.modulation"),
    (r"^scale_shift_table$", "head.modulation"), (r"^proj_out\.", "head.head."),
]


def to_wan_native(sd: dict) -> dict:
    out = {}
    for k, v in sd.items():
        for pat, rep in _DIFFUSERS_TO_WAN:
            k = re.sub(pat, rep, k)
        out[k] = v
    return out


_UMT5_TO_WAN = [
    (r"^encoder\.block\.(\d+)\.layer\.0\.layer_norm\.", r"blocks.\1.norm1."),
    (r"^encoder\.block\.(\d+)\.layer\.0\.SelfAttention\.relative_attention_bias\.", r"blocks.\1.pos_embedding.embedding."),
    (r"^encoder\.block\.(\d+)\.layer\.0\.SelfAttention\.([qkvo])\.", r"blocks.\1.attn.\2."),
    (r"^encoder\.block\.(\d+)\.layer\.1\.layer_norm\.", r"blocks.\1.norm2."),
    (r"^encoder\.block\.(\d+)\.layer\.1\.DenseReluDense\.wi_0\.", r"blocks.\1.ffn.gate.0."),
    (r"^encoder\.block\.(\d+)\.layer\.1\.DenseReluDense\.wi_1\.", r"blocks.\1.ffn.fc1."),
    (r"^encoder\.block\.(\d+)\.layer\.1\.DenseReluDense\.wo\.", r"blocks.\1.ffn.fc2."),
    (r"^encoder\.final_layer_norm\.", "norm."), (r"^shared\.", "token_embedding."),
]


@pytest.fixture(scope="module")
def tiny_transformer():
    return build_transformer(TINY_TRANSFORMER, "cpu", torch.float32, ("test-wan",))


# --- loading released formats --------------------------------------------------------------------
@pytest.mark.parametrize("fmt,prefix,key", [("causvid", "model.", "generator"),
                                            ("causal-forcing", "model._fsdp_wrapped_module.", "generator_ema")])
def test_load_released_format(tmp_path, tiny_transformer, fmt, prefix, key):
    ref = tiny_transformer.state_dict()
    native = {prefix + k: v.clone() for k, v in to_wan_native(ref).items()}
    assert "model.blocks.0.self_attn.q.weight" in {k.replace("_fsdp_wrapped_module.", "") for k in native}
    ckpt = {key: native, "step": 1}
    if key == "generator_ema":  # EMA weights are preferred; the raw ones must not be read
        ckpt["generator"] = {k: torch.zeros_like(v) for k, v in native.items()}
    torch.save(ckpt, tmp_path / "model.pt")
    target = build_transformer(TINY_TRANSFORMER, "cpu", torch.float32, None)  # meta
    load_released_generator(target, tmp_path, fmt)  # a folder holding model.pt
    got = target.state_dict()
    assert set(got) == set(ref)
    for k in ref:
        assert torch.equal(got[k], ref[k]), k


@pytest.mark.parametrize("fmt,prefix", [("causvid", "model."), ("causal-forcing", "model._fsdp_wrapped_module.")])
def test_load_errors_list_keys(tmp_path, tiny_transformer, fmt, prefix):
    native = {prefix + k: v for k, v in to_wan_native(tiny_transformer.state_dict()).items()}
    missing = dict(native)
    del missing[prefix + "blocks.1.ffn.2.weight"]
    missing[prefix + "blocks.0.extra_gate.weight"] = torch.zeros(1)
    torch.save({"generator": missing}, tmp_path / "bad.pt")
    target = build_transformer(TINY_TRANSFORMER, "cpu", torch.float32, None)
    with pytest.raises(CheckpointKeyError) as e:
        load_released_generator(target, tmp_path / "bad.pt", fmt)
    msg = str(e.value)
    assert "missing keys (1): blocks.1.ffn.net.2.weight" in msg
    assert "unexpected keys (1): blocks.0.extra_gate.weight" in msg
    torch.save({"generator": {"other." + k: v for k, v in native.items()}}, tmp_path / "wrong.pt")
    with pytest.raises(CheckpointKeyError, match="does not start with"):
        load_released_generator(target, tmp_path / "wrong.pt", fmt)
    torch.save({"optimizer": {}}, tmp_path / "nogen.pt")
    with pytest.raises(CheckpointKeyError, match="no 'generator' entry"):
        load_released_generator(target, tmp_path / "nogen.pt", fmt)


@pytest.mark.parametrize("fmt", ["causvid", "causal-forcing"])
def test_hostile_generator_checkpoint_runs_no_code(tmp_path, tiny_transformer, fmt):
    from helpers.hostile import save_hostile
    from adapters.loading import CheckpointError
    marker = tmp_path / "pwned"
    native = {"model." + k: v for k, v in to_wan_native(tiny_transformer.state_dict()).items()}
    f = save_hostile({"generator": native}, tmp_path / "model.pt", marker)
    target = build_transformer(TINY_TRANSFORMER, "cpu", torch.float32, None)
    with pytest.raises(CheckpointError) as e:
        load_released_generator(target, f, fmt)
    assert not marker.exists()
    assert str(f) in str(e.value) and "save_file" in str(e.value) and "\n" not in str(e.value)


def test_converted_safetensors_generator_loads(tmp_path, tiny_transformer):
    from safetensors.torch import save_file
    ref = tiny_transformer.state_dict()
    save_file({"model." + k: v.contiguous() for k, v in to_wan_native(ref).items()}, tmp_path / "model.safetensors")
    target = build_transformer(TINY_TRANSFORMER, "cpu", torch.float32, None)
    load_released_generator(target, tmp_path / "model.safetensors", "causvid")
    assert all(torch.equal(target.state_dict()[k], ref[k]) for k in ref)


def test_hostile_wan_t5_and_vae_files_run_no_code(tmp_path):
    from helpers.hostile import save_hostile
    from adapters.loading import CheckpointError
    from adapters.wan.checkpoint import T5_ORIGINAL_FILE, VAE_ORIGINAL_FILE, load_vae
    marker = tmp_path / "pwned"
    save_hostile({"token_embedding.weight": torch.zeros(2, 2)}, tmp_path / T5_ORIGINAL_FILE, marker)
    with pytest.raises(CheckpointError, match="Wan T5 encoder"):
        load_t5_original(tmp_path / T5_ORIGINAL_FILE)
    save_hostile({"encoder.conv1.weight": torch.zeros(1)}, tmp_path / VAE_ORIGINAL_FILE, marker)
    with pytest.raises(CheckpointError, match="Wan VAE"):
        load_vae(tmp_path, torch.float32)
    assert not marker.exists()


def _touch(root, *rels):
    for rel in rels:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        torch.save({"generator": {}}, root / rel)
    return root


def test_folder_with_several_released_checkpoints_is_an_error(tmp_path):
    """CausVid's snapshot and Causal Forcing's checkpoints/ folder used to load the first glob match."""
    from adapters.loading import CheckpointError
    from adapters.wan.checkpoint import find_generator_file
    snap = _touch(tmp_path / "CausVid", "autoregressive_checkpoint/model.pt", "bidirectional_checkpoint1/model.pt",
                  "bidirectional_checkpoint2/model.pt")
    with pytest.raises(CheckpointError) as e:
        find_generator_file(snap, "causvid")
    msg = str(e.value)
    assert "3 candidate" in msg and "autoregressive_checkpoint/model.pt" in msg and "bidirectional_checkpoint1/model.pt" in msg
    assert "--model-path FILE" in msg and "\n" not in msg
    repo = _touch(tmp_path / "Causal-Forcing", "checkpoints/framewise/causal_forcing.pt",
                  "checkpoints/chunkwise/causal_forcing.pt")
    for root in (repo, repo / "checkpoints"):
        with pytest.raises(CheckpointError, match="2 candidate causal-forcing checkpoints .*chunkwise/causal_forcing.pt"):
            find_generator_file(root, "causal-forcing")
    # one candidate, at the released depth, is found; the file itself always is
    assert find_generator_file(repo / "checkpoints" / "framewise", "causal-forcing").parent.name == "framewise"
    one = _touch(tmp_path / "cf", "checkpoints/framewise/causal_forcing.pt")
    assert find_generator_file(one, "causal-forcing") == one / "checkpoints/framewise/causal_forcing.pt"
    assert find_generator_file(snap / "autoregressive_checkpoint/model.pt", "causvid").parent.name == \
        "autoregressive_checkpoint"


@pytest.mark.parametrize("fmt,rel,what", [
    ("causvid", "bidirectional_checkpoint1/model.pt", "bidirectional"),
    ("causvid", "autoregressive_checkpoint_warp_4step_cfg2/model.pt", "another step count"),
    ("causvid", "checkpoints/framewise/causal_forcing.pt", "--model causal-forcing"),
    ("causal-forcing", "checkpoints/chunkwise/causal_forcing.pt", "chunk-wise"),
    ("causal-forcing", "bidirectional_checkpoint2/model.pt", "bidirectional"),
])
def test_checkpoint_of_another_recipe_is_refused(tmp_path, fmt, rel, what):
    from adapters.loading import CheckpointError
    from adapters.wan.checkpoint import find_generator_file
    _touch(tmp_path, rel)
    with pytest.raises(CheckpointError, match=what) as e:
        find_generator_file(tmp_path / rel, fmt)
    assert str(tmp_path / rel) in str(e.value) and "\n" not in str(e.value)


def test_wan_t5_checkpoint_to_umt5(tmp_path):
    from transformers import UMT5Config, UMT5EncoderModel
    ref = random_init_(UMT5EncoderModel(UMT5Config(**TINY_UMT5)), "t5-test").eval()
    wan = {}
    for k, v in ref.state_dict().items():
        if k == "encoder.embed_tokens.weight":
            continue  # tied to shared.weight; Wan stores it once
        for pat, rep in _UMT5_TO_WAN:
            k = re.sub(pat, rep, k)
        wan[k] = v.clone()
    torch.save(wan, tmp_path / "models_t5_umt5-xxl-enc-bf16.pth")
    enc = load_t5_original(tmp_path / "models_t5_umt5-xxl-enc-bf16.pth")
    ids = torch.tensor([[5, 9, 77, 1, 0, 0]])
    mask = (ids != 0).long()
    a = ref(input_ids=ids, attention_mask=mask).last_hidden_state
    b = enc(input_ids=ids, attention_mask=mask).last_hidden_state
    # same weights; CPU kernels may reorder sums: float32 rounding of the same sums in other orders (U32 of
    # their terms each) through the tiny encoder's layers and norms, ~100 U32 of its O(1) activations
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    wan["blocks.0.ffn.extra.weight"] = torch.zeros(1)
    torch.save(wan, tmp_path / "bad.pth")
    with pytest.raises(CheckpointKeyError, match=r"unexpected keys \(1\): blocks.0.ffn.extra.weight"):
        load_t5_original(tmp_path / "bad.pth")


def test_wan_folder_layout_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="Wan2.1-T2V-1.3B-Diffusers layout"):
        wan_layout(tmp_path)
    for sub in ("tokenizer", "text_encoder", "vae"):
        (tmp_path / sub).mkdir()
    assert wan_layout(tmp_path) == "diffusers"


def test_registry_names():
    from adapters.registry import get_model
    for name in ("causvid", "causal-forcing", "causvid-tiny", "causal-forcing-tiny", "causvid-random",
                 "causal-forcing-random"):
        spec = get_model(name)
        assert spec.modality == "video" and spec.default_task == "video"
    with pytest.raises(ValueError, match="needs its released checkpoint"):
        get_model("causvid").load(None, "cpu", "auto")
    with pytest.raises(ValueError, match="reads no checkpoint"):
        get_model("causvid-tiny").load("/some/model.pt", "cpu", "auto")
