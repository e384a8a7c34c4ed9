"""Causal Wan adapters (CausVid, Causal Forcing) on tiny random Wan models with the real key names:
schedule, loading the released formats, block-causal attention against a full-sequence reference,
bit-exact 'none', determinism, and what the compressed cache holds."""
from __future__ import annotations

import re

import pytest
import torch
from helpers.rate_refs import key_bytes, value_bytes
from helpers.tolerances import U32, U64, gamma

from adapters.cache.config import CacheConfig
from adapters.wan import CAUSAL_FORCING, CAUSVID, FlowSchedule, build_random, tiny_spec
from adapters.wan.attention import BlockState, causal_attention
from adapters.wan.build import build_transformer
from adapters.wan.checkpoint import (CheckpointKeyError, load_released_generator, load_t5_original,
                                     wan_layout)
from adapters.loading import random_init_
from adapters.wan.tiny import TINY_TRANSFORMER, TINY_UMT5
from kernels import private_generator


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


@pytest.fixture(scope="module")
def causvid6():
    return build_random(tiny_spec(CAUSVID, num_frames=6), seed=1)  # 2 blocks of 3 latent frames


@pytest.fixture(scope="module")
def forcing3():
    return build_random(tiny_spec(CAUSAL_FORCING, num_frames=3), seed=2)  # 3 blocks of 1 latent frame


def _rollout(model, codec="none", bits=16, seed=0, prompt="a red fox in the snow"):
    cfg = model.cache_config(CacheConfig(codec=codec, bits=bits), window=1)
    cache = model.new_cache(cfg)
    lat = model.rollout(model.encode_prompt(prompt), cache, private_generator("video", prompt, seed))
    return lat, cache


# --- schedule ------------------------------------------------------------------------------------
def test_schedules_by_hand():
    cv = CAUSVID.schedule
    assert cv.timesteps().tolist() == [1000.0, 757.0, 522.0]
    # sigma(t) is the shifted table entry nearest t: t/1000 to half the table's spacing there, which the
    # shift (sigma = 8 s / (1 + 7 s), s in steps of 1/1000) stretches by d sigma / d s = 8 / (1 + 7 s)^2
    s = cv.sigmas()

    def half_spacing(sigma, shift=8.0):
        u = sigma / (shift - (shift - 1) * sigma)  # the table position s of sigma
        return 0.5 * shift / (1 + (shift - 1) * u) ** 2 / 1000

    assert s[0] == 1.0 and abs(s[1] - 0.757) <= half_spacing(0.757) and abs(s[2] - 0.522) <= half_spacing(0.522)
    # warped (Causal Forcing, shift 5): step n -> 1000 * sigma(1 - n/1000) of the shifted table
    def shifted(u, shift=5.0):
        return shift * u / (1 + (shift - 1) * u)
    ts = CAUSAL_FORCING.schedule.timesteps().tolist()
    # the float64 table (linspace's entry, the shift's 4 operations, the product), then float32: what the model sees
    tol = 1000 * (gamma(8, U64) + U32)
    for t, n in zip(ts, (1000, 750, 500, 250)):
        assert t == pytest.approx(1000 * shifted(n / 1000), abs=tol)
    assert ts[1] == pytest.approx(937.5, abs=tol)  # 5 * .75 / (1 + 4 * .75)
    assert ts[3] == pytest.approx(625.0, abs=tol)  # 5 * .25 / (1 + 4 * .25)
    assert CAUSAL_FORCING.schedule.sigmas()[1] == pytest.approx(shifted(0.75), abs=gamma(8, U64))  # the table's


def test_warp_table_exact():
    sched = FlowSchedule(shift=5.0, steps=(1000, 750, 500, 250), warp=True)
    sig, t = sched.table()
    assert len(t) == 1000 and t[0] == 1000.0
    assert torch.equal(sched.timesteps(), t[[0, 250, 500, 750]].float())


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


# --- attention -----------------------------------------------------------------------------------
def test_block_attention_matches_full_sequence_reference(forcing3):
    """Block 1 attending block 0 through the cache (RoPE at frame offset 1) equals diffusers' own
    processor on the two-frame sequence with a block-causal mask and per-token timesteps."""
    from diffusers.models.transformers.transformer_wan import WanAttnProcessor
    m = forcing3
    tr = m.transformer
    C, _, h, w = m.latent_shape
    n = m.tokens_per_frame
    g = torch.Generator().manual_seed(0)
    x0 = torch.randn(1, C, 1, h, w, generator=g)
    x1 = torch.randn(1, C, 1, h, w, generator=g)
    emb = m.encode_prompt("reference")
    t = 750.0
    # ours: commit frame 0 at t=0, then frame 1 at t
    cache = m.new_cache(CacheConfig(codec="none"))
    state = BlockState(cache=cache)
    with causal_attention(tr, state):
        state.rotary, state.commit = m._rotary(0, 1), True
        m._flow(x0, 0.0, emb)
        state.rotary, state.commit = m._rotary(1, 1), False
        ours = m._flow(x1, t, emb)
    assert cache[0].length == n  # the denoising pass stored nothing
    # reference: the full 2-frame sequence, block-causal mask, per-token timesteps
    mask = torch.ones(2 * n, 2 * n, dtype=torch.bool)
    mask[:n, n:] = False
    base = WanAttnProcessor()
    originals = [b.attn1.processor for b in tr.blocks]
    try:
        for b in tr.blocks:
            b.attn1.processor = lambda attn, hs, ehs=None, am=None, rot=None: base(attn, hs, ehs, mask, rot)
        ts = torch.tensor([[0.0] * n + [t] * n])
        full = tr(hidden_states=torch.cat([x0, x1], 2), timestep=ts, encoder_hidden_states=emb, return_dict=False)[0]
    finally:
        for b, p in zip(tr.blocks, originals):
            b.attn1.processor = p
    # a cached block against the whole masked forward: the same float32 sums in other orders and lengths
    # (attention rows of 2n against n + n) through the tiny transformer's blocks, ~10^3 U32 of O(1) latents
    torch.testing.assert_close(ours, full[:, :, 1:2], rtol=1e-4, atol=1e-4)


# --- rollouts ------------------------------------------------------------------------------------
def test_none_is_bit_exact_and_rollouts_deterministic(causvid6):
    a, _ = _rollout(causvid6, "none")
    b, _ = _rollout(causvid6, "none")
    assert torch.equal(a, b)
    c, _ = _rollout(causvid6, "octopus", 2)
    d, _ = _rollout(causvid6, "octopus", 2)
    assert torch.equal(c, d)
    assert not torch.equal(a, c)  # the codec changed what was generated ...
    assert torch.equal(a[:, :, :3], c[:, :, :3])  # ... but not the first block (empty cache)
    e, _ = _rollout(causvid6, "none", seed=1)
    assert not torch.equal(a, e)


@pytest.mark.parametrize("fixture,committed_frames", [("causvid6", 2), ("forcing3", 1)])
def test_cache_holds_compressed_committed_frames(request, fixture, committed_frames):
    """CausVid (6 frames, blocks of 3): block 0 committed, one native frame kept -> 2 frames encoded.
    Causal Forcing (3 frames, blocks of 1): frames 0 and 1 committed, frame 1 native -> 1 encoded."""
    model = request.getfixturevalue(fixture)
    _, cache = _rollout(model, "octopus", 2)
    n = model.tokens_per_frame
    cache.assert_compressed()
    for layer in cache.layers:
        assert layer.committed == committed_frames * n
        assert sum(s.num_tokens for s in layer.key_states) == committed_frames * n  # each token encoded once
        assert layer.window_k.shape[-2] == n  # one native frame
        assert layer.window_k.dtype == torch.float32
    st = cache.stats()
    assert st["committed_tokens"] == committed_frames * n
    layers, heads, d = model.geometry  # bytes per vector from OCTOPUS's documented layout (tests/helpers/rate_refs.py)
    assert st["bits_per_coord"] == 8 * key_bytes("octopus", 2, d) / d
    b = cache.nbytes()
    assert b["compressed"] == layers * heads * committed_frames * n * (key_bytes("octopus", 2, d) + value_bytes(2, d))
    assert b["uncompressed"] == 2 * layers * heads * (committed_frames + 1) * n * d * 4  # float32 K and V


def test_random_prompt_embeddings_and_tiny_geometry():
    m = build_random(tiny_spec(CAUSVID, num_frames=3), text_encoder=False)
    e1, e2 = m.encode_prompt("x"), m.encode_prompt("y")
    assert e1.shape == (1, 32, 32) and not torch.equal(e1, e2)
    assert m.latent_shape == (16, 3, 6, 8) and m.tokens_per_frame == 12
    with pytest.raises(ValueError, match="whole number"):
        tiny_spec(CAUSVID, num_frames=4)
    assert CAUSVID.schedule.shift == 8.0 and CAUSVID.frames_per_block == 3  # a configured constant


def test_gpu_script_tiny_on_cpu(capsys):
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[3] / "scripts" / "gpu_video_rollout.py"
    spec = importlib.util.spec_from_file_location("gpu_video_rollout", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rc = mod.main(["--tiny", "--device", "cpu", "--model", "causal-forcing", "--frames", "3", "--no-decode",
                   "--codecs", "none,octopus@2", "--repeat-baseline"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "bit-identical to the baseline: True" in out
    assert "== octopus@2" in out and "latent cos vs baseline" in out and "peak MiB" in out


def test_prompts_are_cleaned_as_wan_tokenizes_them(causvid6):
    """HTML entities (escaped twice), mojibake and whitespace runs reach the T5 encoder cleaned."""
    from adapters.wan.model import clean_prompt
    dirty = "A red fox &amp;amp; a hare\n\t in the  caf\u00c3\u00a9 garden &lt;at dusk&gt;  "
    clean = "A red fox & a hare in the café garden <at dusk>"
    assert clean_prompt(dirty) == clean
    seen = []
    tok = causvid6.tokenizer
    causvid6.tokenizer = lambda texts, **kw: seen.extend(texts) or tok(texts, **kw)
    try:
        a = causvid6.encode_prompt(dirty)
    finally:
        causvid6.tokenizer = tok
    assert seen == [clean] and torch.equal(a, causvid6.encode_prompt(clean))
