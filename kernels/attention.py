"""Attention over a compressed KV cache: one PyTorch core, and the decode-step dispatch.

:func:`attend` is the one PyTorch attention of the project: queries (many tokens, GQA) against,
in token order, a codec-compressed prefix, a native window of recent tokens and native tokens in
flight, with masks, causal order and per-sequence lengths, in one float32 softmax. The cache
(:meth:`adapters.cache.kv_cache.LayerKV.attend`) and the decode-step reference
(:func:`decode_attention_torch`) both call it.

:func:`decode_attention` attends one query token per sequence: on CUDA the table-lookup CUDA
kernel (:mod:`kernels.cuda.decode_lut`, OCTOPUS and TurboQuant-MSE, with or without a QJL residual) where it covers the call, else the fused Triton
kernel (:mod:`kernels.triton.decode_attention`; :mod:`kernels.triton.token_attention` for a codec that
declares a token layout, the engines' presets) where it covers the codec, else :func:`attend`.
The choice is :func:`kernels.backend.decide`'s ('auto' | 'lut' | 'triton' | 'torch', env
``KVCODEC_BACKEND``); :func:`decide_attention` returns it with the reason each path was passed over.
"""
from __future__ import annotations

import math

import torch

from kernels.backend import ATTENTION_PATHS, Decision, decide, resolve_backend, triton_unavailable
from kernels.base import Codec, Encoded


def _lengths_mask(lengths, B: int, T: int, device) -> torch.Tensor | None:
    """[B, 1, 1, T] bool, True for tokens t < lengths[b]; None when every token counts."""
    if lengths is None:
        return None
    lens = torch.as_tensor(lengths, device=device).reshape(B, 1, 1, 1)
    return torch.arange(T, device=device).reshape(1, 1, 1, T) < lens


def attend(q: torch.Tensor, codec: Codec | None = None, key_state: Encoded | None = None,
           value_state: Encoded | None = None, decoded: tuple[torch.Tensor, torch.Tensor] | None = None,
           window_k: torch.Tensor | None = None, window_v: torch.Tensor | None = None,
           k_new: torch.Tensor | None = None, v_new: torch.Tensor | None = None, *, lengths=None,
           window_lengths=None, mask: torch.Tensor | None = None, causal: bool = False,
           scale: float | None = None, softcap: float | None = None) -> torch.Tensor:
    """softmax(cap(q K^T * scale) + mask) V over [compressed prefix, window, k_new], float32 throughout.

    q:            [B, Hq, Tq, d]; Hq a multiple of Hkv (query head h reads KV head h // (Hq // Hkv)).
    The compressed prefix, T tokens, one of:
      key_state, value_state: ``codec.encode(keys)``, ``codec.encode_values(values)`` of [B, Hkv, T, d],
                    scored with ``codec.score`` (its estimator), values ``codec.decode_values``;
      decoded:      (keys, values) [B, Hkv, T, d] already decoded, attended by plain dot products.
    window_k/v:   native recent tokens [B, Hkv, W, d], after the prefix; or None.
    k_new/v_new:  tokens in flight [B, Hkv, t, d], after the window: native, or ``codec.encode`` /
                  ``codec.encode_values`` states where the engine attends them as stored; or None.
    lengths:      int [B] or None: sequence b uses prefix tokens [0, lengths[b]) (right padding).
    window_lengths: int [B] or None: sequence b uses window tokens [0, window_lengths[b]).
    mask:         bool (True = keep) or additive, broadcastable to [B, Hq, Tq, T + W + t].
    causal:       the Tq queries are the last Tq positions of all the keys and see only keys up to
                  their own position (on top of ``mask``).
    scale:        softmax scale, default 1/sqrt(d).
    softcap:      attention logit soft-capping (Gemma 2): cap(s) = softcap * tanh(s / softcap) on the
                  scaled scores, before the mask; None: no capping.
    Returns [B, Hq, Tq, d] in q's dtype; a query with nothing to attend gets zeros.

    The compressed tokens (prefix, decoded or not, and encoded tokens in flight) are dotted with
    ``codec.prepare_query(q)``, the query as the codec's engine dots it with its cache (llama.cpp quantizes it);
    native tokens with q itself.
    """
    B, Hq, Tq, d = q.shape
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    if key_state is not None and key_state.num_tokens == 0:
        key_state = None
    ref = next((t for t in (decoded[0] if decoded else None, window_k, k_new) if t is not None), None)
    if key_state is None and ref is None:  # nothing to attend
        return torch.zeros_like(q)
    Hkv = key_state.shape[-3] if key_state is not None else ref.shape[-3]
    G = Hq // Hkv
    qg = q.reshape(B, Hkv, G * Tq, d)  # query heads grouped by the KV head they read
    qc = qg if codec is None else codec.prepare_query(q).reshape(B, Hkv, G * Tq, d)  # for the compressed tokens
    scores, values = [], []  # per part: [B, Hkv, G * Tq, n] float32, [B, Hkv, n, d] float32
    if key_state is not None:
        scores.append(codec.score(qc, key_state).float())
        values.append(codec.decode_values(value_state).float())
    elif decoded is not None:
        scores.append(qc.float() @ decoded[0].float().transpose(-1, -2))
        values.append(decoded[1].float())
    # per part, which of its tokens each sequence holds ([B, 1, 1, n] bool, None: all): applied with
    # the other masks after the soft-cap, which would turn a -inf score into a finite -softcap
    keeps = [_lengths_mask(lengths, B, scores[0].shape[-1], q.device)] if scores else []
    for k, v, lens in ((window_k, window_v, window_lengths), (k_new, v_new, None)):
        if isinstance(k, Encoded) and k.num_tokens > 0:  # in flight, attended as the engine stores them
            scores.append(codec.score(qc, k).float())
            keeps.append(None)
            values.append(codec.decode_values(v).float())
        elif k is not None and k.shape[-2] > 0:
            scores.append(qg.float() @ k.float().transpose(-1, -2))
            keeps.append(_lengths_mask(lens, B, scores[-1].shape[-1], q.device))
            values.append(v.float())
    if not scores:
        return torch.zeros_like(q)
    s = torch.cat(scores, -1).reshape(B, Hq, Tq, -1) * scale
    if softcap is not None:  # as the models' eager attention does it: on the scaled scores, before the mask
        s = torch.tanh(s / softcap) * softcap
    if any(k is not None for k in keeps):
        keep = torch.cat([torch.ones(B, 1, 1, p.shape[-1], dtype=torch.bool, device=q.device) if k is None else k
                          for k, p in zip(keeps, scores)], -1)
        s = s.masked_fill(~keep, float("-inf"))
    T = s.shape[-1]
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask.float()
    if causal and Tq > 1:
        qpos = torch.arange(T - Tq, T, device=s.device).unsqueeze(-1)
        s = s.masked_fill(torch.arange(T, device=s.device) > qpos, float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0).reshape(B, Hkv, G * Tq, T)  # nothing to attend -> zeros
    out = p @ torch.cat(values, -2)
    return out.reshape(B, Hq, Tq, d).to(q.dtype)


def decode_attention_torch(q: torch.Tensor, key_state: Encoded | None, value_state: Encoded | None,
                           codec: Codec, window_k: torch.Tensor | None = None,
                           window_v: torch.Tensor | None = None, lengths=None, scale: float | None = None,
                           window_lengths=None, softcap: float | None = None) -> torch.Tensor:
    """PyTorch reference of :func:`decode_attention`: :func:`attend` on the codec's score estimator."""
    return attend(q, codec, key_state, value_state, window_k=window_k, window_v=window_v, lengths=lengths,
                  window_lengths=window_lengths, scale=scale, softcap=softcap)


def triton_kernel(codec: Codec):
    """The fused Triton decode kernel that reads ``codec``'s state, as its module: an engine's preset (a
    token layout) :mod:`kernels.triton.token_attention`, else :mod:`kernels.triton.decode_attention`
    (looked up at each call: tests wrap the launchers). Each has ``supports(codec, q_dtype)`` and the launcher
    ``decode_attention_fused``."""
    if codec.token_layout() is not None:
        from kernels.triton import token_attention

        return token_attention
    from kernels.triton import decode_attention

    return decode_attention


def fused_unsupported(q: torch.Tensor, codec: Codec, device=None) -> str | None:
    """None when the fused Triton kernel can run this call, else the reason it cannot
    (``device`` defaults to q's)."""
    why = triton_unavailable(q.device if device is None else device)
    if why is not None:
        return why
    if q.shape[-2] != 1:
        return f"the fused kernel takes one query token per step, got {q.shape[-2]}"
    return triton_kernel(codec).supports(codec, q.dtype)


def lut_unsupported(q: torch.Tensor, codec: Codec, num_kv_heads: int, device=None) -> str | None:
    """None when the table-lookup CUDA kernel can run this call, else the reason it cannot
    (``device`` defaults to q's; CuPy is imported only here, when asked)."""
    if q.shape[-2] != 1:
        return f"the table-lookup kernel takes one query token per step, got {q.shape[-2]}"
    from kernels.cuda.decode_lut import supports

    G = q.shape[1] // num_kv_heads
    return supports(codec, q.dtype, G, q.device if device is None else device, num_kv_heads)


def decide_attention(q: torch.Tensor, codec: Codec, num_kv_heads: int, backend: str = "auto",
                     device=None, softcap: float | None = None) -> Decision:
    """Which decode-attention path runs this call ('lut', 'triton' or 'torch'), and why each path
    passed over was refused (:func:`kernels.backend.decide` over :data:`ATTENTION_PATHS`, in that
    order). ``device`` (default: q's) lets tests ask about a device this machine lacks; a
    ``softcap`` sends the call to the reference (the fused kernels do not cap logits)."""
    dev = torch.device(q.device if device is None else device)
    capped = None if softcap is None else f"the fused kernels do not apply attention logit soft-capping ({softcap=})"
    why_not = {"lut": lambda: capped or lut_unsupported(q, codec, num_kv_heads, dev),
               "triton": lambda: capped or fused_unsupported(q, codec, dev)}
    return decide(backend, dev, [(p, why_not[p]) for p in ATTENTION_PATHS], "run this call")


def decode_attention(q: torch.Tensor, key_state: Encoded | None, value_state: Encoded | None, codec: Codec,
                     window_k: torch.Tensor | None = None, window_v: torch.Tensor | None = None,
                     lengths=None, scale: float | None = None, backend: str = "auto",
                     window_lengths=None, softcap: float | None = None, path: str | None = None) -> torch.Tensor:
    """softmax(cap(q K^T * scale)) V over [compressed prefix, native window], for one decode step.

    q:            [B, Hq, 1, d] (bf16, fp16 or fp32); Hq a multiple of Hkv (query head h reads
                  KV head h // (Hq // Hkv)).
    key_state:    ``codec.encode(keys)`` of keys [B, Hkv, T, d] (fields [B, Hkv, T, k]), or None.
    value_state:  ``codec.encode_values(values)`` of values [B, Hkv, T, d], or None.
    codec:        the codec that made both states (built with ``num_heads=Hkv``).
    window_k/v:   native recent tokens [B, Hkv, W, d], after the compressed ones; or None.
    lengths:      int [B] or None: sequence b uses compressed tokens [0, lengths[b]) (right padding).
    window_lengths: int [B] or None: sequence b uses window tokens [0, window_lengths[b]).
    scale:        softmax scale, default 1/sqrt(d).
    softcap:      attention logit soft-capping (see :func:`attend`): only the PyTorch reference applies
                  it, so a call with one never takes a fused kernel ('lut' / 'triton' then raise).
    backend:      'auto' (on CUDA the table-lookup kernel, else the Triton kernel, where they apply;
                  env KVCODEC_BACKEND overrides 'auto'), 'lut' / 'triton' (that kernel or an error
                  saying why not) or 'torch' (reference). :func:`decide_attention` says which runs.
    path:         the path :func:`decide_attention` already picked for this very call (not asked again).
    Returns [B, Hq, 1, d] in q's dtype.
    """
    resolve_backend(backend)  # an unknown backend fails even with nothing to fuse
    has_prefix = key_state is not None and key_state.num_tokens > 0
    if path is None:
        path = decide_attention(q, codec, key_state.shape[-3], backend, softcap=softcap).path if has_prefix else "torch"
    if path == "lut":
        from kernels.cuda import decode_lut

        return decode_lut.decode_attention_lut(q, key_state, value_state, codec, window_k, window_v, lengths,
                                               window_lengths, scale)
    if path == "triton":
        return triton_kernel(codec).decode_attention_fused(q, key_state, value_state, codec, window_k, window_v,
                                                           lengths, window_lengths, scale)
    return decode_attention_torch(q, key_state, value_state, codec, window_k, window_v, lengths, scale,
                                  window_lengths, softcap)
