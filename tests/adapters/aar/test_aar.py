"""AAR adapter: release-format loading, the cached rollout against the masked forward, the
compressed cache, determinism. Tiny random configurations made here (no checkpoint, no download)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.rate_refs import key_bytes, value_bytes
from helpers.tolerances import gamma

from adapters.cache.config import CacheConfig
from adapters.aar import (AARConfig, AARTransformer, SAT, SATConfig, SamplingConfig, random_pipeline,
                          released_pipeline, sample_top_k_top_p)
from adapters.aar.checkpoint import read_state_dict
from adapters.aar.conditioning import ClapConditioner, StandInConditioner
from adapters.aar.models import sat_config_from_state
from kernels import private_generator

SCALES = (1, 2, 3, 5, 8)
AAR_CFG = AARConfig(depth=2, width=64, num_heads=2, vocab=32, latent_dim=8, scales=SCALES)
SAT_CFG = SATConfig(dimension=8, latent_dim=8, n_filters=2, lstm=1, codebook_size=32, scales=SCALES,
                    ratios=(4, 2), phi_kernels=(3, 3, 3, 3))


@pytest.fixture(scope="module")
def pipe():
    return random_pipeline(AAR_CFG, SAT_CFG, seed=1, name="test-aar")


@pytest.fixture(scope="module")
def emb():
    x = np.sin(2 * np.pi * 330 * np.arange(24_000) / 48_000).astype(np.float32)
    return StandInConditioner()(x)


def run(pipe, emb, config, seed=0, **kw):
    return pipe.rollout(emb, config, private_generator("test", seed), SamplingConfig(top_k=8, top_p=0.9), **kw)


# --- release layout and loading -------------------------------------------------------------
RELEASE_AAR_KEYS = ["word_embed.weight", "word_embed.bias", "class_emb.fc1.weight", "class_emb.fc2.weight",
                    "uncond_embedding", "pos_start", "pos_1LC", "lvl_embed.weight", "lvl_1L", "attn_bias_for_masking",
                    "blocks.1.attn.mat_qkv.weight", "blocks.1.attn.q_bias", "blocks.1.attn.v_bias",
                    "blocks.1.attn.zero_k_bias", "blocks.1.attn.scale_mul_1H11", "blocks.1.attn.proj.weight",
                    "blocks.1.ffn.fc1.weight", "blocks.1.ffn.fc2.bias", "blocks.1.ada_lin.1.weight",
                    "head_nm.ada_lin.1.weight", "head.weight", "head.bias"]
RELEASE_SAT_KEYS = ["encoder.model.0.conv.conv.weight_g", "encoder.model.0.conv.conv.weight_v",
                    "encoder.model.1.block.1.conv.conv.weight_v", "encoder.model.1.shortcut.conv.conv.bias",
                    "encoder.model.3.conv.conv.weight_g", "encoder.model.7.lstm.weight_ih_l0",
                    "decoder.model.1.lstm.weight_hh_l0", "decoder.model.3.convtr.convtr.weight_g",
                    "decoder.model.4.block.3.conv.conv.weight_v", "quantizer.vq.layers.4._codebook.embed",
                    "quantizer.vq.layers.0._codebook.embed_avg", "quantizer.vq.layers.0._codebook.cluster_size",
                    "quantizer.vq.layers.0._codebook.inited", "quantizer.vq.quant_resi.qresi_ls.3.weight"]


def test_state_dicts_use_the_release_key_names(pipe):
    assert set(RELEASE_AAR_KEYS) <= set(pipe.aar.state_dict())
    assert set(RELEASE_SAT_KEYS) <= set(pipe.sat.state_dict())
    # full-size shapes of the release: 16 heads of 64, 455 tokens, SAT d128 / lat128 (nothing is run)
    with torch.device("meta"):
        sd, sat_sd = AARTransformer(AARConfig()).state_dict(), SAT(SATConfig()).state_dict()
    assert sd["pos_1LC"].shape == (1, 455, 1024) and sd["blocks.15.attn.scale_mul_1H11"].shape == (1, 16, 1, 1)
    assert sd["blocks.0.ada_lin.1.weight"].shape == (6 * 1024, 1024) and sd["class_emb.fc1.weight"].shape == (1024, 512)
    assert sat_sd["quantizer.vq.layers.15._codebook.embed"].shape == (1024, 128)
    assert sat_config_from_state(sat_sd, SATConfig().scales) == SATConfig()


def _save_release(tmp_path, pipe, aar_sd=None, sat_sd=None):
    aar_sd = {f"module.{k}": v for k, v in (aar_sd or pipe.aar.state_dict()).items()}  # DDP prefix
    sat_sd = {f"module.{k}": v for k, v in (sat_sd or pipe.sat.state_dict()).items()}
    torch.save({"model_state_dict": aar_sd, "optimizer_state_dict": {}, "epoch": 7}, tmp_path / "AAR_d2_test.pth")
    torch.save({"generator_state_dict": sat_sd, "epoch": 3}, tmp_path / "SAT_tiny_test.pth")
    return tmp_path


def test_loads_release_format_and_reproduces_the_rollout(tmp_path, pipe, emb):
    loaded = released_pipeline(_save_release(tmp_path, pipe))
    assert loaded.aar.cfg == AAR_CFG  # architecture read back from the weights
    assert sat_config_from_state(loaded.sat.state_dict(), SCALES) == SAT_CFG
    for a, b in ((pipe.aar, loaded.aar), (pipe.sat, loaded.sat)):
        for (k, v), (k2, v2) in zip(a.state_dict().items(), b.state_dict().items()):
            assert k == k2 and torch.equal(v, v2), k
    r1, r2 = run(pipe, emb, CacheConfig("none")), run(loaded, emb, CacheConfig("none"))
    assert torch.equal(r1.audio, r2.audio) and all(torch.equal(a, b) for a, b in zip(r1.tokens, r2.tokens))
    assert "STAND-IN" in loaded.conditioning_label  # no CLAP folder given


def test_hostile_release_file_runs_no_code(tmp_path, pipe):
    """The loader used to fall back to an unsafe load exactly when the safe one refused a file."""
    from helpers.hostile import save_hostile
    from adapters.loading import CheckpointError
    marker = tmp_path / "pwned"
    _save_release(tmp_path, pipe)
    f = save_hostile({"model_state_dict": dict(pipe.aar.state_dict())}, tmp_path / "AAR_d2_test.pth", marker)
    with pytest.raises(CheckpointError) as e:
        released_pipeline(tmp_path)
    assert not marker.exists()
    assert str(f) in str(e.value) and "['model_state_dict']" in str(e.value) and "\n" not in str(e.value)


def test_release_training_args_and_converted_safetensors_load(tmp_path, pipe):
    import argparse
    from safetensors.torch import save_file
    _save_release(tmp_path, pipe)
    ckpt = torch.load(tmp_path / "AAR_d2_test.pth", weights_only=True)
    torch.save({**ckpt, "args": argparse.Namespace(depth=2, lr=1e-4)}, tmp_path / "AAR_d2_test.pth")
    assert released_pipeline(tmp_path).aar.cfg == AAR_CFG  # the release's pickled Namespace is allowed
    (tmp_path / "AAR_d2_test.pth").unlink()
    save_file({k: v.contiguous() for k, v in pipe.aar.state_dict().items()}, tmp_path / "AAR_d2_test.safetensors")
    path = f"aar={tmp_path / 'AAR_d2_test.safetensors'},sat={tmp_path / 'SAT_tiny_test.pth'}"
    assert released_pipeline(path).aar.cfg == AAR_CFG


def test_load_errors_list_missing_unexpected_and_misshaped_keys(tmp_path, pipe):
    sd = dict(pipe.aar.state_dict())
    del sd["blocks.1.attn.q_bias"], sd["head.bias"]
    sd["blocks.1.attn.bogus"] = torch.zeros(3)
    sd["blocks.0.ffn.fc1.bias"] = torch.zeros(7)
    with pytest.raises(ValueError) as e:
        released_pipeline(_save_release(tmp_path, pipe, aar_sd=sd))
    msg = str(e.value)
    for key in ("blocks.1.attn.q_bias", "head.bias", "blocks.1.attn.bogus", "blocks.0.ffn.fc1.bias"):
        assert key in msg
    assert "missing keys (2)" in msg and "unexpected keys (1)" in msg and "shape mismatches (1)" in msg
    sat = dict(pipe.sat.state_dict())
    sat.pop("quantizer.vq.layers.0._codebook.cluster_size")
    with pytest.raises(ValueError, match=r"quantizer\.vq\.layers\.0\._codebook\.cluster_size"):
        released_pipeline(_save_release(tmp_path, pipe, sat_sd=sat))
    with pytest.raises(KeyError, match="generator_state_dict"):
        read_state_dict({"model_state_dict": {}}, "generator_state_dict")


def test_parametrized_weight_norm_names_are_accepted(pipe):
    sd = {k.replace(".weight_g", ".parametrizations.weight.original0").replace(".weight_v", ".parametrizations.weight.original1"): v
          for k, v in pipe.sat.state_dict().items()}
    normalized = read_state_dict({"generator_state_dict": sd}, "generator_state_dict")
    assert set(normalized) == set(pipe.sat.state_dict())


def test_weight_norm_convolutions_match_torch():
    from adapters.aar.seanet import WNConv1d

    g = torch.Generator().manual_seed(0)
    conv = WNConv1d(3, 5, 4, stride=2)
    with torch.no_grad():
        conv.weight_g.mul_(torch.rand(5, 1, 1, generator=g) + 0.5)
    ref = torch.nn.utils.parametrizations.weight_norm(torch.nn.Conv1d(3, 5, 4, stride=2))
    with torch.no_grad():
        ref.parametrizations.weight.original0.copy_(conv.weight_g)
        ref.parametrizations.weight.original1.copy_(conv.weight_v)
        ref.bias.copy_(torch.randn(5, generator=g))
        conv.bias.copy_(ref.bias)
    x = torch.randn(2, 3, 17, generator=g)
    # each weight g v / ||v|| (a 12-term norm, its root, a division and a product: within gamma(16) of exact on
    # either side), then a 12-term convolution sum and the bias: within gamma(16 + 13) of the magnitudes' sum
    w = ref.weight.detach()
    bound = gamma(2 * 16 + 13) * (torch.nn.functional.conv1d(x.abs(), w.abs(), stride=2) + ref.bias.abs()[:, None])
    assert bool(((conv(x) - ref(x)).abs() <= bound.detach()).all())


def test_tokenizer_shapes_and_codes_round_trip(pipe):
    sat = pipe.sat
    audio = torch.randn(1, 1, SCALES[-1] * SAT_CFG.hop, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        codes = sat.audio_to_codes(audio)
        assert [c.shape[1] for c in codes] == list(SCALES)
        f_hat = sat.vq.codes_to_fhat(codes)
        f_ar = torch.zeros_like(f_hat)
        for si, c in enumerate(codes):  # the AR path builds the same latents scale by scale
            f_ar, _ = sat.vq.next_input(si, f_ar, sat.vq.layers[si].lookup(c))
        assert torch.equal(f_ar, f_hat)  # the same scales' contributions, added in the same order
        assert sat.fhat_to_audio(f_hat).shape == audio.shape


# --- the cached rollout ----------------------------------------------------------------------
def test_cached_rollout_matches_the_block_causal_forward(pipe, emb):
    r = run(pipe, emb, CacheConfig("none"))
    ref = pipe.masked_forward_logits(emb, r.tokens, SamplingConfig(top_k=8, top_p=0.9))
    for a, b in zip(r.logits, ref):  # whole forwards: the cached rollout's attention rows are shorter than the
        # masked forward's (other float32 sums, U32 of their terms each), through the tiny model's 2 blocks to
        # logits of O(1): ~100 U32
        torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-5)


def test_codec_none_reproduces_the_baseline_bit_for_bit(pipe, emb):
    base = run(pipe, emb, CacheConfig("none"))
    for cfg in (CacheConfig("none"), CacheConfig("none", residual=0, residual_unit="token")):
        r = run(pipe, emb, cfg)
        assert torch.equal(r.audio, base.audio) and torch.equal(r.f_hat, base.f_hat)
        assert all(torch.equal(a, b) for a, b in zip(r.logits, base.logits))
    tf = pipe.rollout(emb, CacheConfig("none"), teacher=base.tokens)
    assert all(torch.equal(a, b) for a, b in zip(tf.logits, base.logits))


@pytest.mark.parametrize("codec,bits", [("octopus", 2), ("turboquant-mse", 3)])
def test_compressed_rollout_is_deterministic_and_holds_codec_bytes(pipe, emb, codec, bits):
    cfg = CacheConfig(codec, bits)
    r1, r2 = run(pipe, emb, cfg), run(pipe, emb, cfg)
    assert torch.equal(r1.audio, r2.audio) and all(torch.equal(a, b) for a, b in zip(r1.tokens, r2.tokens))
    assert not all(torch.equal(a, b) for a, b in zip(r1.tokens, run(pipe, emb, cfg, seed=1).tokens))
    b, st, c = r1.cache.nbytes(), r1.cache.stats(), AAR_CFG
    rows, per_token = 2 * 1, c.num_heads * c.head_dim * 4  # 2B rows (guidance), float32 cache
    # every scale but the last is committed to the codec; the last one is the native window
    assert st["committed_tokens"] == sum(SCALES) - SCALES[-1] and st["cache_bytes"] == b["total"]
    d = c.width // c.num_heads  # bytes per vector from the codec's documented layout (tests/helpers/rate_refs.py)
    assert st["bits_per_coord"] == 8 * key_bytes(codec, bits, d) / d
    assert st["value_bits_per_coord"] == 8 * value_bytes(bits, d) / d
    assert b["window"] == c.depth * 2 * rows * SCALES[-1] * per_token
    committed = c.depth * rows * c.num_heads * st["committed_tokens"]  # vectors of keys (and of values)
    assert b["native_layers"] == 0
    assert b["compressed"] == committed * (key_bytes(codec, bits, d) + value_bytes(bits, d))
    assert b["uncompressed"] == c.depth * 2 * rows * sum(SCALES) * per_token
    assert r1.cache.config.residual == 1 and r1.cache.config.residual_unit == "append"
    assert r1.cache.config.value_group == CacheConfig().value_group and r1.cache.config.protect == "none"


def test_cached_keys_are_the_l2_normalised_ones(pipe):
    class Spy:
        def append(self, k, v):
            self.k = k

        def attend(self, q, scale=None):
            assert scale == 1.0
            return torch.zeros_like(q)

    attn, spy = pipe.aar.blocks[0].attn, Spy()
    attn(torch.randn(2, 5, AAR_CFG.width, generator=torch.Generator().manual_seed(0)) * 3, spy)
    d = AAR_CFG.width // AAR_CFG.num_heads  # F.normalize's d-term norm, root and division; this check's own norm
    torch.testing.assert_close(spy.k.norm(dim=-1), torch.ones(2, AAR_CFG.num_heads, 5), rtol=0, atol=2 * gamma(d + 2))


def test_guidance_ramp(pipe, emb):
    """Scale 0 samples from the conditional logits alone; the last scale uses (1 + cfg) c - cfg u."""
    r = run(pipe, emb, CacheConfig("none"))
    s = SamplingConfig(cfg=0.0)
    r0 = pipe.rollout(emb, CacheConfig("none"), sampling=s, teacher=r.tokens)
    assert torch.equal(r.logits[0], r0.logits[0])  # (1 + 0) c - 0 u = c exactly at scale 0
    assert not torch.allclose(r.logits[-1], r0.logits[-1])  # cfg (c - u) at the last scale: far beyond rounding


def test_top_k_top_p_sampling():
    g = private_generator("sampling-test")
    logits = torch.tensor([[[0.0, 3.0, 1.0, 2.9]]]).repeat(1, 200, 1)
    assert set(sample_top_k_top_p(logits, 1, 0.0, g).unique().tolist()) == {1}
    assert set(sample_top_k_top_p(logits, 2, 0.0, g).unique().tolist()) == {1, 3}
    assert set(sample_top_k_top_p(logits, 0, 0.01, g).unique().tolist()) == {1}
    p = torch.softmax(torch.tensor([0.0, 3.0, 1.0, 2.9]), 0)  # the smallest top set reaching top_p stays
    assert p[1] + p[3] > 0.9 and p[1] + p[3] < 0.95 < p[1] + p[3] + p[2]
    assert set(sample_top_k_top_p(logits, 0, 0.9, g).unique().tolist()) == {1, 3}
    assert set(sample_top_k_top_p(logits, 0, 0.95, g).unique().tolist()) == {1, 2, 3}


# --- conditioning ----------------------------------------------------------------------------
def test_stand_in_conditioning_is_deterministic_and_clip_dependent():
    t = np.arange(48_000) / 48_000
    a, b = np.sin(2 * np.pi * 220 * t), np.sin(2 * np.pi * 3000 * t)
    e1, e2 = StandInConditioner()(a), StandInConditioner()(a)
    # an L2-normalised 512-d vector: its norm's sum, root and division, and this check's own norm
    assert e1.shape == (1, 512) and torch.equal(e1, e2) and abs(float(e1.norm()) - 1) <= 2 * gamma(512 + 2)
    assert float((e1 * StandInConditioner()(b)).sum()) < 0.99


def test_clap_conditioner_from_a_local_folder(tmp_path):
    from transformers import ClapConfig, ClapFeatureExtractor, ClapModel

    cfg = ClapConfig(text_config=dict(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                      intermediate_size=32, max_position_embeddings=40),
                     audio_config=dict(depths=[1, 1, 1, 1], num_attention_heads=[1, 1, 1, 1], hidden_size=64,
                                       patch_embeds_hidden_size=8, num_hidden_layers=4), projection_dim=512)
    torch.manual_seed(0)
    ClapModel(cfg).save_pretrained(tmp_path)
    ClapFeatureExtractor(truncation="rand_trunc", padding="repeatpad").save_pretrained(tmp_path)  # larger_clap_general's
    clap = ClapConditioner(tmp_path)
    x = np.sin(2 * np.pi * 440 * np.arange(48_000) / 48_000).astype(np.float32)
    e = clap(x)
    # L2-normalised 512-d, as above
    assert e.shape == (1, 512) and abs(float(e.norm()) - 1) <= 2 * gamma(512 + 2) and torch.equal(e, clap(x))
    assert "CLAP" in clap.label


def test_gpu_script_runs_tiny_on_the_cpu(tmp_path, capsys):
    import importlib.util
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[3] / "scripts" / "gpu_audio_rollout.py"
    spec = importlib.util.spec_from_file_location("gpu_audio_rollout", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rows = mod.main(["--tiny", "--scales", "1,2,4", "--codecs", "octopus@2,nosuch@2", "--json", str(tmp_path / "r.json")])
    out = capsys.readouterr().out
    assert "skipping nosuch@2" in out and "STAND-IN" in out
    assert [r["cache"] for r in rows] == ["none", "octopus@2"]
    assert rows[0]["snr_db"] == float("inf") and rows[0]["kl"] == 0.0
    assert rows[1]["cache_mib"] < rows[1]["uncompressed_mib"]
    assert json.loads((tmp_path / "r.json").read_text())["rows"][1]["cache"] == "octopus@2"


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_float32_by_default_on_every_device(monkeypatch, device):
    """The release's inference runs in float32; 'auto' used to pick bfloat16 on CUDA."""
    import adapters.aar as aar
    from adapters.registry import get_model
    monkeypatch.setattr(aar, "random_pipeline", lambda a, s, seed, dev, dtype, name: (dev, dtype))
    for name in ("aar-tiny", "aar-random"):
        assert get_model(name).load(None, device, "auto") == (torch.device(device), torch.float32)
        assert get_model(name).load(None, device, "bfloat16") == (torch.device(device), torch.bfloat16)


def test_a_batch_of_clips_rolls_out_each_clip_as_alone(pipe):
    """Three clips in one rollout, one generator each: each clip's tokens those it draws alone, its logits,
    latents and audio to float rounding (a matmul over three clips' rows sums as over one, in other blockings);
    teacher-forced too; one generator per clip or it is refused."""
    embs = [StandInConditioner()(np.sin(2 * np.pi * f * np.arange(24_000) / 48_000).astype(np.float32))
            for f in (220, 330, 440)]
    s = SamplingConfig(top_k=8, top_p=0.9)
    for cfg in (CacheConfig("none"), CacheConfig("octopus", 2)):
        alone = [pipe.rollout(e, cfg, private_generator("test", i), s) for i, e in enumerate(embs)]
        batch = pipe.rollout(torch.cat(embs), cfg, [private_generator("test", i) for i in range(3)], s)
        teacher = [torch.cat(t) for t in zip(*(a.tokens for a in alone))]
        forced = pipe.rollout(torch.cat(embs), cfg, sampling=s, teacher=teacher)
        for b, a in enumerate(alone):
            got = batch.clip(b)
            assert got.cache is None and all(torch.equal(x, y) for x, y in zip(got.tokens, a.tokens))
            for x, y in zip(got.logits + forced.clip(b).logits, a.logits + a.logits):
                # as test_cached_rollout_matches_the_block_causal_forward: ~100 U32 on logits of O(1)
                torch.testing.assert_close(x, y, atol=2e-5, rtol=1e-5)
            torch.testing.assert_close(got.audio, a.audio, atol=2e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="2 generators for a batch of 3 clips: one per clip"):
        pipe.rollout(torch.cat(embs), CacheConfig("none"), [private_generator("test", i) for i in range(2)], s)
