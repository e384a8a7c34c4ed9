"""OCTOPUS's triplet quantizer: octahedral direction codes plus a norm code, rounded jointly.

A triplet ``t`` (3 coordinates of a rotated unit vector) is ``rho * s`` with ``rho = ||t||`` and
``s`` on S^2. ``s`` folds to ``(u, v) = octa_encode(s)`` in [-1, 1]^2; ``u`` and ``v`` each take a
``b_u``-bit Lloyd–Max 'octa' centroid, ``rho`` a ``b_r``-bit 'triplet_norm' centroid.

Joint rounding (paper section 3.5): nearest-centroid rounding of (u, v) separately is not the
best direction on the sphere, because the fold bends the grid. Starting from the nearest pair
(iu, iv), search the 3x3 neighbourhood (clipped to the grid) for the pair whose decoded
direction ``s_hat`` maximises <s_hat, s>; then code the norm as the centroid nearest to
``rho * <s_hat, s>``, the length that minimises ||t - r * s_hat|| for that direction.
``rounding='full'`` searches the whole 2^b_u x 2^b_u grid instead (validation only).
"""
from __future__ import annotations

from functools import lru_cache

import torch

from kernels.lloyd_max import codebook, quantize
from kernels.octahedral import octa_decode, octa_encode

#: 3x3 neighbourhood offsets (du, dv), the centre first so that ties keep the nearest pair.
_OFFSETS = ((0, 0), (-1, -1), (-1, 0), (-1, 1), (0, -1), (0, 1), (1, -1), (1, 0), (1, 1))
#: candidate scores per chunk of the full-grid search (bounds its memory)
_FULL_CHUNK = 1 << 22


@lru_cache(maxsize=None)
def _direction_grid_cpu(b_u: int) -> torch.Tensor:
    c = codebook("octa", 0, b_u)
    cu, cv = torch.meshgrid(c, c, indexing="ij")
    return octa_decode(torch.stack((cu, cv), dim=-1)).reshape(-1, 3).contiguous()


def direction_grid(b_u: int, device="cpu") -> torch.Tensor:
    """Decoded directions of every centroid pair: [K*K, 3] float32, row ``iu * K + iv`` (K = 2^b_u),
    made once per device (shared: read only)."""
    return _direction_grid_on(b_u, str(torch.device(device)))


@lru_cache(maxsize=None)
def _direction_grid_on(b_u: int, device: str) -> torch.Tensor:
    return _direction_grid_cpu(b_u).to(device)


@lru_cache(maxsize=None)
def _offsets(device: str) -> torch.Tensor:
    return torch.tensor(_OFFSETS, device=device)  # [9, 2]


def round_directions(s: torch.Tensor, b_u: int, rounding: str = "local") -> tuple[torch.Tensor, torch.Tensor]:
    """s: [..., 3] unit (or zero) directions -> (iu, iv) int64 [...] each.

    ``rounding``: 'nearest' (independent nearest centroids), 'local' (3x3 joint search around
    them) or 'full' (exhaustive over the grid).
    """
    K = 1 << b_u
    grid = direction_grid(b_u, s.device)
    s = s.float()
    if rounding == "full":
        return _round_full(s, grid, K)
    c = codebook("octa", 0, b_u, device=s.device)
    uv = octa_encode(s)
    iu, iv = quantize(uv[..., 0], c), quantize(uv[..., 1], c)
    if rounding == "nearest":
        return iu, iv
    if rounding != "local":
        raise ValueError(f"rounding must be 'local', 'full' or 'nearest', got {rounding!r}")
    off = _offsets(str(s.device))  # [9, 2]
    cu = (iu.unsqueeze(-1) + off[:, 0]).clamp(0, K - 1)  # [..., 9]
    cv = (iv.unsqueeze(-1) + off[:, 1]).clamp(0, K - 1)
    dirs = grid[cu * K + cv]  # [..., 9, 3]
    best = (dirs * s.unsqueeze(-2)).sum(-1).argmax(-1, keepdim=True)  # first max: centre wins ties
    return cu.gather(-1, best).squeeze(-1), cv.gather(-1, best).squeeze(-1)


def _round_full(s: torch.Tensor, grid: torch.Tensor, K: int) -> tuple[torch.Tensor, torch.Tensor]:
    flat = s.reshape(-1, 3)
    out = torch.empty(flat.shape[0], dtype=torch.int64, device=s.device)
    step = max(1, _FULL_CHUNK // grid.shape[0])
    for i in range(0, flat.shape[0], step):
        out[i:i + step] = (flat[i:i + step] @ grid.T).argmax(-1)
    out = out.reshape(s.shape[:-1])
    return out // K, out % K


def encode_triplets(t: torch.Tensor, b_u: int, b_r: int, d_pad: int, rounding: str = "local"
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """t: [..., nt, 3] float32 triplets of rotated unit vectors -> (iu, iv, ir) int64 [..., nt].

    A zero triplet gets s = 0 (every candidate scores 0, the nearest pair stays) and the norm
    centroid nearest to 0, so it decodes to the smallest centroid length, never NaN.
    """
    rho = t.norm(dim=-1)
    s = t / torch.where(rho > 0, rho, torch.ones_like(rho)).unsqueeze(-1)
    iu, iv = round_directions(s, b_u, rounding)
    K = 1 << b_u
    s_hat = direction_grid(b_u, t.device)[iu * K + iv]
    proj = rho * (s_hat * s).sum(-1)
    ir = quantize(proj, codebook("triplet_norm", d_pad, b_r, device=t.device))
    return iu, iv, ir


def decode_triplets(iu: torch.Tensor, iv: torch.Tensor, ir: torch.Tensor, b_u: int, b_r: int,
                    d_pad: int) -> torch.Tensor:
    """Codes [..., nt] -> triplets [..., nt, 3] float32: rho_c[ir] * octa_decode(c[iu], c[iv])."""
    K = 1 << b_u
    dirs = direction_grid(b_u, iu.device)[iu * K + iv]
    rho_c = codebook("triplet_norm", d_pad, b_r, device=iu.device)[ir]
    return rho_c.unsqueeze(-1) * dirs


def direction_cosine(s: torch.Tensor, iu: torch.Tensor, iv: torch.Tensor, b_u: int) -> torch.Tensor:
    """<s_hat, s> [...] of the directions coded (iu, iv)."""
    K = 1 << b_u
    return (direction_grid(b_u, s.device)[iu * K + iv] * s.float()).sum(-1)


def local_full_agreement(s: torch.Tensor, b_u: int, tol: float = 1e-6) -> float:
    """Fraction of directions s: [..., 3] (normalised here) where the 3x3 local search reaches the
    full-grid optimum of <s_hat, s> (within ``tol``; the fold's edges make some pairs decode
    to the same direction, so indices are not compared)."""
    s = s.float()
    s = s / s.norm(dim=-1, keepdim=True).clamp_min(1e-30)
    local = direction_cosine(s, *round_directions(s, b_u, "local"), b_u)
    full = direction_cosine(s, *round_directions(s, b_u, "full"), b_u)
    return float((local >= full - tol).float().mean())
