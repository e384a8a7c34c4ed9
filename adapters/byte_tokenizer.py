"""A byte-level tokenizer built in-process (no download): one token per byte (256) + EOS.

For models with random weights, where only shapes matter (benchmarks, tests): a context of N
bytes is N tokens, whatever the model's own vocabulary (the ids stay below 257).
"""
from __future__ import annotations

EOS = "<|endoftext|>"


def byte_tokenizer():
    """A ``PreTrainedTokenizerFast``: ByteLevel pre-tokenizer and decoder, no merges, EOS id 256."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok)
    fast.add_special_tokens({"eos_token": EOS})
    return fast
