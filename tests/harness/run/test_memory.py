"""harness/run/memory and memory_check: the memory plan's figures against what the tiny model really holds
(its parameters, a transformers cache after a prefill, a codec cache after a replay), its arithmetic against
figures worked by hand, the prefill chunk ``auto`` comes to, and a run that cannot fit refused through the
CLI in one line (exit code 2) before the model loads."""
from __future__ import annotations

import json

import pytest
import torch
from helpers.tiny_lm import save_tiny_checkpoint, tiny_model
from transformers import DynamicCache

from adapters.cache.config import CacheConfig
from adapters.hf.cache import CompressedCache
from adapters.hf.compat import cache_kwargs
from harness.cli.main import main
from harness.run import memory_check
from harness.run.config import AUTO_WHOLE_PREFILL, RunConfig, RunError
from harness.run.memory import ModelShape, TaskShape, chunk_activations, gib, plan_memory
from harness.run.memory_check import CPU_CHUNK, RunPlan, check_memory, codec_rates

MIB = 2 ** 20


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_the_shape_counts_the_models_parameters(arch):
    model = tiny_model(arch)
    shape = ModelShape.from_config(model.config.to_dict())
    assert (shape.layers, shape.hidden, shape.intermediate, shape.q_heads, shape.kv_heads, shape.head_dim,
            shape.vocab) == (2, 64, 128, 4, 2, 32, 257)
    assert shape.params == sum(p.numel() for p in model.parameters())  # tied: the head is the embedding


@torch.no_grad()
def test_the_native_cache_is_what_a_prefill_leaves():
    model = tiny_model()
    x = torch.randint(0, 256, (3, 70), generator=torch.Generator().manual_seed(0))
    cache = DynamicCache(config=model.config)
    model(x, **cache_kwargs(model, cache), use_cache=True)
    held = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
    assert ModelShape.from_config(model.config.to_dict()).native_bytes(3, 70, 4) == held


@pytest.mark.parametrize("codec", ["octopus", "kivi", "turboquant-prod"])
def test_a_codecs_rate_is_what_its_cache_stores(codec):
    """Bytes per committed token of a codec layer (its byte formulas) against a cache's stored bytes."""
    model = tiny_model()
    shape = ModelShape.from_config(model.config.to_dict())
    cc = CacheConfig(codec=codec, bits=2, residual=8)
    (rate,) = codec_rates([CacheConfig(), cc], shape)
    assert rate.codec_layers == 2 and rate.label == f"{codec}@2" and rate.decoded == (codec != "turboquant-prod")
    cache = CompressedCache(model.config, cc)
    g = torch.Generator().manual_seed(1)
    k, v = (torch.randn(1, 2, 136, 32, generator=g) for _ in range(2))
    for i in range(2):
        cache.replay(i, type("Native", (), {"keys": k, "values": v})(), None)
    committed = cache.kv[0].committed  # 128: whole blocks past a window of 8
    assert cache.kv.nbytes()["compressed"] == 2 * committed * rate.token_bytes


def test_the_plans_arithmetic_by_hand():
    """A shape small enough to work out: 2 layers, hidden 64, MLP 128, 4 query heads and 2 KV heads of 32,
    257 tokens, float32; a batch of 2 prompts of 520 tokens, 3 generated, prefilled in chunks of 128."""
    shape = ModelShape(layers=2, hidden=64, intermediate=128, q_heads=4, kv_heads=2, head_dim=32, vocab=257, tied=True)
    # a layer: q 64*128, k and v 64*64 each, o 128*64, MLP 3*64*128, 2 norms of 64; embedding 257*64, final norm
    assert shape.params == 2 * (8192 + 8192 + 8192 + 24576 + 128) + 16448 + 64 == 115072
    assert shape.layer_token_bytes(4) == 2 * 2 * 32 * 4 == 512
    act = chunk_activations(shape, 4, batch=2, chunk=128, keys=520, masked=True, logit_columns=1)
    # stream 2*B*c*H*e; the layer: max(MLP 3*B*c*I*e = 393216, attention: projections 2*B*c*(4+2*2)*32*e = 524288,
    # mask and its additive copy B*c*520*(1+e) = 665600, keys and values repeated to 4 heads 2*B*4*520*32*e = 1064960)
    assert act == {"stream": 131072, "layer": 524288 + 665600 + 1064960, "logits": 2 * 257 * 8}
    task = TaskShape(batch=2, context=520, new_tokens=3, forced=True)
    plan = plan_memory(shape, 4, task, [], chunk=128)
    shared = 2 * 520 * 2 * 512  # B * T * layers * a token's key and value
    assert plan.items["weights"] == 115072 * 4 and plan.items["native cache (the shared prefill)"] == shared
    # the chunk's activations and one layer's cache growing by concatenation (old and new alive): B * T * 512
    assert plan.items["prefill chunk activations"] == sum(act.values()) + 2 * 520 * 512
    assert plan.moments["prefill"] == 115072 * 4 + shared + sum(act.values()) + 532480
    # graphed (CUDA): the baseline's decode and its forced pass each hold a copy of 523 tokens
    assert plan.items["baseline rollout (2 copies of the native cache)"] == 2 * (2 * 523 * 2 * 512)
    on_cpu = plan_memory(shape, 4, task, [], chunk=128, graphed=False)  # a transformers cache deep-copied: 3
    assert on_cpu.items["baseline rollout (3 copies of the native cache)"] == 3 * (2 * 523 * 2 * 512)
    whole = plan_memory(shape, 4, TaskShape(batch=1, context=520), [], chunk=None)
    assert whole.chunk is None and whole.items["prefill chunk activations"] == sum(
        chunk_activations(shape, 4, 1, 520, 520, masked=False, logit_columns=1).values()) + 520 * 512


def _run_config(**kw) -> RunConfig:
    return RunConfig(model="hf", tasks=["needle"], codecs=["octopus"], bits=[2], codec_seeds=[0], **kw)


QWEN_7B = {"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
           "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064, "tie_word_embeddings": False}


def test_auto_prefills_short_prompts_in_one_piece_and_long_ones_in_what_fits():
    config = _run_config()
    short, long = TaskShape(1, AUTO_WHOLE_PREFILL, 12, forced=True), TaskShape(1, 1_048_000, 12, forced=True)
    assert RunPlan(config, [short], QWEN_7B, "cuda").chunk("auto", "cuda", 1) is None  # one piece, whatever is free
    assert RunPlan(config, [long], QWEN_7B, "cpu").chunk("auto", "cpu", None) == CPU_CHUNK
    plans = RunPlan(config, [long], QWEN_7B, "cuda")
    prefill = {c: plans.worst(c)[0].moments["prefill"] for c in (32768, 2048, 1024)}
    free = prefill[2048]  # room for chunks of 2,048 and less: auto takes the largest that fits
    # (the rollouts' moments need more: auto sizes the chunk, the check then refuses what still does not fit)
    assert prefill[32768] > free >= prefill[1024]
    shaped = RunPlan(config, [long], QWEN_7B, "cuda")
    shaped.worst = lambda chunk, batch=None: (type("P", (), {"peak": prefill.get(chunk, free + 1)})(), long)
    assert shaped.chunk("auto", "cuda", free) == 2048 and shaped.chunk(512, "cuda", free) == 512


def test_a_run_that_cannot_fit_is_refused_naming_what_fits(monkeypatch):
    config = _run_config(prefill_chunk=32768, device="cpu")
    task = TaskShape(4, 262_144, 12, forced=True)
    plans = RunPlan(config, [task], QWEN_7B, "cuda")
    free = plans.worst(32768, 1)[0].peak + 1  # one prompt at a time fits; a smaller chunk alone does not
    monkeypatch.setattr(memory_check, "free_bytes", lambda device, spread: (free, "cuda:0"))
    lines = []
    with pytest.raises(RunError) as e:
        check_memory(config, [task], QWEN_7B, lines.append, device="cuda")
    msg = str(e.value)
    need = plans.worst(32768)[0]
    assert msg.startswith(f"the run needs {gib(need.peak)} at its peak ({need.peak_moment}) and {gib(free)} is free "
                          f"on cuda:0; to fit: --batch-size 1 (peak {gib(plans.worst(32768, 1)[0].peak)})")
    assert "--device-map auto over GPUs" in msg and "\n" not in msg
    assert lines[0].startswith("memory plan: bfloat16, batch 4, 262,144 tokens + 12 generated, prefill in chunks")


def test_the_cli_refuses_before_the_model_loads(tmp_path, monkeypatch, capsys):
    ck = save_tiny_checkpoint(tmp_path / "ck")
    monkeypatch.setattr(memory_check, "free_bytes", lambda device, spread: (MIB, "cuda:0"))  # a fake figure
    monkeypatch.setattr("adapters.hf.models.load_checkpoint", lambda *a, **k: pytest.fail("the model loaded"))
    out = tmp_path / "run"
    capsys.readouterr()  # the checkpoint's own progress bar
    rc = main(["run", "--model", "hf", "--model-path", str(ck), "--task", "needle", "--task-opt",
               "needle.contexts=2000", "--task-opt", "needle.depths=0.5", "--codec", "octopus", "--bits", "2",
               "--codec-seeds", "0", "--device", "cpu", "--out", str(out), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and not out.exists()
    assert err[0].startswith("harness run: error: the run needs ") and "is free on cuda:0; to fit:" in err[0]


def test_the_run_records_the_option_and_the_chunk_it_came_to(tmp_path):
    """config.json keeps the option as given; model.json the chunk, and the model prefilled in it."""
    from helpers.tiny_lm import text_run_config, tiny_causal_lm

    from harness.runner import run

    lm = tiny_causal_lm()
    config = text_run_config(tmp_path, tasks=("needle",), prefill_chunk=128, limit=1)
    logged = []
    out = run(config, out=tmp_path / "run", model=lm, progress=False, log=logged.append)
    assert json.loads((out / "config.json").read_text())["prefill_chunk"] == 128
    assert json.loads((out / "model.json").read_text())["model"]["prefill_chunk"] == 128 == lm.prefill_chunk
    assert any(line.startswith("memory plan: float32, batch 1, 520 tokens") for line in logged)
    auto = text_run_config(tmp_path, tasks=("needle",), limit=1)
    run(auto, out=tmp_path / "auto", model=lm, progress=False, log=lambda *_: None)
    assert json.loads((tmp_path / "auto" / "config.json").read_text())["prefill_chunk"] == "auto"
    assert json.loads((tmp_path / "auto" / "model.json").read_text())["model"]["prefill_chunk"] is None
