"""scripts/memory_plan_bench.py (``python -m scripts.memory_plan_bench``) runs end to end on the CPU with a tiny
shape (its figures come from a GPU): several codecs in one process through the real runner, the plan the run's
own memory check makes, and each configuration's wall split read back from the run's speed.jsonl."""
from __future__ import annotations

import json

from helpers.tiny_lm import tiny_model

from harness.run.memory import ModelShape, TaskShape, plan_memory
from harness.run.memory_check import codec_rates
from harness.run.config import RunConfig
from harness.tasks import get_task
from scripts import memory_plan_bench as bench


def test_the_bench_runs_a_tiny_needle_with_several_codecs_on_the_cpu(tmp_path, capsys):
    cfg = {k: v for k, v in tiny_model().config.to_dict().items() if k not in ("architectures", "transformers_version")}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert bench.main(["--config", str(tmp_path / "config.json"), "--contexts", "600", "--codec", "octopus",
                       "turboquant-mse", "kivi@2", "--bits", "2", "--prefill-chunk", "64", "--device", "cpu",
                       "--json", str(tmp_path / "out.json")]) == 0
    out = capsys.readouterr().out
    (r,) = json.loads((tmp_path / "out.json").read_text())
    assert r["chunk"] == 64 and r["measured_bytes"] is None  # no allocator counter on the CPU
    # every configuration's own row: replay and encode timed apart from the one shared native forward
    assert list(r["configs"]) == ["none", "octopus@2", "turboquant-mse@2", "kivi@2"]
    assert r["shared_forward_s"] > 0 and all(c["replay_encode_s"] > 0 for c in r["configs"].values())
    # the plan is the run's own (its memory check, chunk 64): worked again here from the same pieces
    config = RunConfig(model="hf", tasks=["needle"], codecs=["octopus", "turboquant-mse", "kivi@2"], bits=[2])
    shape = ModelShape.from_config(cfg)
    needle = get_task("needle")()  # its default answer length; a needle forks its cache for the forced pass
    assert needle.forks_cache
    want = plan_memory(shape, 4, TaskShape(1, 600, needle.opts.max_new_tokens, forced=True),
                       codec_rates(config.cache_configs(), shape), chunk=64, residual=config.residual, graphed=False)
    assert r["moments"] == want.moments and r["plan_bytes"] == want.peak
    for label in r["configs"]:
        assert f"  {label} " in out
    assert "shared native forward" in out and "(once per batch)" in out
