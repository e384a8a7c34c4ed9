"""A tiny random causal LM of a real architecture (Qwen2 or Llama) and a byte-level tokenizer,
built in-process: no download, a few milliseconds per forward."""
from __future__ import annotations

from pathlib import Path

import torch

from adapters.byte_tokenizer import EOS, byte_tokenizer  # noqa: F401  (tests import both from here)


def tiny_model(arch: str = "qwen2", layers: int = 2, hidden: int = 64, heads: int = 4, kv_heads: int = 2,
               head_dim: int = 32, vocab: int = 257, seed: int = 0):
    """A randomly initialized ``Qwen2ForCausalLM`` / ``LlamaForCausalLM`` (float32, eval mode)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                  num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
                  max_position_embeddings=4096, eos_token_id=vocab - 1, pad_token_id=vocab - 1,
                  bos_token_id=None, tie_word_embeddings=True)
    if arch == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    elif arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    else:
        raise ValueError(arch)
    model.generation_config.eos_token_id = vocab - 1
    model.generation_config.pad_token_id = vocab - 1
    return model.eval()


def tiny_causal_lm(arch: str = "qwen2", **kw):
    """A :class:`adapters.hf_causal_lm.CausalLM` around the tiny model and the byte tokenizer."""
    from adapters.hf_causal_lm import CausalLM

    return CausalLM(tiny_model(arch, **kw), byte_tokenizer(), f"tiny-{arch}", "(in memory)")


def save_tiny_checkpoint(path: Path, arch: str = "qwen2", **kw) -> Path:
    """Write a tiny checkpoint (config.json, safetensors, tokenizer) that ``--model hf --model-path`` loads."""
    lm = tiny_causal_lm(arch, **kw)
    lm.model.save_pretrained(path)
    lm.tokenizer.save_pretrained(path)
    return path
