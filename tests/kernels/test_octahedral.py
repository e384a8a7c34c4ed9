"""The octahedral map: exact round trip on the sphere, bijection with the square."""
import pytest
import torch

from kernels.octahedral import octa_decode, octa_encode


def _special_directions() -> torch.Tensor:
    r = 2 ** -0.5
    pts = [
        (0, 0, 1), (0, 0, -1),  # poles
        (1, 0, 0), (-1, 0, 0), (0, 1, 0), (0, -1, 0),  # axes on the equator
        (r, r, 0), (-r, r, 0), (r, -r, 0), (-r, -r, 0),  # equator diagonals
        (r, 0, r), (r, 0, -r), (0, -r, -r), (-r, 0, -r),
        (1, 1, 1), (1, -1, -1), (-1, -1, -1), (-1, 1, -1),  # octant centres
        (0.6, 0.0, -0.8), (0.0, -0.6, 0.8), (1e-7, 0, -1), (-1e-7, 1e-7, -1),  # near the south pole
    ]
    return torch.tensor(pts, dtype=torch.float64)


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 2e-6)])
def test_round_trip_sphere(dtype, tol):
    g = torch.Generator().manual_seed(0)
    s = torch.cat([torch.randn(20000, 3, generator=g, dtype=torch.float64), _special_directions()])
    s = (s / s.norm(dim=-1, keepdim=True)).to(dtype)
    back = octa_decode(octa_encode(s))
    assert torch.allclose(back, s, atol=tol, rtol=0)
    assert torch.allclose(back.norm(dim=-1), torch.ones(len(s), dtype=dtype), atol=tol)


def test_encode_scale_invariant_and_inside_square():
    g = torch.Generator().manual_seed(1)
    s = torch.cat([torch.randn(20000, 3, generator=g, dtype=torch.float64), _special_directions()])
    uv = octa_encode(s)
    assert uv.abs().max() <= 1.0
    assert torch.allclose(octa_encode(s * 7.5), uv, atol=1e-12)
    # the upper hemisphere lands inside the diamond |u| + |v| <= 1, the lower one outside it
    l1 = uv.abs().sum(-1)
    up = s[:, 2] > 1e-9
    down = s[:, 2] < -1e-9
    assert bool((l1[up] <= 1 + 1e-12).all()) and bool((l1[down] >= 1 - 1e-12).all())
    # upper hemisphere: (u, v) is the L1 projection (x, y) / (|x| + |y| + |z|)
    p = s / s.abs().sum(-1, keepdim=True)
    assert torch.allclose(uv[up], p[up, :2], atol=1e-12)


def test_bijective_from_square():
    g = torch.Generator().manual_seed(2)
    uv = torch.rand(50000, 2, generator=g, dtype=torch.float64) * 2 - 1
    grid = torch.linspace(-0.999, 0.999, 41, dtype=torch.float64)
    uv = torch.cat([uv, torch.cartesian_prod(grid, grid)])
    back = octa_encode(octa_decode(uv))
    assert torch.allclose(back, uv, atol=1e-12, rtol=0)


def test_square_edges_fold():
    # the square's edges are identified pairwise ((1, v) ~ (1, -v)); decode is still exact on them
    v = torch.linspace(-1, 1, 11, dtype=torch.float64)
    ones = torch.ones_like(v)
    a = octa_decode(torch.stack((ones, v), -1))
    b = octa_decode(torch.stack((ones, -v), -1))
    assert torch.allclose(a, b, atol=1e-12)
    assert torch.allclose(octa_decode(octa_encode(a)), a, atol=1e-12)
