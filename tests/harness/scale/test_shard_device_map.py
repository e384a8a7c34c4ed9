"""Big models: `--device-map auto` reaches the loader (accelerate places the layers), and the
compressed cache builds each layer's codec where that layer's keys are. A machine with one device
cannot place layers on two GPUs, so the second device here is 'meta': codecs built there must move
to the keys' device on first sight and give the same logits as codecs built there."""
from __future__ import annotations

import pytest
import torch
from helpers.tiny_lm import save_tiny_checkpoint, tiny_causal_lm

from adapters.hf.compat import cache_kwargs
from adapters.hf.cache import CompressedCache
from adapters.hf.attach import attach
from adapters.cache.config import CacheConfig
from harness.run.config import RunConfig, RunError
from harness.run.rows import read_rows
from harness.runner import run
from kernels import list_codecs

QUIET = dict(progress=False, log=lambda *_: None)


# transformers' own quantized cache (hf-quanto, hf-hqq) keeps its tensors where the keys are: no codec of ours moves
@pytest.mark.parametrize("codec", [c for c in list_codecs() if c != "none" and not c.startswith("hf-")])
def test_each_layer_codec_follows_its_keys_device(codec):
    lm = tiny_causal_lm("qwen2", head_dim=128)  # a multiple of every engine's group (MLX's 128, ExLlamaV2's 64)
    ids = torch.randint(0, 256, (1, 50), generator=torch.Generator().manual_seed(0))
    bits = 2 if 2 in list_codecs()[codec] else list_codecs()[codec][0]
    cc = CacheConfig(codec, bits, residual=8)
    logits, caches = [], []
    with attach(lm.model), torch.no_grad():
        for device in ("cpu", "meta"):  # meta: the device a layer would not run on
            cache = CompressedCache(lm.model.config, cc, device=device)
            # the prefill commits through the codec
            lm.model(ids[:, :30], **cache_kwargs(lm.model, cache), use_cache=True)
            logits.append(lm.model(ids[:, 30:], **cache_kwargs(lm.model, cache), use_cache=True).logits)
            caches.append(cache)
    assert torch.equal(logits[0], logits[1])
    assert {layer.kv.codec.device for layer in caches[1].layers} == {torch.device("cpu")}


def test_device_map_auto_reaches_the_loader_and_changes_no_row(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    ckpt = save_tiny_checkpoint(tmp_path / "ckpt")
    placements = []
    load = AutoModelForCausalLM.from_pretrained
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained",
                        lambda *a, **kw: placements.append(kw["device_map"]) or load(*a, **kw))
    text = tmp_path / "t.txt"
    text.write_text("The cat sat on the mat and looked at the dog. " * 30)
    cfg = dict(model="hf", model_path=str(ckpt), tasks=["perplexity"], codecs=["octopus"], bits=[2], limit=1,
               prompts=str(text), residual=8, codec_seeds=[0],
               task_options={"perplexity": {"context": 100, "prefix": 40, "chunk": 20}})
    plain = run(RunConfig(**cfg), out=tmp_path / "plain", **QUIET)
    mapped = run(RunConfig(**cfg, device_map="auto"), out=tmp_path / "mapped", **QUIET)
    # the plain load goes to the run's device (None: the CPU); accelerate puts every layer on the one device
    assert placements == ["cuda" if torch.cuda.is_available() else None, "auto"]
    assert (mapped / "rows.jsonl").read_bytes() == (plain / "rows.jsonl").read_bytes()
    assert len(read_rows(mapped / "rows.jsonl")) == 2


def test_device_map_is_refused_where_it_cannot_apply(tmp_path):
    with pytest.raises(RunError, match="model 'causvid-tiny' \\(video\\) loads on one device; leave --device-map out"):
        run(RunConfig(model="causvid-tiny", device_map="auto", codecs=["octopus"], bits=[2]), out=tmp_path / "r",
            **QUIET)
    with pytest.raises(RunError, match="--device-map 'balanced' is not a placement"):
        run(RunConfig(model="hf", model_path="x", device_map="balanced"), out=tmp_path / "r", **QUIET)
    assert not (tmp_path / "r").exists()


def test_the_memory_arithmetic_in_the_docs_is_the_codecs_true_bytes():
    """docs/scale_out.md's Qwen2.5-7B-Instruct-1M table: OCTOPUS keys + values per token per head,
    measured by encoding (4 KV heads, head dim 128), times 28 layers x 4 heads, at 128k and 1M."""
    from pathlib import Path

    from kernels import CodecConfig, make_codec

    doc = (Path(__file__).resolve().parents[3] / "docs" / "scale_out.md").read_text()
    g = torch.Generator().manual_seed(0)
    k, v = torch.randn(1, 4, 96, 128, generator=g), torch.randn(1, 4, 96, 128, generator=g)
    for bits in (2, 3, 4):
        codec = make_codec(CodecConfig("octopus", bits, 128, num_heads=4))
        per_head = (codec.encode(k).nbytes() + codec.encode_values(v).nbytes()) / (4 * 96)
        per_token = int(28 * 4 * per_head)
        assert f"| OCTOPUS {bits} bits: 28 × 4 × {per_head:.0f} B | {per_token:,} B | " \
               f"{per_token * 131072 / 1e9:.1f} GB |" in doc
        assert f"{per_token * 1048576 / 1e9:.1f} GB |\n" in doc
    assert f"| {2 * 28 * 4 * 128 * 2:,} B | {2 * 28 * 4 * 128 * 2 * 131072 / 1e9:.1f} GB |" in doc
