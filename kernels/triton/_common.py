"""Device helpers shared by the fused encoders: the rotation butterfly, nearest-centroid search and
bit packing, each written to reproduce the PyTorch reference operation for operation."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.rotation import Rotation


@triton.jit
def fwht_rows(x, BT: tl.constexpr, N: tl.constexpr, LOG2N: tl.constexpr):
    """Unnormalised Walsh-Hadamard transform of each row of x [BT, N] in the butterfly order of
    :func:`kernels.rotation.fwht` (pairs at distance 1, 2, 4, ...: (a + b, a - b)), so fp32
    results match the reference bit for bit."""
    for stage in tl.static_range(LOG2N):
        y = tl.permute(tl.reshape(x, [BT, N // (2 << stage), 2, 1 << stage]), (0, 1, 3, 2))
        a, b = tl.split(y)
        y = tl.permute(tl.join(a + b, a - b), (0, 1, 3, 2))
        x = tl.reshape(y, [BT, N])
    return x


@triton.jit
def sum_rows(x, BT: tl.constexpr, N: tl.constexpr, LOG2N: tl.constexpr):
    """Row sums of x [BT, N] (N a power of two) -> [BT], by a fixed pairwise tree (the second half
    added to the first, N / 2 then N / 4 ... wide), so the rounding does not depend on BT or on how
    the compiler lays the block out: an encoder gives a row the same bytes in any block of rows."""
    for stage in tl.static_range(LOG2N):
        a, b = tl.split(tl.permute(tl.reshape(x, [BT, 2, N >> (stage + 1)]), (0, 2, 1)))
        x = a + b
    return tl.reshape(x, [BT])


def rows_per_program(n: int) -> tuple[int, int]:
    """(rows each encoder program takes, its warps) for ``n`` rows: 16 rows on 4 warps for a prefill's
    many; 2 rows on one warp for a decode step's few (B x Hkv), which one program of 16 rows would
    encode one after another (an OCTOPUS key encode of 4 rows: 25 us in one program, 9 us in two,
    on an H200). One warp keeps a small block's gathers within the warp, as Triton requires."""
    return (16, 4) if n > 1024 else (2, 1)


@triton.jit
def load_rows(X, N, D: tl.constexpr, NP: tl.constexpr, BT: tl.constexpr):
    """This program's BT rows of X [N, D] as fp32 [BT, NP], columns past D zero (the references'
    padding) -> (row indices, row mask, x)."""
    rows = tl.program_id(0) * BT + tl.arange(0, BT)
    rm = rows < N
    cols = tl.arange(0, NP)
    x = tl.load(X + rows[:, None].to(tl.int64) * D + cols[None, :], mask=rm[:, None] & (cols < D)[None, :],
                other=0.0).to(tl.float32)
    return rows, rm, x


@triton.jit
def count_below(x, THR, NTHR: tl.constexpr):
    """Nearest-centroid index as ``torch.searchsorted(thr, x)``: how many thresholds are < x."""
    idx = tl.zeros(x.shape, tl.int32)
    for j in tl.static_range(NTHR):
        idx += (x > tl.load(THR + j)).to(tl.int32)
    return idx


@triton.jit
def pack_bytes(codes, NC: tl.constexpr, NCP: tl.constexpr, BITS: tl.constexpr, NBP: tl.constexpr):
    """codes int32 [BT, NCP] (the first NC real, each < 2**BITS) -> bytes int32 [BT, NBP] of the
    dense LSB-first bitstream of :class:`kernels.packing.BitField` (code i at bits [i*BITS, ...))."""
    j = tl.arange(0, NBP)
    i0 = (8 * j) // BITS
    out = tl.zeros([codes.shape[0], NBP], tl.int32)
    KMAX: tl.constexpr = (8 + BITS - 1) // BITS + 1  # codes that can touch one byte
    for k in tl.static_range(KMAX):
        i = i0 + k
        sh = BITS * i - 8 * j  # where code i starts, relative to byte j
        ok = (i < NC) & (sh < 8)
        src = tl.minimum(i, NCP - 1)
        c = tl.gather(codes, tl.broadcast_to(src[None, :], [codes.shape[0], NBP]), 1)
        part = tl.where(sh >= 0, c << tl.maximum(sh, 0)[None, :], c >> tl.maximum(-sh, 0)[None, :])
        out = out | tl.where(ok[None, :], part, 0)
    return out & 0xFF


def thresholds(centroids: torch.Tensor) -> torch.Tensor:
    """Decision thresholds exactly as :func:`kernels.lloyd_max.quantize` computes them (fp32)."""
    c = centroids.float()
    if c.numel() == 1:
        return torch.zeros(1, dtype=torch.float32, device=c.device)  # never read (0 thresholds)
    return ((c[1:] + c[:-1]) / 2).contiguous()


def rotation_signs(rot: Rotation, device) -> torch.Tensor:
    """[heads, padded] fp32 ±1."""
    return rot.signs[:, 0, :].to(device=device, dtype=torch.float32).contiguous()


def head_layout(shape: tuple[int, ...], num_heads: int) -> tuple[int, int]:
    """(T, H) such that row r of keys [..., H, T, d] flattened to [N, d] has head (r // T) % H."""
    if num_heads == 1:
        return 1, 1
    if len(shape) < 3 or shape[-3] != num_heads:
        raise ValueError(f"expected keys [..., {num_heads}, T, d], got {tuple(shape)}")
    return shape[-2], num_heads
