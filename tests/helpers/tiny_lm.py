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
    """A :class:`adapters.hf.causal_lm.CausalLM` around the tiny model and the byte tokenizer."""
    from adapters.hf.causal_lm import CausalLM

    return CausalLM(tiny_model(arch, **kw), byte_tokenizer(), f"tiny-{arch}", "(in memory)")


def save_tiny_checkpoint(path: Path, arch: str = "qwen2", **kw) -> Path:
    """Write a tiny checkpoint (config.json, safetensors, tokenizer) that ``--model hf --model-path`` loads."""
    lm = tiny_causal_lm(arch, **kw)
    lm.model.save_pretrained(path)
    lm.tokenizer.save_pretrained(path)
    return path


FOX = ("The quick brown fox jumps over the lazy dog. A stitch in time saves nine. " * 60).strip()
TASK_OPTIONS = {"perplexity": {"context": 140, "prefix": 60, "chunk": 20},
                "needle": {"contexts": [520], "depths": [0.2, 0.8], "needles": 2, "max_new_tokens": 3}}


def text_run_config(tmp_path: Path, tasks=("perplexity", "needle"), codecs=("kivi",), **kw):
    """A RunConfig of a small text run on the tiny model ('(tiny)': pass the model to run()) over FOX."""
    from harness.run.config import RunConfig

    f = tmp_path / "fox.txt"
    f.write_text(FOX)
    base = dict(model="hf", model_path="(tiny)", tasks=list(tasks), codecs=list(codecs), bits=[2], prompts=str(f),
                limit=2, residual=8, task_options={t: o for t, o in TASK_OPTIONS.items() if t in tasks})
    return RunConfig(**{**base, **kw})
