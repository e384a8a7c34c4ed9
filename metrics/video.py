"""Video metrics against the uncompressed rollout, per frame.

Frames are float ``[T, 3, H, W]`` in [-1, 1] (decoded, before any uint8 rounding); latents are
``[B, C, F, h, w]``. Each metric returns a float64 tensor of one value per frame (pixel frames for
LPIPS / PSNR / SSIM, latent frames for ``latent_cos``); :func:`summarize` turns that into the
per-prompt mean / min / max and the drift curve is the per-frame series itself.

LPIPS (AlexNet, v0.1) needs ImageNet AlexNet weights, which torchvision would download. We never
download: the weights are read from the local torch hub cache (``$TORCH_HOME/hub/checkpoints/
alexnet-owt-7be5be79.pth``), and without them :func:`lpips_status` says LPIPS is unavailable
and why. With torchvision installed the lpips package computes it; without torchvision (which
lpips imports) the same network is built here from the cached AlexNet weights and the lpips
package's own calibrated linear weights (``lpips/weights/v0.1/alex.pth``).
"""
from __future__ import annotations

import importlib.util
import math
from functools import lru_cache
from pathlib import Path

import torch
import torch.nn.functional as F

from registry import declare_modality

from metrics import shared  # noqa: F401  (defines latent_cos, implemented here for video)
from metrics.registry import register_metric

MODALITY = declare_modality("video")  # before any metric of it registers

DATA_RANGE = 2.0  # frames live in [-1, 1]
ALEXNET_FILE = "alexnet-owt-7be5be79.pth"  # torchvision's AlexNet_Weights.IMAGENET1K_V1
FRAME_CHUNK = 16  # frames per batched metric call (bounds memory at 480x832)


class MetricUnavailable(RuntimeError):
    """A metric that cannot be computed here; the message says why (shown in the report)."""


def _check(pred: torch.Tensor, ref: torch.Tensor) -> None:
    if pred.shape != ref.shape:
        raise ValueError(f"frames differ in shape: {tuple(pred.shape)} vs reference {tuple(ref.shape)}")
    if pred.dim() != 4 or pred.shape[1] != 3:
        raise ValueError(f"frames must be [T, 3, H, W], got {tuple(pred.shape)}")


# --- PSNR / SSIM / latent cosine -----------------------------------------------------------------
@register_metric("psnr", "video", higher_is_better=True, scale="dB", display="PSNR (dB)",
                 description="PSNR (dB) of decoded frames in [-1,1] vs the uncompressed rollout; inf when identical")
def psnr_frames(pred: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """[T] PSNR = 10 log10(range^2 / MSE) per frame, range 2; +inf for an identical frame."""
    _check(pred, ref)
    mse = (pred.double() - ref.double()).pow(2).flatten(1).mean(1)
    return 10 * torch.log10(DATA_RANGE ** 2 / mse)  # mse 0 -> +inf


def psnr_video(pred: torch.Tensor, ref: torch.Tensor) -> float:
    """One PSNR for the whole video, from the MSE over all its frames (finite unless all identical).

    The per-prompt PSNR: a mean of per-frame PSNRs would be +inf whenever one frame is identical,
    and the first block of a causal rollout always is (it attends to an empty cache).
    """
    _check(pred, ref)
    mse = (pred.double() - ref.double()).pow(2).mean()
    return float(10 * torch.log10(DATA_RANGE ** 2 / mse))


@register_metric("ssim", "video", higher_is_better=True, display="SSIM",
                 description="SSIM (Gaussian 11x11, sigma 1.5, RGB mean) of decoded frames vs the uncompressed rollout")
def ssim_frames(pred: torch.Tensor, ref: torch.Tensor, device: str | None = None) -> torch.Tensor:
    """[T] SSIM per frame (torchmetrics: Gaussian window 11, sigma 1.5, K = 0.01, 0.03, range 2).

    Computed in float64 on CUDA and float32 on a CPU (float64 convolutions are slow there; CUDA's
    float32 convolutions may round through TF32); a frame identical to its reference is exactly 1,
    as SSIM defines it, rather than 1 up to rounding.
    """
    from torchmetrics.functional.image import structural_similarity_index_measure as ssim
    _check(pred, ref)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.float64 if torch.device(device).type == "cuda" else torch.float32
    out = [ssim(p.to(device, dtype), r.to(device, dtype), data_range=DATA_RANGE, reduction="none").double().cpu()
           for p, r in zip(pred.split(FRAME_CHUNK), ref.split(FRAME_CHUNK))]
    s = torch.cat(out)
    same = (pred == ref).flatten(1).all(1)
    return torch.where(same, torch.ones_like(s), s)


@register_metric("latent_cos", "video")
def latent_cosine_frames(pred: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """latents [B, C, F, h, w] -> [F] cosine of the flattened (B, C, h, w) vectors of each frame."""
    if pred.shape != ref.shape or pred.dim() != 5:
        raise ValueError(f"latents must both be [B, C, F, h, w], got {tuple(pred.shape)} and {tuple(ref.shape)}")
    p = pred.double().transpose(0, 2).flatten(1)  # [F, B*C*h*w]
    r = ref.double().transpose(0, 2).flatten(1)
    return (p * r).sum(1) / (p.norm(dim=1) * r.norm(dim=1)).clamp_min(1e-300)


# --- LPIPS ---------------------------------------------------------------------------------------
def _alexnet_weights() -> Path | None:
    d = Path(torch.hub.get_dir()) / "checkpoints"
    exact = d / ALEXNET_FILE
    if exact.is_file():
        return exact
    others = sorted(d.glob("alexnet-*.pth")) if d.is_dir() else []
    return others[0] if others else None


def lpips_status() -> tuple[bool, str]:
    """(available, how or why not). Never downloads anything."""
    w = _alexnet_weights()
    if w is None:
        return False, (f"LPIPS unavailable: the ImageNet AlexNet weights are not in the local torch hub cache "
                       f"({Path(torch.hub.get_dir()) / 'checkpoints' / ALEXNET_FILE}); nothing is downloaded. "
                       f"Copy that file there (it is torchvision's alexnet IMAGENET1K_V1) to enable LPIPS.")
    if importlib.util.find_spec("lpips") is None:
        return False, "LPIPS unavailable: the lpips package is not installed (pip install lpips --no-deps)"
    return True, f"LPIPS (AlexNet, v0.1) from {w}"


class _AlexTrunk(torch.nn.Module):
    """torchvision's AlexNet ``features`` (same layer indices, so its state dict loads), returning
    the five ReLU outputs LPIPS compares."""

    def __init__(self):
        super().__init__()
        C, R, M = torch.nn.Conv2d, torch.nn.ReLU, torch.nn.MaxPool2d
        self.features = torch.nn.Sequential(
            C(3, 64, 11, 4, 2), R(), M(3, 2), C(64, 192, 5, padding=2), R(), M(3, 2),
            C(192, 384, 3, padding=1), R(), C(384, 256, 3, padding=1), R(), C(256, 256, 3, padding=1), R())

    def forward(self, x):
        outs = []
        for i, layer in enumerate(self.features):
            x = layer(x)
            if i in (1, 4, 7, 9, 11):
                outs.append(x)
        return outs


class LocalLPIPS(torch.nn.Module):
    """LPIPS v0.1 (AlexNet) as the lpips package computes it, without importing torchvision."""

    SHIFT = (-0.030, -0.088, -0.188)
    SCALE = (0.458, 0.448, 0.450)

    def __init__(self, alexnet_path: Path, lin_path: Path):
        super().__init__()
        self.trunk = _AlexTrunk()
        sd = torch.load(str(alexnet_path), map_location="cpu", weights_only=True)
        self.trunk.load_state_dict({k: v for k, v in sd.items() if k.startswith("features.")}, strict=True)
        lin = torch.load(str(lin_path), map_location="cpu", weights_only=True)
        self.lins = torch.nn.ParameterList([torch.nn.Parameter(lin[f"lin{i}.model.1.weight"]) for i in range(5)])
        self.register_buffer("shift", torch.tensor(self.SHIFT).view(1, 3, 1, 1))
        self.register_buffer("scale", torch.tensor(self.SCALE).view(1, 3, 1, 1))
        self.eval().requires_grad_(False)

    def forward(self, in0, in1):
        f0 = self.trunk((in0 - self.shift) / self.scale)
        f1 = self.trunk((in1 - self.shift) / self.scale)
        total = 0
        for a, b, w in zip(f0, f1, self.lins):
            a = a / (a.pow(2).sum(1, keepdim=True).sqrt() + 1e-10)
            b = b / (b.pow(2).sum(1, keepdim=True).sqrt() + 1e-10)
            total = total + F.conv2d((a - b) ** 2, w).mean((2, 3), keepdim=True)
        return total  # [N, 1, 1, 1]


@lru_cache(maxsize=4)
def _lpips_model(device: str):
    ok, why = lpips_status()
    if not ok:
        raise MetricUnavailable(why)
    try:
        import torchvision  # noqa: F401  (lpips imports it)
    except ImportError:
        pkg = Path(importlib.util.find_spec("lpips").origin).parent
        return LocalLPIPS(_alexnet_weights(), pkg / "weights" / "v0.1" / "alex.pth").to(device)
    import lpips
    return lpips.LPIPS(net="alex", version="0.1", verbose=False).eval().requires_grad_(False).to(device)


@register_metric("lpips", "video", higher_is_better=False, display="LPIPS",
                 description="LPIPS (AlexNet, v0.1) of decoded frames vs the uncompressed rollout; 0 when identical")
def lpips_frames(pred: torch.Tensor, ref: torch.Tensor, device: str | None = None) -> torch.Tensor:
    """[T] LPIPS per frame; raises :class:`MetricUnavailable` (with the reason) when it cannot be computed."""
    _check(pred, ref)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    net = _lpips_model(device)
    out = []
    with torch.no_grad():
        for p, r in zip(pred.split(FRAME_CHUNK), ref.split(FRAME_CHUNK)):
            out.append(net(p.float().to(device), r.float().to(device)).flatten().double().cpu())
    return torch.cat(out)


# --- aggregation ---------------------------------------------------------------------------------
def summarize(values: torch.Tensor) -> dict[str, float]:
    """Per-prompt aggregate of a per-frame series: mean, min, max (inf-aware: mean of all-inf is inf)."""
    v = values.double()
    return {"mean": float(v.mean()), "min": float(v.min()), "max": float(v.max())}


def finite_or_none(x: float):
    """JSON-safe value: None stands for +-inf / nan in drift files (they are written as strings too)."""
    return x if math.isfinite(x) else None
