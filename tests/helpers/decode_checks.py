"""Shared by the decode-attention tests (Triton and CUDA kernels): the error measure, the reference
log-sum-exp, the readiness check of the table-lookup kernel's GPU tests, and its codecs and lookup
forms."""
from __future__ import annotations

import pytest
import torch
from helpers.tolerances import U16, UNIT_ROUNDOFF, gamma


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| in float32."""
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def ref_lse(q, ks, codec, wk, lengths, scale) -> torch.Tensor:
    """Natural log-sum-exp of the reference's scaled scores over [compressed prefix, window], [B, Hq]: the prefix
    dotted with the query as the codec's engine dots it (``prepare_query``), the window with q."""
    B, Hq, _, d = q.shape
    Hkv = ks.shape[-3]
    qg = q.reshape(B, Hkv, Hq // Hkv, d)
    s = codec.score(codec.prepare_query(q).reshape(qg.shape), ks).float()
    if lengths is not None:
        keep = torch.arange(s.shape[-1], device=s.device) < torch.as_tensor(lengths, device=s.device).reshape(B, 1, 1, 1)
        s = s.masked_fill(~keep, float("-inf"))
    if wk is not None:
        s = torch.cat([s, qg.float() @ wk.float().transpose(-1, -2)], -1)
    return torch.logsumexp(s * scale, -1).reshape(B, Hq)


def out_rtol(dtype: torch.dtype, fp16_roundings: int = 5) -> float:
    """rel_err tolerance of a fused decode attention's output against the reference, to first order: a
    term p_j v_j of the output passes through ``fp16_roundings`` roundings to fp16 (U16 relative each:
    table and split kernels round the rotated query, the rotated key, the probability, the value and
    the split's normalised partial output; the per-token kernel's keys are exact codes, but its values
    may be rotated back in fp16), and both outputs are rounded to their ``dtype`` once."""
    return fp16_roundings * U16 + 2 * UNIT_ROUNDOFF[dtype]


def lse_atol(q, keys, scale, window_k=None, fp16_roundings: int = 2) -> torch.Tensor:
    """Bound on |lse - ref_lse| per query row [B, Hq]: a log-sum-exp moves by at most its largest score's
    move, and a score ``scale * q.k`` from fp16-rounded q and k summed in float32 (by both sides) by at
    most ``(2 U16 + 2 gamma_d) scale sum_i |q_i k_i| <= ... ||q|| ||k||`` (Cauchy-Schwarz: the bound holds in
    whichever rotated frame the kernel takes the product). ``keys``: [B, Hkv, T, d], each key's largest
    contribution (a QJL codec's: its MSE stage's norm plus the correction's); ``window_k`` native keys;
    ``fp16_roundings``: of a score's two factors (a table-lookup kernel's unfused OCTOPUS key takes two)."""
    B, Hq, _, d = q.shape
    kn = keys.float().norm(dim=-1)  # [B, Hkv, T]
    if window_k is not None:
        kn = torch.cat([kn, window_k.float().norm(dim=-1)], -1)
    kmax = kn.amax(-1).repeat_interleave(Hq // kn.shape[1], 1)  # [B, Hq]
    return (fp16_roundings * U16 + 2 * gamma(d)) * scale * q.float().reshape(B, Hq, d).norm(dim=-1) * kmax


def score_atol(q: torch.Tensor, k_hat: torch.Tensor, n: int) -> torch.Tensor:
    """Bound on |codec.score(q, state) - q @ k_hat^T| [..., Tq, T], k_hat = codec.decode(state): two float32
    computations of the same inner product (``n`` rounding steps the longer takes: its d-term dot products,
    the rotations' butterflies, a QJL sketch's sum), each within gamma(n) sum_i |q_i k_i| of it, and
    sum_i |q_i k_i| <= ||q|| ||k_hat|| in whichever rotated frame a codec scores (Cauchy-Schwarz)."""
    return 2 * gamma(n) * q.float().norm(dim=-1, keepdim=True) * k_hat.float().norm(dim=-1).unsqueeze(-2)


def score_keys(codec, ks) -> torch.Tensor:
    """Keys whose norms bound the scores' magnitudes term by term (lse_atol): the reconstruction, or for a
    codec with a QJL residual its MSE stage's reconstruction and the residual's, norms added."""
    k_hat = codec.decode(ks).float()
    stage = getattr(codec, "stage", None)
    if stage is None:
        return k_hat
    k_mse = stage.decode(ks.tensors).float()
    return k_mse * (1 + (k_hat - k_mse).norm(dim=-1, keepdim=True) / k_mse.norm(dim=-1, keepdim=True).clamp_min(1e-30))


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
