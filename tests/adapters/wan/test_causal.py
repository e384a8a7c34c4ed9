"""Causal Wan adapters (CausVid, Causal Forcing) on tiny random Wan models: schedule, block-causal attention
against a full-sequence reference, bit-exact 'none', determinism, and what the compressed cache holds (loading
the released formats: test_released_checkpoints.py)."""
from __future__ import annotations


import pytest
import torch
from helpers.rate_refs import key_bytes, value_bytes
from helpers.tolerances import U32, U64, gamma

from adapters.cache.config import CacheConfig
from adapters.wan import CAUSAL_FORCING, CAUSVID, FlowSchedule, build_random, tiny_spec
from adapters.wan.attention import BlockState, causal_attention
from kernels import private_generator


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
