"""Shared by the decode-attention tests (Triton and CUDA kernels): the error measure, the reference
log-sum-exp and the readiness check of the table-lookup kernel's GPU tests."""
from __future__ import annotations

import pytest
import torch


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| in float32."""
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def ref_lse(q, ks, codec, wk, lengths, scale) -> torch.Tensor:
    """Natural log-sum-exp of the reference's scaled scores over [compressed prefix, window], [B, Hq]."""
    B, Hq, _, d = q.shape
    Hkv = ks.tensors["norm"].shape[-3]
    qg = q.reshape(B, Hkv, Hq // Hkv, d)
    s = codec.score(qg, ks).float()
    if lengths is not None:
        keep = torch.arange(s.shape[-1], device=s.device) < torch.as_tensor(lengths, device=s.device).reshape(B, 1, 1, 1)
        s = s.masked_fill(~keep, float("-inf"))
    if wk is not None:
        s = torch.cat([s, qg.float() @ wk.float().transpose(-1, -2)], -1)
    return torch.logsumexp(s * scale, -1).reshape(B, Hq)


def _lut_gpu_missing() -> str | None:
    """Why the table-lookup kernel cannot run here (it needs Hopper and CuPy), or None."""
    if not torch.cuda.is_available():
        return "needs CUDA"
    if torch.cuda.get_device_capability() < (9, 0):
        return "needs sm_90"
    try:
        import cupy  # noqa: F401
    except ImportError:
        return "needs cupy"
    return None


LUT_GPU_SKIP = _lut_gpu_missing()
lut_gpu = pytest.mark.skipif(LUT_GPU_SKIP is not None, reason=LUT_GPU_SKIP or "")
#: the codecs the table-lookup kernel reads, and those of them with a QJL residual
LUT_CODECS = ("octopus", "turboquant-mse", "octopus-qjl", "turboquant-prod")
LUT_QJL_CODECS = ("octopus-qjl", "turboquant-prod")
