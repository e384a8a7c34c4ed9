"""Tiny random Wan components (real architecture and key names) for CPU runs and tests (their
weights come from :func:`adapters.loading.random_init_`)."""
from __future__ import annotations

import torch

#: A 2-layer, 2-head, head-dim-32 Wan transformer (the 1.3B's key names and layout).
TINY_TRANSFORMER = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=32, in_channels=16,
                        out_channels=16, text_dim=32, freq_dim=32, ffn_dim=128, num_layers=2,
                        cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024)
#: The Wan 2.1 VAE with base width 4 instead of 96 (same 4x temporal, 8x spatial compression).
TINY_VAE = dict(base_dim=4, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=1, attn_scales=[],
                temperal_downsample=[False, True, True])
#: A 2-layer UMT5 encoder over a byte vocabulary.
TINY_UMT5 = dict(vocab_size=260, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                 relative_attention_num_buckets=32, relative_attention_max_distance=128,
                 feed_forward_proj="gated-gelu", layer_norm_epsilon=1e-6, dropout_rate=0.0)


class ByteTokenizer:
    """UTF-8 bytes + 3 as ids, then EOS (1), padded with 0 to ``max_length``: the tiny text encoder's tokenizer."""

    pad_token_id, eos_token_id = 0, 1

    def __call__(self, texts, max_length: int, **_):
        ids = torch.zeros(len(texts), max_length, dtype=torch.long)
        for i, t in enumerate(texts):
            b = [c + 3 for c in t.encode("utf-8")][: max_length - 1] + [self.eos_token_id]
            ids[i, : len(b)] = torch.tensor(b)
        return {"input_ids": ids, "attention_mask": (ids != self.pad_token_id).long()}
