"""Audio metrics: a compressed-cache rollout against the uncompressed one.

Free-running (the two rollouts share the seed but diverge once a sampled token differs):
  ``snr_db``         10 log10(sum ref^2 / sum (ref - x)^2) on the waveforms (inf when identical).
  ``lsd``            log-spectral distance, dB: per STFT frame sqrt(mean_f (10 log10 P_ref - 10 log10 P_x)^2),
                     averaged over frames (P = |STFT|^2 + 1e-10; Hann window 2048, hop 512).
  ``log_mel_mse``    mean squared difference of natural-log mel power spectrograms (librosa, 80 bands,
                     n_fft 1024, hop 256, floor 1e-5).
  ``latent_cos``     cosine between the tokenizer latents f_hat (the summed scale codes) of the two rollouts.
  ``free_token_match``  share of sampled tokens equal to the baseline's (where the rollouts part).
Teacher-forced (both caches fed the baseline's tokens; compares the guided next-scale logits):
  ``top1_agree``     fraction of positions whose top-1 token is the baseline's top-1.
  ``kl``             mean over positions of KL(p_baseline || p_compressed), nats.
(``kl``, ``top1_agree`` and ``latent_cos`` are the same quantities as for text and video: see
:mod:`metrics.shared`.)
Inputs are numpy arrays or tensors; waveforms 1-D, logits ``[..., V]``.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from registry import declare_modality

from metrics import shared  # noqa: F401  (defines kl, top1_agree and latent_cos, implemented here for audio)
from metrics.registry import register_metric

MODALITY = declare_modality("audio")  # before any metric of it registers

POWER_FLOOR = 1e-10
MEL_FLOOR = 1e-5


def _np(x) -> np.ndarray:
    return x.detach().cpu().double().numpy() if isinstance(x, torch.Tensor) else np.asarray(x, dtype=np.float64)


@register_metric("snr_db", "audio", higher_is_better=True, scale="dB", display="SNR (dB)",
                 description="waveform SNR of the rollout against the uncompressed one, dB")
def snr_db(ref, x) -> float:
    ref, x = _np(ref).ravel(), _np(x).ravel()
    err = float(np.sum((ref - x) ** 2))
    if err == 0.0:
        return math.inf
    return 10.0 * math.log10(float(np.sum(ref ** 2)) / err)


def _power_spec(y: np.ndarray, n_fft: int, hop: int) -> np.ndarray:
    """|STFT|^2 [frames, bins], Hann window, centred frames with reflect padding."""
    y = np.pad(y, n_fft // 2, mode="reflect") if len(y) > n_fft // 2 else np.pad(y, n_fft // 2)
    n = 1 + max(len(y) - n_fft, 0) // hop
    frames = np.stack([y[i * hop: i * hop + n_fft] for i in range(n)])
    win = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n_fft) / n_fft)  # periodic Hann
    return np.abs(np.fft.rfft(frames * win, axis=-1)) ** 2


@register_metric("lsd", "audio", higher_is_better=False, scale="dB", display="LSD (dB)",
                 description="log-spectral distance to the uncompressed rollout, dB")
def lsd(ref, x, n_fft: int = 2048, hop: int = 512) -> float:
    ref, x = _np(ref).ravel(), _np(x).ravel()
    d = 10 * np.log10(_power_spec(ref, n_fft, hop) + POWER_FLOOR) - 10 * np.log10(_power_spec(x, n_fft, hop) + POWER_FLOOR)
    return float(np.mean(np.sqrt(np.mean(d ** 2, axis=-1))))


def log_mel(y, sr: int, n_mels: int = 80, n_fft: int = 1024, hop: int = 256) -> np.ndarray:
    """ln(max(mel power, 1e-5)) [n_mels, frames] (librosa)."""
    import librosa  # lazy: the metric registry imports this module for every modality

    mel = librosa.feature.melspectrogram(y=_np(y).ravel().astype(np.float32), sr=sr, n_fft=n_fft,
                                         hop_length=hop, n_mels=n_mels, power=2.0)
    return np.log(np.maximum(mel.astype(np.float64), MEL_FLOOR))


@register_metric("log_mel_mse", "audio", higher_is_better=False, display="log-mel MSE",
                 description="MSE of log-mel spectrograms against the uncompressed rollout")
def log_mel_mse(ref, x, sr: int = 24_000) -> float:
    return float(np.mean((log_mel(ref, sr) - log_mel(x, sr)) ** 2))


@register_metric("latent_cos", "audio")
def latent_cosine(ref, x) -> float:
    ref, x = _np(ref).ravel(), _np(x).ravel()
    den = float(np.linalg.norm(ref) * np.linalg.norm(x))
    return float(np.dot(ref, x) / den) if den > 0 else float("nan")


@register_metric("top1_agree", "audio")
def token_agreement(ref_logits, logits) -> float:
    ref_logits, logits = torch.as_tensor(ref_logits), torch.as_tensor(logits)
    return float((ref_logits.argmax(-1) == logits.argmax(-1)).double().mean())


@register_metric("kl", "audio")
def kl_divergence(ref_logits, logits) -> float:
    lp = torch.log_softmax(torch.as_tensor(ref_logits).double(), -1)
    lq = torch.log_softmax(torch.as_tensor(logits).double(), -1)
    kl = (lp.exp() * (lp - lq)).sum(-1)
    return float(kl.mean())


@register_metric("free_token_match", "audio", higher_is_better=True, display="free-run token match",
                 description="free-running: share of sampled tokens equal to the baseline's (same seed)")
def token_match(ref_tokens, tokens) -> float:
    """Lists of per-scale token tensors [B, l_s] (or single tensors); every token weighs the same."""
    ref_tokens = ref_tokens if isinstance(ref_tokens, (list, tuple)) else [ref_tokens]
    tokens = tokens if isinstance(tokens, (list, tuple)) else [tokens]
    eq = torch.cat([(torch.as_tensor(a) == torch.as_tensor(b)).reshape(-1) for a, b in zip(ref_tokens, tokens)])
    return float(eq.double().mean())


def per_scale(fn, ref_per_scale, x_per_scale) -> list[float]:
    """A logits metric applied scale by scale (lists of [B, l_s, V])."""
    return [fn(r, x) for r, x in zip(ref_per_scale, x_per_scale)]


def pooled(fn, ref_per_scale, x_per_scale) -> float:
    """A logits metric over every position of the pyramid (each token weighs the same)."""
    cat = lambda xs: torch.cat([torch.as_tensor(t).reshape(-1, t.shape[-1]) for t in xs])  # noqa: E731
    return fn(cat(ref_per_scale), cat(x_per_scale))
