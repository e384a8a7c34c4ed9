"""A Wan folder in the Wan2.1-T2V-1.3B-Diffusers layout (tiny UMT5 text encoder, tokenizer and VAE
written here with the real classes) loads through adapters/wan/checkpoint.py unchanged."""
from __future__ import annotations

import torch

from adapters.loading import random_init_
from adapters.wan.checkpoint import wan_layout
from adapters.wan.tiny import TINY_UMT5


def test_diffusers_layout_folder(tmp_path):
    """A Wan folder in the Wan2.1-T2V-1.3B-Diffusers layout (tiny text encoder, tokenizer, VAE)."""
    from diffusers import AutoencoderKLWan
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, UMT5Config, UMT5EncoderModel
    from adapters.wan.checkpoint import load_text_encoder, load_vae
    from adapters.wan.tiny import TINY_VAE
    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, "a": 3, "fox": 4, "red": 5}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", eos_token="</s>",
                            unk_token="<unk>").save_pretrained(tmp_path / "tokenizer")
    enc = random_init_(UMT5EncoderModel(UMT5Config(**{**TINY_UMT5, "vocab_size": 6})), "te")
    enc.save_pretrained(tmp_path / "text_encoder")
    vae = random_init_(AutoencoderKLWan(**TINY_VAE), "vae")
    vae.save_pretrained(tmp_path / "vae")
    assert wan_layout(tmp_path) == "diffusers"
    enc2, tok = load_text_encoder(tmp_path, torch.float32)
    vae2 = load_vae(tmp_path, torch.float32)
    ids = tok(["a red fox"], return_tensors="pt")["input_ids"]
    assert ids.tolist() == [[3, 5, 4]]
    # same weights, loaded from the folder: the same float32 forward up to its kernels' summation order (U32 of
    # the terms each, through the tiny encoder): float32's default tolerance (rtol 1.3e-6 = 22 U32, atol 1e-5)
    torch.testing.assert_close(enc2(input_ids=ids).last_hidden_state, enc(input_ids=ids).last_hidden_state)
    for k, v in vae.state_dict().items():
        assert torch.equal(vae2.state_dict()[k], v), k
