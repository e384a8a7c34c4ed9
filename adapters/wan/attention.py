"""Block-causal self-attention for diffusers' ``WanTransformer3DModel`` over the compressed cache.

A rollout generates the video a block of latent frames at a time. Every transformer call
sees only the block in flight; its self-attention reads the committed blocks from the
rollout's :class:`~adapters.cache.kv_cache.CompressedKVCache` and the block's own keys and values
natively (``LayerKV.attend(..., k_new=, v_new=)``). On the commit pass (the clean block
re-run at t=0) the block's keys and values are appended after attending, so each committed
token is encoded once, with RoPE already applied at its true frame position.

Only ``attn1`` (self-attention) of each block is replaced; projections, norms, the text
cross-attention (whose keys and values stay native), the FFN and the modulation are diffusers'
own modules.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch

from adapters.cache.kv_cache import CompressedKVCache

from adapters.cache.layer_kv import LayerKV

#: Upper bound on float32 score entries per attend call; larger query blocks are split by
#: rows (softmax is per row, so the result is the same) to keep the full-size model in memory.
MAX_SCORE_ELEMENTS = 1 << 29


@dataclass
class BlockState:
    """What the causal processors need to know about the transformer call in progress."""

    cache: CompressedKVCache | None = None
    rotary: tuple[torch.Tensor, torch.Tensor] | None = None  # cos, sin [1, S, 1, d] at the block's frames
    commit: bool = False  # True on the t=0 pass: append this block's K/V after attending


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Wan's RoPE on interleaved pairs: x [B, S, H, d], cos/sin [1, S, 1, d] (each pair's angle repeated)."""
    # in the tables' precision (float64, as diffusers and the original Wan code rotate)
    x1, x2 = x.to(cos.dtype).unflatten(-1, (-1, 2)).unbind(-1)
    c, s = cos[..., 0::2], sin[..., 1::2]
    return torch.stack([x1 * c - x2 * s, x1 * s + x2 * c], dim=-1).flatten(-2).type_as(x)


def attend_in_chunks(layer: LayerKV, q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor,
                     max_elements: int = MAX_SCORE_ELEMENTS) -> torch.Tensor:
    """layer.attend over [committed, window, new] for q [B, H, S, d], split into row chunks."""
    B, H, S, _ = q.shape
    total = layer.length + k_new.shape[-2]
    rows = max(1, max_elements // max(B * H * total, 1))
    if rows >= S:
        return layer.attend(q, k_new=k_new, v_new=v_new)
    return torch.cat([layer.attend(q[:, :, i:i + rows], k_new=k_new, v_new=v_new) for i in range(0, S, rows)], 2)


class CausalWanSelfAttnProcessor:
    """Replaces ``WanAttnProcessor`` on ``block.attn1``; reads and writes layer ``index`` of the cache."""

    def __init__(self, index: int, state: BlockState):
        self.index = index
        self.state = state

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, rotary_emb=None):
        # hidden_states: [B, S, H*d] for the block in flight (S = frames_in_block * tokens_per_frame).
        # rotary_emb from diffusers' forward counts frames from 0; the block's own offset is in state.rotary.
        st = self.state
        if st.cache is None or st.rotary is None:
            raise RuntimeError("causal Wan attention called outside a rollout (no cache / frame offset set)")
        q = attn.norm_q(attn.to_q(hidden_states)).unflatten(2, (attn.heads, -1))  # [B, S, H, d]
        k = attn.norm_k(attn.to_k(hidden_states)).unflatten(2, (attn.heads, -1))
        v = attn.to_v(hidden_states).unflatten(2, (attn.heads, -1))
        q = apply_rotary(q, *st.rotary).transpose(1, 2)  # [B, H, S, d]
        k = apply_rotary(k, *st.rotary).transpose(1, 2)
        v = v.transpose(1, 2)
        layer = st.cache[self.index]
        out = attend_in_chunks(layer, q, k, v)  # the block in flight attends itself natively
        if st.commit:
            layer.append(k, v)  # encoded (beyond the native window) once, here
        out = out.transpose(1, 2).flatten(2).type_as(hidden_states)
        return attn.to_out[1](attn.to_out[0](out))


@contextmanager
def causal_attention(transformer, state: BlockState):
    """Install the causal processor on every block's self-attention; restore the originals on exit."""
    originals = [block.attn1.processor for block in transformer.blocks]
    try:
        for i, block in enumerate(transformer.blocks):
            block.attn1.processor = CausalWanSelfAttnProcessor(i, state)
        yield state
    finally:
        for block, proc in zip(transformer.blocks, originals):
            block.attn1.processor = proc
