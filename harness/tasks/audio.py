"""The ``audio`` task: AAR conditioned on a clip's embedding; each codec's rollout against the baseline's.

Per prompt (a conditioning clip): the clip's embedding (CLAP, or the labelled stand-in), then one
uncompressed rollout (the baseline: tokens, guided logits, latents, waveform). Per cache
configuration: a free-running rollout with the same private generator, scored on waveform and
latents (SNR, LSD, log-mel MSE, latent cosine), and a teacher-forced pass that feeds the
baseline's tokens through the compressed cache and compares next-scale logits (top-1 agreement,
KL) — free-running sampling diverges as soon as one token differs, teacher forcing does not.
Artifacts: WAVs (baseline and codec), a spectrogram PNG (baseline beside codec) and per-scale
teacher-forced curves (JSON).

Clips run in batches of up to ``--batch-size``: one rollout holds them all, each clip drawing from its own
generator (:meth:`adapters.aar.pipeline.AARPipeline.rollout`), so every row is the one its clip gets alone
to float rounding (a product of several clips' rows rounds otherwise than one clip's: on the CPU's MKL as on
cuBLAS); the batch's one speed record is shared by its rows. Left out, the batch is the device's default on
a GPU (a single clip keeps it a few percent busy) and one clip on the CPU, whose rows stay bit for bit
those of one clip at a time.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from adapters.aar.pipeline import Rollout
from adapters.cache.stats import cache_row_stats
from adapters.cache.config import CacheConfig
from adapters.cache.rollout_clock import RolloutClock
from kernels import private_generator
from registry.options import Allowed, option
from metrics import audio as am

from harness.run.input_files import InputError, field, read_json
from harness.run.rows import atomic_write, inside, is_regular, safe_name, write_via
from harness.run.safe_text import plot_text
from harness.tasks.base import Prompt, Task, artifact_label, register_task

PROMPTS_DIR = Path(__file__).resolve().parents[2] / "prompts" / "audio"
AUDIO_SUFFIXES = (".wav", ".flac", ".mp3", ".ogg")
CLIP_RATE = 48_000  # what the conditioners take


@dataclass
class AudioBaseline:
    emb: torch.Tensor  # [1, 512]
    rollout: object  # adapters.aar.Rollout, its cache dropped
    clip_seconds: float


def synthetic_clips(seconds: float = 4.0, sr: int = CLIP_RATE) -> dict[str, np.ndarray]:
    """Three deterministic clips that need nothing installed (tests, machines without samples)."""
    t = np.arange(int(seconds * sr)) / sr
    tone = sum(0.3 / k * np.sin(2 * np.pi * 220 * k * t) for k in (1, 2, 3, 4))
    chirp = 0.4 * np.sin(2 * np.pi * (100 * t + 0.5 * (4000 - 100) / seconds * t ** 2))
    g = private_generator("audio-synthetic-noise")
    noise = torch.randn(len(t), generator=g, dtype=torch.float64).numpy() * 0.2
    bursts = noise * (np.sin(2 * np.pi * 2 * t) > 0.3)
    return {name: x.astype(np.float32) for name, x in (("synth_tone", tone), ("synth_chirp", chirp),
                                                       ("synth_noise_bursts", bursts))}


def load_clip(prompt: Prompt, seconds: float) -> np.ndarray:
    """A prompt's clip, mono float32 at 48 kHz, cut to its first ``seconds``."""
    if isinstance(prompt.data, np.ndarray):
        y = prompt.data
    else:
        import librosa

        y, _ = librosa.load(str(prompt.data), sr=CLIP_RATE, mono=True)
    return np.ascontiguousarray(y[: int(seconds * CLIP_RATE)], dtype=np.float32)


def _manifest_prompts(manifest: Path) -> list[Prompt]:
    shape = '{"clips": [{"id": ..., "file": ...}, ...]} (optional "source_dir", "license", "install")'
    spec = read_json(manifest, dict, "an audio manifest", fix=f"a manifest is {shape}")
    root = Path(field(spec, "source_dir", str, str(manifest), str(manifest.parent)))
    clips = field(spec, "clips", list, str(manifest))
    for i, c in enumerate(clips):
        where = f"{manifest}: clip {i}"
        if not isinstance(c, dict):
            raise InputError(f"{where}: each clip is an object; a manifest is {shape}")
        field(c, "id", (str, int), where), field(c, "file", str, where), field(c, "kind", str, where, "")
    if not clips:
        raise InputError(f"{manifest}: no clips; a manifest is {shape}")
    missing = [c["file"] for c in clips if not (root / c["file"]).exists()]
    if missing:
        hint = f" ({field(spec, 'install', str, str(manifest))})" if "install" in spec else ""
        raise FileNotFoundError(f"audio prompts: {len(missing)} clip(s) of {manifest} are not in {root}{hint}: "
                                f"{', '.join(missing[:5])}. Or use a folder of clips, or source='synthetic'.")
    return [Prompt(c["id"], str(root / c["file"]), {"file": str(root / c["file"]), "license": str(spec.get("license", "")),
                                                      "kind": c.get("kind") or ""}) for c in clips]


def _write_wav(path: Path, audio: np.ndarray, sr: int) -> None:
    from scipy.io import wavfile

    path.parent.mkdir(parents=True, exist_ok=True)
    # float: no clipping; scipy's writer, not libsndfile's, whose float WAVs carry a PEAK chunk stamped with the
    # time of writing (the same rollout would give other bytes a second later)
    write_via(path, lambda p: wavfile.write(str(p), sr, np.asarray(audio, dtype=np.float32)))


def _spectrogram_png(path: Path, base: np.ndarray, x: np.ndarray, sr: int, title: str, labels: tuple[str, str]) -> None:
    """Log-mel spectrograms of the baseline and ``x`` side by side; ``labels`` and ``title`` (a prompt id's) drawn
    as written (:func:`~harness.run.safe_text.plot_text`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mb, mx = am.log_mel(base, sr) * (10 / math.log(10)), am.log_mel(x, sr) * (10 / math.log(10))  # dB
    vmax = max(mb.max(), mx.max())
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True, layout="constrained")
    for ax, m, lab in zip(axes, (mb, mx), labels):
        im = ax.imshow(m, origin="lower", aspect="auto", cmap="magma", vmin=vmax - 80, vmax=vmax,
                       extent=(0, len(base) / sr, 0, m.shape[0]))
        ax.set_title(plot_text(lab), fontsize=9)
        ax.set_xlabel("s")
    axes[0].set_ylabel("mel band")
    fig.colorbar(im, ax=axes, label="dB", shrink=0.9)
    fig.suptitle(plot_text(title), fontsize=9)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_via(path, lambda p: fig.savefig(p, dpi=80))
    plt.close(fig)


def _safe(label: str) -> str:
    return safe_name(label.replace("@", "-").replace("/", "_"))


@register_task("audio")
class AudioTask(Task):
    """Options (``--task-opt audio.NAME=VALUE``): see ``Options``."""

    modality = "audio"
    metrics = ("snr_db", "lsd", "log_mel_mse", "latent_cos", "top1_agree", "kl", "free_token_match")
    media = {"audio": {"baseline": "wav_baseline", "player": "wav", "image": "spectrogram", "curves": "per_scale"}}
    baseline_types = (AudioBaseline, Rollout)

    @dataclass(frozen=True)
    class Options:
        clip_seconds: float = option(
            10.0, "conditioning clip length, s (CLAP's window: no random crop)", Allowed(lo=0.1))
        cfg: float = option(4.0, "classifier-free guidance at the last scale (ramped linearly from 0)", Allowed(lo=0))
        top_k: int = option(200, "top-k sampling (0: off)", Allowed(lo=0))
        top_p: float = option(0.95, "top-p sampling (0: off)", Allowed(lo=0, hi=1))
        save_audio: bool = option(True, "write WAVs and spectrogram PNGs")

    def __init__(self, **options):
        super().__init__(**options)
        from adapters.aar import SamplingConfig

        self.clip_seconds = float(self.opts.clip_seconds)
        self.sampling = SamplingConfig(cfg=float(self.opts.cfg), top_k=int(self.opts.top_k),
                                       top_p=float(self.opts.top_p))
        self.save_audio = bool(self.opts.save_audio)

    # --- prompts -----------------------------------------------------------------------------
    def prompts(self, source: str | None = None, limit: int | None = None) -> list[Prompt]:
        """source: None (prompts/audio/clips.json: Sonic Pi samples), a folder of clips, a JSON
        manifest, or 'synthetic'."""
        if source == "synthetic":
            out = [Prompt(k, v, {"file": "(generated)", "license": "n/a"}) for k, v in synthetic_clips().items()]
        else:
            p = Path(source) if source else PROMPTS_DIR / "clips.json"
            if p.is_dir():
                files = sorted(f for f in p.iterdir() if f.suffix.lower() in AUDIO_SUFFIXES)
                if not files:
                    raise FileNotFoundError(f"audio prompts: no {'/'.join(AUDIO_SUFFIXES)} files in {p}")
                out = [Prompt(f.stem, str(f), {"file": str(f)}) for f in files]
            elif p.suffix == ".json" and p.exists():
                out = _manifest_prompts(p)
            else:
                raise FileNotFoundError(f"audio prompts: '{p}' is neither a folder of clips nor a JSON manifest "
                                        f"(or use source='synthetic')")
        return out[:limit] if limit else out

    def content_key(self, prompt: Prompt) -> str:
        """A digest of the clip: a synthetic clip's samples, or its file's bytes (not decoded: cheap before the model
        loads; a file rewritten with the same samples counts as changed)."""
        if isinstance(prompt.data, np.ndarray):
            return hashlib.sha256(np.ascontiguousarray(prompt.data).tobytes()).hexdigest()
        with open(prompt.data, "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()

    # --- rollouts ----------------------------------------------------------------------------
    def _generator(self, model, prompt: Prompt, seed: int) -> torch.Generator:
        return private_generator("audio", prompt.id, seed, device=model.device)

    def prompts_per_batch(self, model) -> int:
        """``--batch-size``; left out, the GPU's default, and one clip on the CPU (module docstring)."""
        if self.batch_size is None and torch.device(getattr(model, "device", "cpu")).type == "cpu":
            return 1
        return super().prompts_per_batch(model)

    def batches(self, model, prompts: list[Prompt]) -> list[list[Prompt]]:
        """Runs of up to :meth:`prompts_per_batch` consecutive clips."""
        size = self.prompts_per_batch(model)
        return [prompts[i:i + size] for i in range(0, len(prompts), size)]

    def baseline(self, model, prompt: Prompt, seed: int) -> AudioBaseline:
        return self.baseline_batch(model, [prompt], seed)[0]

    def evaluate(self, model, prompt: Prompt, cache_config, seed: int, baseline: AudioBaseline, out_dir: Path) -> dict:
        return self.evaluate_batch(model, [prompt], cache_config, seed, [baseline], out_dir)[0]

    def baseline_batch(self, model, prompts: list[Prompt], seed: int) -> list[AudioBaseline]:
        if getattr(model, "modality", None) != "audio":
            raise TypeError(f"the audio task drives an audio model (aar, aar-tiny, aar-random), got {type(model).__name__}")
        embs = [model.embed(load_clip(p, self.clip_seconds)) for p in prompts]
        generators = [self._generator(model, p, seed) for p in prompts]
        r = model.rollout(torch.cat(embs), CacheConfig(codec="none"), generators, self.sampling)
        return [AudioBaseline(emb, r.clip(b), self.clip_seconds) for b, emb in enumerate(embs)]

    def evaluate_batch(self, model, prompts: list[Prompt], cache_config, seed: int, baselines: list[AudioBaseline],
                       out_dir: Path) -> list[dict]:
        emb = torch.cat([b.emb for b in baselines])
        clock = RolloutClock(model.device)  # the free-running rollout: the teacher-forced pass decodes nothing
        free = model.rollout(emb, cache_config, [self._generator(model, p, seed) for p in prompts], self.sampling,
                             speed=clock)
        teacher = [torch.cat(t) for t in zip(*(b.rollout.tokens for b in baselines))]
        tf = model.rollout(emb, cache_config, sampling=self.sampling, teacher=teacher)
        stats, speed = cache_row_stats(free.cache), clock.record()  # every clip's share: they hold the same tokens
        return [self._row(model, p, cache_config, b.rollout, free.clip(i), tf.clip(i), stats, speed, Path(out_dir))
                for i, (p, b) in enumerate(zip(prompts, baselines))]

    def _row(self, model, prompt: Prompt, cache_config, base: Rollout, free: Rollout, tf: Rollout, stats: dict,
             speed: dict, out_dir: Path) -> dict:
        """A clip's row: its free-running and teacher-forced rollouts against its baseline's."""
        sr = model.sample_rate
        ref_wav, wav = base.audio[0].numpy(), free.audio[0].numpy()
        m = self.metric
        row = {  # top1_agree and kl are teacher-forced; the rest compare the free-running rollouts
            "snr_db": m("snr_db")(ref_wav, wav),
            "lsd": m("lsd")(ref_wav, wav),
            "log_mel_mse": m("log_mel_mse")(ref_wav, wav, sr=sr),
            "latent_cos": m("latent_cos")(base.f_hat, free.f_hat),
            "top1_agree": am.pooled(m("top1_agree"), base.logits, tf.logits),
            "kl": am.pooled(m("kl"), base.logits, tf.logits),
            "free_token_match": m("free_token_match")(base.tokens, free.tokens),
        }
        row.update(stats)  # the teacher-forced pass holds the same tokens
        row["speed"] = speed
        label = artifact_label(cache_config)
        row["artifacts"] = self._write_artifacts(model, prompt, label, base, free, tf, row, out_dir)
        return row

    def _write_artifacts(self, model, prompt, label, base, free, tf, row, out_dir: Path) -> dict:
        sr, rel = model.sample_rate, Path("audio") / safe_name(prompt.id)  # ids come from file names / manifests
        inside(out_dir, rel)
        arts = {}
        curves = {"scales": list(model.aar.cfg.scales),
                  "top1_agree": am.per_scale(self.metric("top1_agree"), base.logits, tf.logits),
                  "kl": am.per_scale(self.metric("kl"), base.logits, tf.logits),
                  "free_token_match": am.per_scale(self.metric("free_token_match"), base.tokens, free.tokens),
                  "conditioning": model.conditioning_label}
        (out_dir / rel).mkdir(parents=True, exist_ok=True)
        atomic_write(out_dir / rel / f"{_safe(label)}.per_scale.json", json.dumps(curves, indent=1))
        arts["per_scale"] = str(rel / f"{_safe(label)}.per_scale.json")
        if self.save_audio:
            if not is_regular(out_dir / rel / "baseline.wav"):
                _write_wav(out_dir / rel / "baseline.wav", base.audio[0].numpy(), sr)
            _write_wav(out_dir / rel / f"{_safe(label)}.wav", free.audio[0].numpy(), sr)
            title = (f"{prompt.id} | {model.name} | conditioning: {model.conditioning_label}\n"
                     f"{label}: SNR {row['snr_db']:.2f} dB, LSD {row['lsd']:.2f} dB, "
                     f"teacher-forced KL {row['kl']:.3g}")
            _spectrogram_png(out_dir / rel / f"{_safe(label)}.png", base.audio[0].numpy(), free.audio[0].numpy(), sr,
                             title, ("baseline (uncompressed cache)", label))
            arts.update(wav_baseline=str(rel / "baseline.wav"), wav=str(rel / f"{_safe(label)}.wav"),
                        spectrogram=str(rel / f"{_safe(label)}.png"))
        return arts
