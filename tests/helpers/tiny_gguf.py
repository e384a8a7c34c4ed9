"""A header-only GGUF file (metadata, no tensors) of a tiny Llama: what the checks before loading read of a
.gguf model (``adapters.hf.models.declared_shape``); a load would find no weights in it."""
from __future__ import annotations

from pathlib import Path


def write_tiny_gguf(path: Path, layers: int = 3, context: int = 2048, heads: int = 4, kv_heads: int = 2,
                    head_dim: int = 16) -> Path:
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(layers)
    w.add_context_length(context)
    w.add_embedding_length(heads * head_dim)
    w.add_feed_forward_length(2 * heads * head_dim)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_dimension_count(head_dim)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(257)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)
