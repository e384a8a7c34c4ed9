"""The octahedral map: exact round trip on the sphere, bijection with the square."""
import pytest
import torch
from helpers.tolerances import U32, U64, gamma

from kernels.octahedral import octa_decode, octa_encode


def round_trip_tol(u: float) -> float:
    """Absolute error of a round trip between sphere and square at unit roundoff u: encode's 3-term L1 sum and
    division, the fold's 1 - |.|, decode's z = 1 - |u| - |v| (each coordinate within gamma(10) of its exact
    value, all at most 1), then the normalisation, which at most doubles a relative error and divides by
    ||p||_2 >= ||p||_1 / sqrt(3) (3 times sqrt(3) over 3 coordinates), plus its own norm and division."""
    return 6 * gamma(10, u) + gamma(5, u)


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


@pytest.mark.parametrize("dtype,u", [(torch.float64, U64), (torch.float32, U32)])
def test_round_trip_sphere(dtype, u):
    g = torch.Generator().manual_seed(0)
    s = torch.cat([torch.randn(20000, 3, generator=g, dtype=torch.float64), _special_directions()])
    s = (s / s.norm(dim=-1, keepdim=True)).to(dtype)
    back = octa_decode(octa_encode(s))
    torch.testing.assert_close(back, s, atol=round_trip_tol(u), rtol=0)
    # a normalised vector: its 3-term norm, square root and division, against s's own (also normalised)
    torch.testing.assert_close(back.norm(dim=-1), torch.ones(len(s), dtype=dtype), atol=2 * gamma(5, u), rtol=0)


def test_encode_scale_invariant_and_inside_square():
    g = torch.Generator().manual_seed(1)
    s = torch.cat([torch.randn(20000, 3, generator=g, dtype=torch.float64), _special_directions()])
    uv = octa_encode(s)
    assert uv.abs().max() <= 1.0
    # the scaled input's rounding and its L1 sum's (a few U64 relative), through the fold's 1 - |.|
    torch.testing.assert_close(octa_encode(s * 7.5), uv, atol=2 * gamma(6, U64), rtol=0)
    # the upper hemisphere lands inside the diamond |u| + |v| <= 1, the lower one outside it
    l1 = uv.abs().sum(-1)
    up = s[:, 2] > 1e-9
    down = s[:, 2] < -1e-9
    # |x| + |y| of p = s / ||s||_1 is 1 - |z| up to the L1 sum's and the division's rounding; folded, 1 + |z|
    assert bool((l1[up] <= 1 + gamma(6, U64)).all()) and bool((l1[down] >= 1 - gamma(6, U64)).all())
    # upper hemisphere: (u, v) is the L1 projection (x, y) / (|x| + |y| + |z|)
    p = s / s.abs().sum(-1, keepdim=True)
    assert torch.equal(uv[up], p[up, :2])  # the same operations


def test_bijective_from_square():
    g = torch.Generator().manual_seed(2)
    uv = torch.rand(50000, 2, generator=g, dtype=torch.float64) * 2 - 1
    grid = torch.linspace(-0.999, 0.999, 41, dtype=torch.float64)
    uv = torch.cat([uv, torch.cartesian_prod(grid, grid)])
    back = octa_encode(octa_decode(uv))
    torch.testing.assert_close(back, uv, atol=round_trip_tol(U64), rtol=0)


def test_square_edges_fold():
    # the square's edges are identified pairwise ((1, v) ~ (1, -v)); decode is still exact on them
    v = torch.linspace(-1, 1, 11, dtype=torch.float64)
    ones = torch.ones_like(v)
    a = octa_decode(torch.stack((ones, v), -1))
    b = octa_decode(torch.stack((ones, -v), -1))
    assert torch.equal(a, b)  # on the edge u = 1: x = 1 - |v| and y = 0 whatever v's sign
    torch.testing.assert_close(octa_decode(octa_encode(a)), a, atol=round_trip_tol(U64), rtol=0)
