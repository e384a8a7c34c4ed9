"""The Scale-level Audio Tokenizer (SAT): SEANet autoencoder + multi-scale residual VQ.

The encoder turns 24 kHz audio into ``F`` latent frames (75 a second); the quantizer codes them
as a pyramid of token maps of lengths ``scales`` = (1, 2, 4, ..., 75). Scale ``s`` quantizes the
area-downsampled residual against its own 1024-entry codebook; its codes are looked up,
linearly upsampled to ``F`` frames and refined by one of a few shared 1-D convolutions ("phi",
picked by the scale's position in [0, 1]) before being added to the running sum ``f_hat``.
The AR model predicts the codes of scale ``s + 1`` from ``f_hat`` area-downsampled to that length.

Key names follow the released checkpoint (``generator_state_dict``): ``encoder.model.*``,
``decoder.model.*``, ``quantizer.vq.layers.{s}._codebook.{embed,embed_avg,cluster_size,inited}``,
``quantizer.vq.quant_resi.qresi_ls.{j}.{weight,bias}``, ``quantizer.vq.project_{in,out}`` (a
Linear only where ``dimension != latent_dim``).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from adapters.aar.seanet import SEANetDecoder, SEANetEncoder

#: The released SAT's token pyramid: 16 scales, 455 tokens, ending at 75 frames (1 s at 24 kHz).
AAR_SCALES = (1, 2, 4, 6, 9, 12, 16, 20, 25, 31, 37, 43, 50, 58, 66, 75)


@dataclass
class SATConfig:
    sample_rate: int = 24_000
    channels: int = 1
    ratios: tuple[int, ...] = (8, 5, 4, 2)
    dimension: int = 128  # SEANet latent channels (the AAR release pairs with SAT_d128_lat128)
    latent_dim: int = 128  # codebook vector size (Cvae)
    n_filters: int = 32
    n_residual_layers: int = 1
    lstm: int = 2
    codebook_size: int = 1024
    scales: tuple[int, ...] = AAR_SCALES
    phi_kernels: tuple[int, ...] = (9, 9, 9, 9, 9, 9)
    phi_ratio: float = 0.5

    def to_json(self) -> dict:
        return asdict(self)

    @property
    def hop(self) -> int:
        h = 1
        for r in self.ratios:
            h *= r
        return h


class Codebook(nn.Module):
    """One scale's codebook. ``embed`` [V, C]; the EMA buffers are kept only so that released
    checkpoints load strictly (training state, unused at inference)."""

    def __init__(self, size: int, dim: int):
        super().__init__()
        self.register_buffer("inited", torch.ones(1))
        self.register_buffer("cluster_size", torch.zeros(size))
        self.register_buffer("embed", torch.randn(size, dim))
        self.register_buffer("embed_avg", self.embed.clone())


class ScaleVQ(nn.Module):
    """Wrapper level of the released layout (``layers.{s}._codebook``)."""

    def __init__(self, size: int, dim: int):
        super().__init__()
        self._codebook = Codebook(size, dim)

    def lookup(self, idx: torch.Tensor) -> torch.Tensor:
        """idx [B, l] -> code vectors [B, C, l]."""
        return F.embedding(idx, self._codebook.embed).transpose(1, 2)

    def nearest(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, l, C] -> index of the nearest code [B, l] (squared Euclidean distance)."""
        e = self._codebook.embed
        d = x.pow(2).sum(-1, keepdim=True) - 2 * x @ e.t() + e.pow(2).sum(-1)
        return d.argmin(-1)


class Phi(nn.Conv1d):
    """h -> (1 - r) h + r conv(h), a 'same' convolution refining an upsampled scale."""

    def __init__(self, dim: int, kernel: int, ratio: float):
        super().__init__(dim, dim, kernel, padding=kernel // 2)
        self.ratio = ratio

    def forward(self, h):
        return h * (1 - self.ratio) + super().forward(h) * self.ratio


class PhiSet(nn.Module):
    """K phi convolutions shared across scales: scale position p in [0, 1] uses the one whose
    tick (K ticks evenly placed, 1/(2K) from each end; 1/(3K) when K = 4) is nearest."""

    def __init__(self, dim: int, kernels, ratio: float):
        super().__init__()
        self.qresi_ls = nn.ModuleList([Phi(dim, k, ratio) for k in kernels])
        K = len(kernels)
        m = 1 / (3 * K) if K == 4 else 1 / (2 * K)
        self.ticks = [m + i * (1 - 2 * m) / (K - 1) for i in range(K)] if K > 1 else [0.5]

    def at(self, p: float) -> Phi:
        j = min(range(len(self.ticks)), key=lambda i: (abs(self.ticks[i] - p), i))
        return self.qresi_ls[j]


class MultiScaleRVQ(nn.Module):
    def __init__(self, cfg: SATConfig):
        super().__init__()
        self.scales = tuple(cfg.scales)
        self.dim = cfg.latent_dim
        same = cfg.dimension == cfg.latent_dim
        self.project_in = nn.Identity() if same else nn.Linear(cfg.dimension, cfg.latent_dim)
        self.project_out = nn.Identity() if same else nn.Linear(cfg.latent_dim, cfg.dimension)
        self.quant_resi = PhiSet(cfg.latent_dim, cfg.phi_kernels, cfg.phi_ratio)
        self.layers = nn.ModuleList([ScaleVQ(cfg.codebook_size, cfg.latent_dim) for _ in self.scales])

    def phi(self, si: int) -> Phi:
        return self.quant_resi.at(si / (len(self.scales) - 1))

    def upsampled(self, si: int, h: torch.Tensor) -> torch.Tensor:
        """Scale si's code vectors h [B, C, l] -> their contribution to f_hat [B, C, F]."""
        F_ = self.scales[-1]
        if h.shape[-1] != F_:
            h = F.interpolate(h, size=F_, mode="linear")
        return self.phi(si)(h)

    def next_input(self, si: int, f_hat: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add scale si (h [B, C, scales[si]]) to f_hat [B, C, F]; return (f_hat, the next scale's
        input: f_hat area-downsampled to scales[si + 1], [B, C, scales[si+1]]; f_hat at the last)."""
        f_hat = f_hat + self.upsampled(si, h)
        if si == len(self.scales) - 1:
            return f_hat, f_hat
        return f_hat, F.interpolate(f_hat, size=self.scales[si + 1], mode="area")

    def encode(self, z: torch.Tensor) -> list[torch.Tensor]:
        """Latents z [B, dimension, F] -> codes per scale, [B, scales[s]] each."""
        resid = self.project_in(z.transpose(1, 2)).transpose(1, 2)  # [B, C, F]
        codes = []
        for si, pn in enumerate(self.scales):
            x = resid if pn == resid.shape[-1] else F.interpolate(resid, size=pn, mode="area")
            idx = self.layers[si].nearest(x.transpose(1, 2))
            resid = resid - self.upsampled(si, self.layers[si].lookup(idx))
            codes.append(idx)
        return codes

    def codes_to_fhat(self, codes: list[torch.Tensor]) -> torch.Tensor:
        f_hat = 0
        for si, idx in enumerate(codes):
            f_hat = f_hat + self.upsampled(si, self.layers[si].lookup(idx))
        return f_hat


class Quantizer(nn.Module):
    """Wrapper level of the released layout (``quantizer.vq``)."""

    def __init__(self, cfg: SATConfig):
        super().__init__()
        self.vq = MultiScaleRVQ(cfg)


class SAT(nn.Module):
    def __init__(self, cfg: SATConfig | None = None):
        super().__init__()
        self.cfg = cfg = cfg or SATConfig()
        kw = dict(channels=cfg.channels, dimension=cfg.dimension, n_filters=cfg.n_filters, ratios=cfg.ratios,
                  n_residual_layers=cfg.n_residual_layers, lstm=cfg.lstm)
        self.encoder = SEANetEncoder(**kw)
        self.decoder = SEANetDecoder(**kw)
        self.quantizer = Quantizer(cfg)

    @property
    def vq(self) -> MultiScaleRVQ:
        return self.quantizer.vq

    def audio_to_codes(self, audio: torch.Tensor) -> list[torch.Tensor]:
        """audio [B, channels, T] at cfg.sample_rate -> codes per scale (T must give scales[-1] frames)."""
        z = self.encoder(audio)
        if z.shape[-1] != self.cfg.scales[-1]:
            raise ValueError(f"audio of {audio.shape[-1]} samples gives {z.shape[-1]} latent frames; the "
                             f"tokenizer's last scale is {self.cfg.scales[-1]} frames "
                             f"({self.cfg.scales[-1] * self.cfg.hop} samples)")
        return self.vq.encode(z)

    def fhat_to_audio(self, f_hat: torch.Tensor) -> torch.Tensor:
        """f_hat [B, latent_dim, F] -> audio [B, channels, F * hop]."""
        z = self.vq.project_out(f_hat.transpose(1, 2)).transpose(1, 2)
        return self.decoder(z)
