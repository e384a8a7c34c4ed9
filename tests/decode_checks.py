"""Shared by the decode-attention tests (Triton and CUDA kernels): the error measure, the reference
log-sum-exp, the readiness check of the table-lookup kernel's GPU tests, and its codecs and lookup
forms."""
from __future__ import annotations

import pytest
import torch


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| in float32."""
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def ref_lse(q, ks, codec, wk, lengths, scale) -> torch.Tensor:
    """Natural log-sum-exp of the reference's scaled scores over [compressed prefix, window], [B, Hq]."""
    B, Hq, _, d = q.shape
    Hkv = ks.shape[-3]
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


#: the table-lookup kernel's lookup forms of each key layout (config keys): OCTOPUS fused / unfused, TurboQuant pairs / quads
LUT_FORMS = [("octopus", {"fused": True}), ("octopus", {"fused": False}),
         ("turboquant-mse", {"pairs": True}), ("turboquant-mse", {"pairs": False})]


#: the GPU kernel's forms: FORMS and the QJL codecs' (the same key stages with the residual on top)
LUT_GPU_FORMS = LUT_FORMS + [("octopus-qjl", {"fused": True}), ("octopus-qjl", {"fused": False}),
                     ("turboquant-prod", {"pairs": True})]


def lut_form_unsupported(name, bits, form) -> str | None:
    """Why (name, bits, form) is not a case: a bit width the codec lacks, or OCTOPUS's unfused table
    at b_r = 0 (no triplet-length code: only the fused table carries the one length centroid), or a
    layout the kernel does not cover (supports(), values of 2-4 bits)."""
    from kernels import make_codec
    from kernels.cuda.decode_lut import supports
    from kernels.registry import codec_class

    if bits not in codec_class(name).bits_supported:
        return f"{name} has no {bits}-bit form"
    codec = make_codec(name, bits, 128, value_bits=min(max(bits, 2), 4))
    if supports(codec):
        return supports(codec)
    if form.get("fused") is False and codec.fused_layout().bits[1] == 0:
        return "unfused table without a length code"
    return None
