"""How the fused decode kernels (Triton and the table-lookup CUDA kernel) split a context across
programs: one rule, shared by both launchers."""
from __future__ import annotations

import functools

import torch


def choose_splits(tiles: int, heads: int, slots: int) -> int:
    """Splits per (batch, KV head) of ``tiles`` token tiles, minimising waves x tiles per program,
    where a wave is ``slots`` resident programs and there are ``heads`` (batch x KV head) rows: a split
    count that leaves a last, nearly empty wave costs a whole wave."""
    best, best_cost = 1, None
    for waves in range(1, 9):
        s = max(1, min(tiles, (waves * slots) // heads))
        per = -(-tiles // s)
        s = -(-tiles // per)
        cost = (-(-(heads * s) // slots)) * per + 0.02 * s  # + a little for the combine's work
        if best_cost is None or cost < best_cost:
            best, best_cost = s, cost
    return best


def num_sms(device) -> int:
    """Streaming multiprocessors of a CUDA device (4 elsewhere: the Triton interpreter on the CPU)."""
    device = torch.device(device)
    if device.type != "cuda":
        return 4
    return _sms(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _sms(index: int) -> int:  # asked once per device: the launchers run on every decode step
    return torch.cuda.get_device_properties(index).multi_processor_count


def split_plan(T: int, block_n: int, heads: int, slots: int, num_splits: int | None = None) -> tuple[int, int, int]:
    """(splits, chunk tokens, blocks per split) for ``T`` tokens in blocks of ``block_n`` over ``heads``
    (batch x KV head) rows: ``num_splits`` (default :func:`choose_splits` for ``slots`` resident
    programs), then as few splits as cover T in chunks of whole blocks."""
    tiles = max(1, -(-T // block_n))
    if num_splits is None:
        num_splits = choose_splits(tiles, heads, slots)
    per = -(-tiles // num_splits)
    chunk = per * block_n
    return (max(1, -(-T // chunk)) if T > 0 else 1), chunk, per
