"""Decode-step attention over a compressed KV cache: one entry point, two backends.

``decode_attention`` attends one query token per sequence to a codec-compressed prefix plus a
native-precision window of recent tokens, in one softmax. On CUDA it runs the fused Triton
kernel (:mod:`kernels.triton.decode_attention`); elsewhere, or for a codec the kernel does not
cover, the PyTorch reference below, which computes the same thing from ``codec.score`` and
``codec.decode_values``. ``backend`` (or the environment variable ``KVCODEC_BACKEND``) forces
either: 'auto' | 'triton' | 'torch'.
"""
from __future__ import annotations

import math

import torch

from .base import BACKENDS, Codec, Encoded, resolve_backend



def _lengths_mask(lengths, B: int, T: int, device) -> torch.Tensor | None:
    """[B, 1, 1, T] bool, True for tokens t < lengths[b]; None when every token counts."""
    if lengths is None:
        return None
    lens = torch.as_tensor(lengths, device=device).reshape(B, 1, 1, 1)
    return torch.arange(T, device=device).reshape(1, 1, 1, T) < lens


def decode_attention_torch(q: torch.Tensor, key_state: Encoded | None, value_state: Encoded | None,
                           codec: Codec, window_k: torch.Tensor | None = None,
                           window_v: torch.Tensor | None = None, lengths=None, scale: float | None = None,
                           window_lengths=None) -> torch.Tensor:
    """PyTorch reference of :func:`decode_attention` (float32 throughout)."""
    B, Hq, Tq, d = q.shape
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    ref = key_state.tensors[next(iter(key_state.tensors))] if key_state is not None else window_k
    Hkv = ref.shape[-3]
    G = Hq // Hkv
    qg = q.reshape(B, Hkv, G * Tq, d)  # query head h reads KV head h // G
    scores, values = [], []
    if key_state is not None and key_state.num_tokens > 0:
        s = codec.score(qg, key_state).float()  # [B, Hkv, G, T]
        keep = _lengths_mask(lengths, B, s.shape[-1], q.device)
        if keep is not None:
            s = s.masked_fill(~keep, float("-inf"))
        scores.append(s)
        values.append(codec.decode_values(value_state).float())
    if window_k is not None and window_k.shape[-2] > 0:
        s = qg.float() @ window_k.float().transpose(-1, -2)
        keep = _lengths_mask(window_lengths, B, s.shape[-1], q.device)
        if keep is not None:
            s = s.masked_fill(~keep, float("-inf"))
        scores.append(s)
        values.append(window_v.float())
    if not scores:
        return torch.zeros_like(q)
    s = torch.cat(scores, -1) * scale
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # a sequence with nothing to attend -> zeros
    out = p @ torch.cat(values, -2)
    return out.reshape(B, Hq, Tq, d).to(q.dtype)


def fused_unsupported(q: torch.Tensor, codec: Codec) -> str | None:
    """None when the fused kernel can run this call, else the reason it cannot."""
    try:
        from .triton import available
        from .triton.decode_attention import supports
    except ImportError as e:  # triton not installed
        return f"triton is not importable ({e})"
    if not available(q.device):
        return f"the Triton kernels need a CUDA device (or TRITON_INTERPRET=1), got {q.device}"
    if q.shape[-2] != 1:
        return f"the fused kernel takes one query token per step, got {q.shape[-2]}"
    return supports(codec, q.dtype)


def decode_attention(q: torch.Tensor, key_state: Encoded | None, value_state: Encoded | None, codec: Codec,
                     window_k: torch.Tensor | None = None, window_v: torch.Tensor | None = None,
                     lengths=None, scale: float | None = None, backend: str = "auto",
                     window_lengths=None) -> torch.Tensor:
    """softmax(q K^T * scale) V over [compressed prefix, native window], for one decode step.

    q:            [B, Hq, 1, d] (bf16, fp16 or fp32); Hq a multiple of Hkv (query head h reads
                  KV head h // (Hq // Hkv)).
    key_state:    ``codec.encode(keys)`` of keys [B, Hkv, T, d] (fields [B, Hkv, T, k]), or None.
    value_state:  ``codec.encode_values(values)`` of values [B, Hkv, T, d], or None.
    codec:        the codec that made both states (built with ``num_heads=Hkv``).
    window_k/v:   native recent tokens [B, Hkv, W, d], after the compressed ones; or None.
    lengths:      int [B] or None: sequence b uses compressed tokens [0, lengths[b]) (right padding).
    window_lengths: int [B] or None: sequence b uses window tokens [0, window_lengths[b]).
    scale:        softmax scale, default 1/sqrt(d).
    backend:      'auto' (fused kernel when it applies; env KVCODEC_BACKEND overrides 'auto'),
                  'triton' (fused kernel or an error saying why not) or 'torch' (reference).
    Returns [B, Hq, 1, d] in q's dtype.
    """
    backend = resolve_backend(backend)
    if backend == "auto" and q.device.type != "cuda":
        backend = "torch"
    if backend != "torch" and key_state is not None and key_state.num_tokens > 0:
        why = fused_unsupported(q, codec)
        if why is None:
            from .triton.decode_attention import decode_attention_fused

            return decode_attention_fused(q, key_state, value_state, codec, window_k, window_v, lengths,
                                          window_lengths, scale)
        if backend == "triton":
            raise RuntimeError(f"backend='triton' cannot run this call: {why}")
    return decode_attention_torch(q, key_state, value_state, codec, window_k, window_v, lengths, scale,
                                  window_lengths)
