"""The audio task end to end on a tiny random AAR, with clips made here (no Sonic Pi needed)."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import soundfile as sf
import torch
from scipy.special import log_softmax
from helpers.tolerances import U64, logsoftmax_abs, sum_rel

from adapters.cache.config import CacheConfig
from adapters.aar import AARConfig, SATConfig, random_pipeline
from harness.tasks.audio import AudioTask, synthetic_clips
from harness.tasks.base import TASKS, Prompt

SCALES = (1, 2, 4, 8)


@pytest.fixture(scope="module")
def model():
    return random_pipeline(AARConfig(depth=2, width=64, num_heads=2, vocab=32, latent_dim=8, scales=SCALES),
                           SATConfig(dimension=8, latent_dim=8, n_filters=2, lstm=1, codebook_size=32, scales=SCALES),
                           seed=0, name="test-aar")


@pytest.fixture(scope="module")
def task():
    return AudioTask(clip_seconds=1.0, top_k=8)


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("clips")
    t = np.arange(44_100) / 44_100
    sf.write(d / "b_sine.wav", (0.4 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), 44_100)
    noise = np.random.default_rng(0).standard_normal(22_050).astype(np.float32) * 0.1
    sf.write(d / "a_noise.flac", noise, 22_050)
    (d / "notes.txt").write_text("not audio")
    return d


def test_registered():
    assert TASKS["audio"] is AudioTask and AudioTask.modality == "audio"


def test_prompts_from_a_folder_synthetic_and_missing_manifest(task, clip_dir, tmp_path):
    ps = task.prompts(str(clip_dir))
    assert [p.id for p in ps] == ["a_noise", "b_sine"]
    assert [p.id for p in task.prompts("synthetic", limit=2)] == ["synth_tone", "synth_chirp"]
    manifest = tmp_path / "clips.json"
    manifest.write_text(json.dumps({"source_dir": str(tmp_path / "nowhere"), "install": "apt-get install x",
                                    "clips": [{"id": "a", "file": "a.flac"}]}))
    with pytest.raises(FileNotFoundError, match="apt-get install x"):
        task.prompts(str(manifest))


def test_default_manifest_names_sonic_pi_clips():
    from harness.tasks.audio import PROMPTS_DIR

    spec = json.loads((PROMPTS_DIR / "clips.json").read_text())
    assert spec["source_dir"] == "/usr/share/sonic-pi/samples" and spec["license"] == "CC0-1.0"
    assert len({c["id"] for c in spec["clips"]}) == len(spec["clips"]) >= 4


def test_synthetic_clips_are_deterministic():
    a, b = synthetic_clips(1.0), synthetic_clips(1.0)
    assert all(np.array_equal(a[k], b[k]) for k in a)


def test_baseline_is_deterministic(model, task, clip_dir):
    p = task.prompts(str(clip_dir))[1]
    b1, b2 = task.baseline(model, p, seed=0), task.baseline(model, p, seed=0)
    assert torch.equal(b1.rollout.audio, b2.rollout.audio) and torch.equal(b1.emb, b2.emb)
    b3 = task.baseline(model, p, seed=1)
    assert not all(torch.equal(a, b) for a, b in zip(b1.rollout.tokens, b3.rollout.tokens))


def test_evaluate_none_and_a_codec(model, task, tmp_path):
    p = Prompt("tone", synthetic_clips(1.0)["synth_tone"])
    base = task.baseline(model, p, seed=0)
    row = task.evaluate(model, p, CacheConfig("none"), 0, base, tmp_path)
    assert row["snr_db"] == math.inf and row["lsd"] == 0.0 and row["log_mel_mse"] == 0.0
    # a float64 cosine of a vector with itself: a few roundings of sums (~1e-16 each), far below approx's default
    assert row["kl"] == 0.0 and row["top1_agree"] == 1.0 and row["latent_cos"] == pytest.approx(1.0)
    assert row["cache_bytes"] == row["uncompressed_bytes"] and row["bits_per_coord"] == 32.0
    row2 = task.evaluate(model, p, CacheConfig("octopus", 2), 0, base, tmp_path)
    assert row2["cache_bytes"] < row2["uncompressed_bytes"] and 2 < row2["bits_per_coord"] < 5
    # the free-running rollout timed: scale 0 (into the empty cache) the prefill, the later scales the decode
    speed = row2["speed"]
    assert speed["decode_units"] == sum(SCALES[1:]) and speed["prefill_s"] > 0 and speed["decode_per_s"] > 0
    assert speed["sequences"] == 1 and speed["peak_bytes"] is None
    # reference: the baseline's tokens teacher-forced through the compressed cache, its guided logits against
    # the baseline's, pooled over every position of the pyramid, in float64 numpy (scipy's log-softmax)
    tf = model.rollout(base.emb, CacheConfig("octopus", 2), sampling=task.sampling, teacher=base.rollout.tokens)
    lp, lq = (log_softmax(np.concatenate([t.reshape(-1, t.shape[-1]).double().numpy() for t in logits]), -1)
              for logits in (base.rollout.logits, tf.logits))
    kl = (np.exp(lp) * (lp - lq)).sum(-1)
    assert len(kl) == sum(SCALES) and kl.mean() > 1e-4  # a KL clamped or summed over nothing would fail below
    # both float64 log-softmaxes of the same logits (torch's and scipy's: logsoftmax_abs at U64 each), a KL over the
    # whole vocabulary moving by twice that at most (sum p (dlog p - dlog q), sum p = 1)
    spread = max(float((x.max(-1) - x.min(-1)).max()) for x in (lp, lq))  # of the logits: a log-softmax keeps it
    assert row2["kl"] == pytest.approx(kl.mean(), rel=0, abs=2 * sum(logsoftmax_abs(lp.shape[-1], spread, U64)))
    assert row2["top1_agree"] == np.count_nonzero(lp.argmax(-1) == lq.argmax(-1)) / sum(SCALES)
    # and the waveform SNR from the WAVs the task wrote (float32), by its definition
    ref_wav, wav = (sf.read(tmp_path / row2["artifacts"][k])[0] for k in ("wav_baseline", "wav"))
    snr = 10 * np.log10(np.sum(ref_wav ** 2) / np.sum((ref_wav - wav) ** 2))
    # the WAVs hold the task's float32 samples exactly (subtype FLOAT): the same float64 sums, in whatever order
    # (sum_rel each, two of them in the ratio), in dB times 10 / ln 10; the row is not rounded (in memory)
    assert row2["snr_db"] == pytest.approx(snr, rel=0, abs=10 / np.log(10) * 2 * sum_rel(len(wav), U64))
    assert set(AudioTask.metrics) <= set(row2)
    arts = row2["artifacts"]
    for key in ("wav", "wav_baseline", "spectrogram", "per_scale"):
        assert (tmp_path / arts[key]).exists(), key
    wav, sr = sf.read(tmp_path / arts["wav"])
    assert sr == model.sample_rate and len(wav) == SCALES[-1] * model.sat.cfg.hop
    np.testing.assert_array_equal(sf.read(tmp_path / arts["wav_baseline"])[0], base.rollout.audio[0].numpy())
    curves = json.loads((tmp_path / arts["per_scale"]).read_text())
    assert curves["scales"] == list(SCALES) and len(curves["kl"]) == len(SCALES)
    assert curves["kl"][0] == 0.0  # scale 0 reads only its own (native) tokens
    assert "STAND-IN" in curves["conditioning"]


@pytest.mark.parametrize("pid", ["ABSOLUTE", "../../x", "a\x00b/../../c", ".."])
def test_hostile_prompt_ids_stay_inside_the_run_folder(model, task, tmp_path, pid):
    """A manifest's ids go into artifact paths: nothing may be written outside the run folder."""
    if pid == "ABSOLUTE":
        pid = str(tmp_path / "outside" / "abs")
    out = tmp_path / "a" / "run"
    out.mkdir(parents=True)
    before = sorted(tmp_path.rglob("*"))
    p = Prompt(pid, synthetic_clips(1.0)["synth_tone"])
    base = task.baseline(model, p, seed=0)
    row = task.evaluate(model, p, CacheConfig("octopus", 2), 0, base, out)
    assert [q for q in sorted(tmp_path.rglob("*")) if q not in before and not q.is_relative_to(out)] == []
    assert not (tmp_path / "outside").exists()
    for rel in row["artifacts"].values():
        assert (out / rel).resolve().is_relative_to((out / "audio").resolve()) and (out / rel).is_file()


def test_a_wav_holds_no_time_of_writing(tmp_path):
    """libsndfile stamps a float WAV's PEAK chunk with the time of writing, so the same rollout gave other bytes a
    second later: the task's WAVs carry the samples alone (bit for bit, float32) and no PEAK chunk."""
    from harness.tasks.audio import _write_wav

    x = np.random.default_rng(0).standard_normal(4000).astype(np.float32) * 0.1
    _write_wav(tmp_path / "a.wav", x, 16_000)
    data = (tmp_path / "a.wav").read_bytes()
    back, sr = sf.read(tmp_path / "a.wav", dtype="float32")
    assert b"PEAK" not in data and sr == 16_000 and np.array_equal(back, x)


def test_clips_batch_into_one_rollout_each_row_the_clips_alone(model, tmp_path):
    """``--batch-size 2`` over three clips: batches of two then one; each row of a batch the row its clip gets
    alone, to float rounding (a rollout's logits to ~100 U32, tests/adapters/aar); the same tokens drawn
    (free_token_match), the batch's one speed record on each of its rows. Left out, the CPU runs one clip a
    batch (rows bit for bit those of one clip at a time)."""
    clips = synthetic_clips(1.0)
    prompts = [Prompt(k, v) for k, v in clips.items()]
    assert [len(b) for b in AudioTask(clip_seconds=1.0, top_k=8).batches(model, prompts)] == [1, 1, 1]
    task = AudioTask(clip_seconds=1.0, top_k=8)
    task.batch_size = 2  # as the runner sets --batch-size
    assert [[p.id for p in b] for b in task.batches(model, prompts)] == [list(clips)[:2], list(clips)[2:]]
    pair, cfg = prompts[:2], CacheConfig("octopus", 2)
    bases = task.baseline_batch(model, pair, seed=0)
    rows = task.evaluate_batch(model, pair, cfg, 0, bases, tmp_path / "batch")
    assert rows[0]["speed"] is rows[1]["speed"] and rows[0]["speed"]["sequences"] == 2
    for p, base, row in zip(pair, bases, rows):
        alone_base = task.baseline(model, p, seed=0)
        assert all(torch.equal(a, b) for a, b in zip(base.rollout.tokens, alone_base.rollout.tokens))
        alone = task.evaluate(model, p, cfg, 0, alone_base, tmp_path / "alone")
        assert row["free_token_match"] == alone["free_token_match"] and row["top1_agree"] == alone["top1_agree"]
        assert row["committed_tokens"] == alone["committed_tokens"] and row["cache_bytes"] == alone["cache_bytes"]
        # the KL of logits each within 2e-5 of alone's: a log-softmax moves by twice that, a KL by twice again
        assert row["kl"] == pytest.approx(alone["kl"], rel=0, abs=4 * 2 * 2e-5)
