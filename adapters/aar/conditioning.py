"""Conditioning embeddings for AAR: a clip (mono, 48 kHz) -> a 512-d L2-normalised audio embedding.

* :class:`ClapConditioner` — LAION's CLAP through transformers' ``ClapModel`` from a local folder
  in the ``laion/larger_clap_general`` layout (``config.json``, weights, ``preprocessor_config.json``);
  what the AAR release conditions on (``get_audio_features``).
* :class:`LaionClapConditioner` — the ``laion_clap`` package and one of its ``.pt`` checkpoints;
  imported only when asked for (the package fetches files at import time).
* :class:`StandInConditioner` — no CLAP at all: a fixed seeded random projection of log-mel
  statistics. Deterministic and cheap, for runs without a CLAP checkpoint; it is NOT a CLAP
  embedding and every report says so.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from adapters.loading import NO_FOLDER_CODE
from kernels import private_generator

CLAP_SAMPLE_RATE = 48_000
CLAP_DIM = 512


class ClapConditioner:
    sample_rate = CLAP_SAMPLE_RATE

    def __init__(self, path: str | Path, device="cpu", model=None, feature_extractor=None):
        from transformers import ClapFeatureExtractor, ClapModel

        self.model = (model if model is not None else ClapModel.from_pretrained(str(path), **NO_FOLDER_CODE)).to(device).eval()
        self.features = (feature_extractor if feature_extractor is not None
                         else ClapFeatureExtractor.from_pretrained(str(path), **NO_FOLDER_CODE))
        self.device = device
        self.label = f"CLAP (transformers ClapModel, {Path(str(path)).name})"

    @torch.no_grad()
    def __call__(self, audio: np.ndarray) -> torch.Tensor:
        """audio: mono float [T] at 48 kHz (at most 10 s: longer clips are randomly cut by the
        feature extractor) -> [1, 512] float32."""
        inputs = self.features(audio, sampling_rate=self.sample_rate, return_tensors="pt")
        inputs = {k: v.to(self.device) for k, v in inputs.items()}
        out = self.model.get_audio_features(**inputs)
        emb = out if isinstance(out, torch.Tensor) else out.pooler_output  # transformers >= 5 wraps it
        return emb.float().cpu()


class LaionClapConditioner:
    sample_rate = CLAP_SAMPLE_RATE

    def __init__(self, ckpt: str | Path, device="cpu", amodel: str = "HTSAT-base"):
        import laion_clap  # optional; downloads at import time, so only here

        self.model = laion_clap.CLAP_Module(enable_fusion=False, amodel=amodel, device=device)
        self.model.load_ckpt(str(ckpt))
        self.label = f"CLAP (laion_clap {amodel}, {Path(str(ckpt)).name})"

    @torch.no_grad()
    def __call__(self, audio: np.ndarray) -> torch.Tensor:
        x = torch.as_tensor(audio, dtype=torch.float32)[None]
        return self.model.get_audio_embedding_from_data(x=x, use_tensor=True).float().cpu()


def _mel_filters(sr: int, n_fft: int, n_mels: int, fmin: float = 0.0, fmax: float | None = None) -> np.ndarray:
    """Triangular filters evenly spaced on the HTK mel scale, [n_mels, n_fft // 2 + 1]."""
    mel = lambda f: 2595.0 * np.log10(1.0 + f / 700.0)  # noqa: E731
    hz = lambda m: 700.0 * (10.0 ** (m / 2595.0) - 1.0)  # noqa: E731
    edges = hz(np.linspace(mel(fmin), mel(fmax or sr / 2), n_mels + 2))
    freqs = np.linspace(0, sr / 2, n_fft // 2 + 1)
    lo, mid, hi = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    return np.maximum(0.0, np.minimum((freqs - lo) / (mid - lo), (hi - freqs) / (hi - mid)))


class StandInConditioner:
    """[mean, std] over time of a 64-band log-mel spectrogram (128 numbers) times a fixed Gaussian
    matrix drawn from ``private_generator('aar-standin-conditioning', dim)``, L2-normalised.
    Plain numpy (no librosa), so that it runs wherever torch does."""

    sample_rate = CLAP_SAMPLE_RATE
    label = "STAND-IN (fixed random projection of log-mel statistics; not CLAP)"
    n_mels, n_fft, hop = 64, 2048, 480

    def __init__(self, dim: int = CLAP_DIM):
        g = private_generator("aar-standin-conditioning", dim)
        self.proj = torch.randn(2 * self.n_mels, dim, generator=g, dtype=torch.float64) / math.sqrt(2 * self.n_mels)
        self.filters = _mel_filters(self.sample_rate, self.n_fft, self.n_mels)

    def log_mel(self, audio: np.ndarray) -> np.ndarray:
        """[n_mels, frames] natural-log mel power (Hann window, frames centred with zero padding)."""
        y = np.pad(np.asarray(audio, dtype=np.float64).ravel(), self.n_fft // 2)
        n = 1 + max(len(y) - self.n_fft, 0) // self.hop
        idx = np.arange(self.n_fft)[None] + self.hop * np.arange(n)[:, None]
        spec = np.abs(np.fft.rfft(y[idx] * np.hanning(self.n_fft + 1)[:-1], axis=-1)) ** 2
        return np.log(self.filters @ spec.T + 1e-6)

    def __call__(self, audio: np.ndarray) -> torch.Tensor:
        logmel = self.log_mel(audio)
        stats = torch.from_numpy(np.concatenate([logmel.mean(1), logmel.std(1)]))
        e = stats @ self.proj
        return (e / e.norm().clamp_min(1e-12)).float()[None]


def make_conditioner(kind: str | None, path: str | Path | None = None, device="cpu", dim: int = CLAP_DIM):
    """kind: 'clap' (transformers, folder), 'laion_clap' (.pt file), 'stand-in', or None (stand-in)."""
    if kind in (None, "stand-in"):
        return StandInConditioner(dim)
    if kind == "clap":
        return ClapConditioner(path, device)
    if kind == "laion_clap":
        return LaionClapConditioner(path, device)
    raise ValueError(f"unknown conditioner '{kind}'. Available: clap, laion_clap, stand-in")
