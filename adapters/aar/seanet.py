"""SEANet encoder and decoder (EnCodec's convolutional audio autoencoder), as the AAR tokenizer uses it.

Non-causal, weight-normalised convolutions with reflect padding, ELU activations, one residual
block per resolution, a 2-layer LSTM at the bottleneck. With ratios [8, 5, 4, 2] at 24 kHz one
latent frame covers 320 samples (75 frames a second).

Module paths match the released checkpoints (EnCodec's layout): a convolution's weight lives at
``<...>.conv.conv.weight_g`` / ``weight_v`` (``convtr.convtr`` for transposed ones), the LSTM at
``<...>.lstm.weight_ih_l0``. Shapes: audio ``[B, channels, T]``, latents ``[B, dimension, T / 320]``.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def _weight_from_norm(g: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """w = g * v / ||v||, the norm over every dim but 0 (torch's legacy ``weight_norm``, dim=0)."""
    return v * (g / v.flatten(1).norm(dim=1).view(-1, *([1] * (v.dim() - 1))))


class WNConv1d(nn.Module):
    """Conv1d storing its weight as (weight_g [out, 1, 1], weight_v [out, in, k])."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int = 1, dilation: int = 1):
        super().__init__()
        self.stride, self.dilation, self.kernel_size = stride, dilation, kernel
        self.weight_v = nn.Parameter(torch.randn(cout, cin, kernel) / math.sqrt(cin * kernel))
        self.weight_g = nn.Parameter(self.weight_v.detach().flatten(1).norm(dim=1).view(cout, 1, 1).clone())
        self.bias = nn.Parameter(torch.zeros(cout))

    def forward(self, x):
        w = _weight_from_norm(self.weight_g, self.weight_v)
        return F.conv1d(x, w, self.bias, stride=self.stride, dilation=self.dilation)


class WNConvTranspose1d(nn.Module):
    """ConvTranspose1d storing its weight as (weight_g [in, 1, 1], weight_v [in, out, k])."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int = 1):
        super().__init__()
        self.stride, self.kernel_size = stride, kernel
        self.weight_v = nn.Parameter(torch.randn(cin, cout, kernel) / math.sqrt(cin * kernel / stride))
        self.weight_g = nn.Parameter(self.weight_v.detach().flatten(1).norm(dim=1).view(cin, 1, 1).clone())
        self.bias = nn.Parameter(torch.zeros(cout))

    def forward(self, x):
        w = _weight_from_norm(self.weight_g, self.weight_v)
        return F.conv_transpose1d(x, w, self.bias, stride=self.stride)


class _Norm(nn.Module):
    """EnCodec's NormConv1d / NormConvTranspose1d wrapper level (its norm is the identity here)."""

    def __init__(self, attr: str, conv: nn.Module):
        super().__init__()
        self.attr = attr
        setattr(self, attr, conv)

    def forward(self, x):
        return getattr(self, self.attr)(x)


def _pad_reflect(x: torch.Tensor, left: int, right: int) -> torch.Tensor:
    """Reflect padding that also works when the input is shorter than the pad (zero-extends first)."""
    n = x.shape[-1]
    extra = max(left, right) - n + 1 if n <= max(left, right) else 0
    if extra:
        x = F.pad(x, (0, extra))
    y = F.pad(x, (left, right), mode="reflect")
    return y[..., : y.shape[-1] - extra] if extra else y


class SConv1d(nn.Module):
    """'Same'-style non-causal convolution: pads so that T_out = ceil(T_in / stride)."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int = 1, dilation: int = 1):
        super().__init__()
        self.conv = _Norm("conv", WNConv1d(cin, cout, kernel, stride, dilation))

    def forward(self, x):
        c = self.conv.conv
        k = (c.kernel_size - 1) * c.dilation + 1  # effective kernel
        total = k - c.stride
        n = x.shape[-1]
        frames = (n - k + total) / c.stride + 1
        extra = (math.ceil(frames) - 1) * c.stride + (k - total) - n  # makes the last window full
        right = total // 2
        return self.conv(_pad_reflect(x, total - right, right + extra))


class SConvTranspose1d(nn.Module):
    def __init__(self, cin: int, cout: int, kernel: int, stride: int):
        super().__init__()
        self.convtr = _Norm("convtr", WNConvTranspose1d(cin, cout, kernel, stride))

    def forward(self, x):
        c = self.convtr.convtr
        total = c.kernel_size - c.stride
        right = total // 2
        y = self.convtr(x)
        return y[..., total - right: y.shape[-1] - right]


class SLSTM(nn.Module):
    """LSTM over the time axis of a [B, C, T] tensor, with a skip connection."""

    def __init__(self, dim: int, num_layers: int):
        super().__init__()
        self.lstm = nn.LSTM(dim, dim, num_layers)

    def forward(self, x):
        t = x.permute(2, 0, 1)  # [T, B, C]
        y, _ = self.lstm(t)
        return (y + t).permute(1, 2, 0)


class ResBlock(nn.Module):
    """ELU-conv(k=3, dilation)-ELU-conv(k=1) branch on dim // compress channels + a 1x1 conv shortcut."""

    def __init__(self, dim: int, dilation: int, compress: int = 2, kernel: int = 3):
        super().__init__()
        hidden = dim // compress
        self.block = nn.Sequential(nn.ELU(), SConv1d(dim, hidden, kernel, dilation=dilation),
                                   nn.ELU(), SConv1d(hidden, dim, 1))
        self.shortcut = SConv1d(dim, dim, 1)

    def forward(self, x):
        return self.shortcut(x) + self.block(x)


class SEANetEncoder(nn.Module):
    """Audio [B, channels, T] -> latents [B, dimension, ceil(T / prod(ratios))]."""

    def __init__(self, channels: int = 1, dimension: int = 128, n_filters: int = 32, ratios=(8, 5, 4, 2),
                 n_residual_layers: int = 1, lstm: int = 2, kernel: int = 7, last_kernel: int = 7):
        super().__init__()
        layers: list[nn.Module] = [SConv1d(channels, n_filters, kernel)]
        mult = 1
        for ratio in reversed(ratios):  # the encoder downsamples in the reverse order
            for j in range(n_residual_layers):
                layers.append(ResBlock(mult * n_filters, dilation=2 ** j))
            layers += [nn.ELU(), SConv1d(mult * n_filters, 2 * mult * n_filters, 2 * ratio, stride=ratio)]
            mult *= 2
        if lstm:
            layers.append(SLSTM(mult * n_filters, lstm))
        layers += [nn.ELU(), SConv1d(mult * n_filters, dimension, last_kernel)]
        self.model = nn.Sequential(*layers)

    def forward(self, x):
        return self.model(x)


class SEANetDecoder(nn.Module):
    """Latents [B, dimension, F] -> audio [B, channels, F * prod(ratios)]."""

    def __init__(self, channels: int = 1, dimension: int = 128, n_filters: int = 32, ratios=(8, 5, 4, 2),
                 n_residual_layers: int = 1, lstm: int = 2, kernel: int = 7, last_kernel: int = 7):
        super().__init__()
        mult = 2 ** len(ratios)
        layers: list[nn.Module] = [SConv1d(dimension, mult * n_filters, kernel)]
        if lstm:
            layers.append(SLSTM(mult * n_filters, lstm))
        for ratio in ratios:
            layers += [nn.ELU(), SConvTranspose1d(mult * n_filters, mult * n_filters // 2, 2 * ratio, ratio)]
            for j in range(n_residual_layers):
                layers.append(ResBlock(mult * n_filters // 2, dilation=2 ** j))
            mult //= 2
        layers += [nn.ELU(), SConv1d(n_filters, channels, last_kernel)]
        self.model = nn.Sequential(*layers)

    def forward(self, z):
        return self.model(z)
