"""Lloyd–Max scalar quantizers and the codebooks every codec uses.

A codebook depends only on (kind, d, bits). The ones in ``kernels/codebooks/`` are made by
``scripts/make_codebooks.py`` (deterministic; a test regenerates one and compares); any
other (kind, d, bits) is trained on first use and cached on disk under
``$KVCODEC_CACHE`` (default ``~/.cache/kvcodec-harness``).

Kinds (``d`` is the rotated, power-of-two dimension):
- ``coord``: one coordinate of a vector uniform on S^{d-1}: density ∝ (1 - x²)^((d-3)/2).
- ``triplet_norm``: the norm of 3 such coordinates: density ∝ ρ² (1 - ρ²)^((d-5)/2) on [0, 1].
- ``octa``: one octahedral coordinate of a direction uniform on S², learned from samples of
  the implemented fold (:mod:`kernels.octahedral`); independent of d.
- ``polar{L}``: PolarQuant's level-L angle. L = 1: uniform on [0, 2π). L >= 2: the angle
  atan2(|b|, |a|) between two Gaussian blocks of 2^(L-1) coordinates, density ∝ sin^(n-1)(2ψ)
  on [0, π/2] with n = 2^(L-1); independent of d.
- ``gauss``: the standard normal (reference figures; tests).
"""
from __future__ import annotations

import json
import math
import os
from functools import lru_cache
from pathlib import Path

import torch

SHIPPED_DIR = Path(__file__).parent / "codebooks"
TOL = 1e-10  # stop when no centroid moves more than TOL * (support width)
MAX_ITER = 20000
GRID = 200_001


def lloyd_max_grid(x: torch.Tensor, w: torch.Tensor, levels: int, tol: float = TOL,
                   max_iter: int = MAX_ITER) -> tuple[torch.Tensor, int]:
    """Lloyd–Max on a weighted 1-D grid (a discretised density, or sorted samples with w = 1).

    Alternates nearest-centroid assignment (thresholds at midpoints) and conditional-mean
    update until no centroid moves more than ``tol`` times the support width.
    Returns (sorted centroids [levels] float64, iterations used).
    """
    x = x.double()
    w = w.double()
    order = torch.argsort(x)
    x, w = x[order], w[order]
    cw = torch.cat([torch.zeros(1, dtype=torch.float64), torch.cumsum(w, 0)])
    cxw = torch.cat([torch.zeros(1, dtype=torch.float64), torch.cumsum(w * x, 0)])
    if levels == 1:
        return (cxw[-1] / cw[-1]).reshape(1), 0
    # initialise at the quantile midpoints of each cell
    q = (torch.arange(levels, dtype=torch.float64) + 0.5) / levels * cw[-1]
    c = x[torch.searchsorted(cw[1:], q).clamp(max=len(x) - 1)]
    span = float(x[-1] - x[0]) or 1.0
    it = 0
    for it in range(1, max_iter + 1):
        thr = (c[1:] + c[:-1]) / 2
        edges = torch.cat([torch.zeros(1, dtype=torch.long), torch.searchsorted(x, thr),
                           torch.tensor([len(x)])])
        mass = cw[edges[1:]] - cw[edges[:-1]]
        mom = cxw[edges[1:]] - cxw[edges[:-1]]
        new = torch.where(mass > 0, mom / mass.clamp_min(1e-300), c)
        new, _ = torch.sort(new)
        moved = float((new - c).abs().max())
        c = new
        if moved < tol * span:
            break
    return c, it


def mse_of(c: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> float:
    """Expected squared error of quantizing the weighted grid (x, w) to centroids c."""
    c = c.double()
    thr = (c[1:] + c[:-1]) / 2
    idx = torch.searchsorted(thr, x.double())
    return float((w.double() * (x.double() - c[idx]) ** 2).sum() / w.double().sum())


# --- densities ----------------------------------------------------------------------------

def density(kind: str, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A fine grid and its (unnormalised) weights for an analytic kind."""
    if kind == "gauss":
        x = torch.linspace(-10, 10, GRID, dtype=torch.float64)
        return x, torch.exp(-x * x / 2)
    if kind == "coord":
        x = torch.linspace(-1, 1, GRID, dtype=torch.float64)
        return x, (1 - x * x).clamp_min(0) ** ((d - 3) / 2)
    if kind == "triplet_norm":
        if d < 4:
            raise ValueError("triplet_norm needs d >= 4")
        x = torch.linspace(0, 1, GRID, dtype=torch.float64)
        return x, x * x * (1 - x * x).clamp_min(0) ** ((d - 5) / 2)
    if kind.startswith("polar"):
        level = int(kind[5:])
        if level == 1:
            x = torch.linspace(0, 2 * math.pi, GRID, dtype=torch.float64)[:-1]
            return x, torch.ones_like(x)
        n = 2 ** (level - 1)
        x = torch.linspace(0, math.pi / 2, GRID, dtype=torch.float64)
        return x, torch.sin(2 * x).clamp_min(0) ** (n - 1)
    raise KeyError(kind)


def octa_samples(n: int = 1 << 21, seed: int = 1234) -> torch.Tensor:
    """u-coordinates of the octahedral fold of n directions uniform on S^2 (both coordinates pooled)."""
    from kernels.octahedral import octa_encode

    g = torch.Generator().manual_seed(seed)
    s = torch.randn(n, 3, generator=g, dtype=torch.float64)
    return octa_encode(s).reshape(-1)


def train(kind: str, d: int, bits: int) -> torch.Tensor:
    levels = 1 << bits
    if kind == "octa":
        x = octa_samples()
        c, _ = lloyd_max_grid(x, torch.ones_like(x), levels)
    else:
        x, w = density(kind, d)
        c, _ = lloyd_max_grid(x, w, levels)
    return c


# --- storage --------------------------------------------------------------------------------

def codebook_key(kind: str, d: int, bits: int) -> str:
    """A codebook's key in the shipped files and the cache, e.g. 'coord/d128/b3'."""
    if kind == "octa" or kind.startswith("polar") or kind == "gauss":
        d = 0  # these marginals do not depend on d
    return f"{kind}/d{d}/b{bits}"


def _cache_dir() -> Path:
    return Path(os.environ.get("KVCODEC_CACHE", Path.home() / ".cache" / "kvcodec-harness")) / "codebooks"


@lru_cache(maxsize=None)
def _shipped(kind: str) -> dict:
    path = SHIPPED_DIR / f"{kind if not kind.startswith('polar') else 'polar'}.json"
    if not path.exists():
        return {}
    return json.loads(path.read_text())


@lru_cache(maxsize=None)
def _codebook_cached(kind: str, d: int, bits: int) -> tuple[float, ...]:
    key = codebook_key(kind, d, bits)
    shipped = _shipped(kind)
    if key in shipped:
        return tuple(shipped[key])
    path = _cache_dir() / (key.replace("/", "_") + ".json")
    if path.exists():
        return tuple(json.loads(path.read_text()))
    c = train(kind, d, bits).tolist()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # processes training it at once write their own
    tmp.write_text(json.dumps(c))
    tmp.replace(path)
    return tuple(c)


def codebook(kind: str, d: int, bits: int, device="cpu") -> torch.Tensor:
    """Sorted float32 centroids [2**bits] for (kind, d, bits), made once per device (shared: read
    only). No host-to-device copy per call, so an encode can be captured in a CUDA graph."""
    if bits < 0 or bits > 10:
        raise ValueError(f"codebook bits must be in 0..10, got {bits}")
    return _codebook_on(kind, d, bits, str(torch.device(device)))


@lru_cache(maxsize=None)
def _codebook_on(kind: str, d: int, bits: int, device: str) -> torch.Tensor:
    return torch.tensor(_codebook_cached(kind, d, bits), dtype=torch.float32, device=device)


def quantize(x: torch.Tensor, centroids: torch.Tensor) -> torch.Tensor:
    """Nearest-centroid indices (int64) of x under sorted centroids."""
    if centroids.numel() == 1:
        return torch.zeros_like(x, dtype=torch.int64)
    thr = (centroids[1:] + centroids[:-1]) / 2
    return torch.searchsorted(thr.contiguous(), x.contiguous().to(thr.dtype))
