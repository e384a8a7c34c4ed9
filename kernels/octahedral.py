"""Octahedral map between unit 3-vectors and the square [-1, 1]^2, and its exact inverse.

Upper hemisphere (z >= 0): (u, v) = (x, y) / (|x| + |y| + |z|). Lower hemisphere: the
projected point is folded over the diagonals, (u, v) = ((1 - |y'|) sgn x, (1 - |x'|) sgn y).
sgn(0) = +1 on both sides, which makes the pair an exact bijection between the sphere and
the square (up to float rounding), including the equator and the poles.
"""
from __future__ import annotations

import torch


def _sgn(x: torch.Tensor) -> torch.Tensor:
    return torch.where(x >= 0, 1.0, -1.0).to(x.dtype)


def octa_encode(s: torch.Tensor) -> torch.Tensor:
    """s: [..., 3] (any nonzero norm) -> [..., 2] in [-1, 1]^2."""
    l1 = s.abs().sum(-1, keepdim=True).clamp_min(torch.finfo(s.dtype).tiny)
    p = s / l1
    x, y, z = p[..., 0], p[..., 1], p[..., 2]
    fu = (1 - y.abs()) * _sgn(x)
    fv = (1 - x.abs()) * _sgn(y)
    lower = z < 0
    return torch.stack((torch.where(lower, fu, x), torch.where(lower, fv, y)), dim=-1)


def octa_decode(uv: torch.Tensor) -> torch.Tensor:
    """uv: [..., 2] in [-1, 1]^2 -> unit vectors [..., 3]."""
    u, v = uv[..., 0], uv[..., 1]
    z = 1 - u.abs() - v.abs()
    lower = z < 0
    x = torch.where(lower, (1 - v.abs()) * _sgn(u), u)
    y = torch.where(lower, (1 - u.abs()) * _sgn(v), v)
    s = torch.stack((x, y, z), dim=-1)
    return s / s.norm(dim=-1, keepdim=True)
