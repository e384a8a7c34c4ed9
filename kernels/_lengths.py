"""Per-sequence lengths as the kernels take them (shared by the Triton and the CUDA launchers)."""
from __future__ import annotations

import torch


def as_lengths(lengths, B: int, device) -> torch.Tensor:
    """``lengths`` (sequence, tensor) as a contiguous int32 tensor of shape [B] on ``device``."""
    lens = torch.as_tensor(lengths, device=device)
    if lens.dtype != torch.int32:
        lens = lens.to(torch.int32)
    if lens.shape != (B,):
        raise ValueError(f"lengths must have shape [{B}], got {tuple(lens.shape)}")
    return lens.contiguous()
