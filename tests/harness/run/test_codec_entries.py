"""``--codec NAME@B``: a codec at its own bit widths beside the run's ``--bits`` (an engine's preset), and
``--preset deployed``, which runs the engines' KV caches beside OCTOPUS and TurboQuant-MSE."""
from __future__ import annotations

import json

import pytest
from helpers.tiny_lm import text_run_config, tiny_causal_lm

from harness.cli.main import main
from harness.run.config import PRESETS, RunConfig, RunError
from harness.run.rows import read_rows
from harness.runner import run


def test_a_codec_at_its_own_bits():
    c = RunConfig(codecs=["octopus", "vllm-int8-per-token-head@8", "kivi@2,4"], bits=[2, 3])
    assert [cc.label for cc in c.cache_configs()] == ["none", "octopus@2", "octopus@3", "vllm-int8-per-token-head@8",
                                                      "kivi@2", "kivi@4"]
    again = RunConfig(codecs=["octopus", "octopus@4", "vllm-fp8@8,8"], bits=[2, 4]).cache_configs()
    assert [cc.label for cc in again] == ["none", "octopus@2", "octopus@4", "vllm-fp8@8"]  # each (codec, bits) once
    for bad in ("octopus@", "octopus@x", "octopus@0"):
        with pytest.raises(RunError, match=f"--codec {bad}: NAME@B takes bit widths"):
            RunConfig(codecs=[bad]).cache_configs()


def test_an_unknown_codec_at_bits_is_one_line(capsys, tmp_path):
    assert main(["run", "--codec", "nosuch@8", "--out", str(tmp_path / "x")]) == 2
    assert "Unknown codec 'nosuch'" in capsys.readouterr().err


def test_the_deployed_preset_runs_every_preset_at_its_bits(tmp_path):
    deployed = PRESETS["deployed"]
    config = text_run_config(tmp_path, tasks=("perplexity",), codecs=deployed["codecs"], bits=deployed["bits"],
                             limit=1, codec_seeds=[0], batch_size=1)
    out = run(config, out=tmp_path / "run", model=tiny_causal_lm(head_dim=64), progress=False, log=lambda *_: None)
    labels = {r["label"] for r in read_rows(out / "rows.jsonl")}
    presets = {f"{name}@{b}" for c in deployed["codecs"] if "@" in c
               for name, bits in [c.split("@")] for b in bits.split(",")}  # hf-quanto@2,4: hf-quanto@2, hf-quanto@4
    assert presets <= labels and {"octopus@2", "turboquant-mse@4", "none"} <= labels
    assert "vllm-fp8@2" not in labels  # a preset runs at its own bits only
    int4 = next(r for r in read_rows(out / "rows.jsonl") if r["label"] == "vllm-int4-per-token-head@4")
    # d/2 bytes + a float32 scale per 64 coordinates (the row's float64 ratio of byte counts: default rel)
    assert int4["bits_per_coord"] == pytest.approx(4 + 32 / 64)
    quanto = next(r for r in read_rows(out / "rows.jsonl") if r["label"] == "hf-quanto@4")
    assert quanto["bits_per_coord"] == pytest.approx(4 + 2 * 32 / 64)  # + float32 scale and shift per 64; as above
    # the report answers the question directly: every research codec against every deployed cache, paired
    t = json.loads((out / "summary.json").read_text())["tasks"]["perplexity"]
    research = {"octopus@2", "octopus@3", "octopus@4", "turboquant-mse@2", "turboquant-mse@3", "turboquant-mse@4"}
    assert {(p["a"], p["b"]) for p in t["against_deployed"]} == {(r, d) for r in research for d in presets}
    one = next(p for p in t["against_deployed"] if (p["a"], p["b"]) == ("octopus@2", "vllm-fp8@8"))
    assert one["word"] in (None, "better", "worse") and one["n"] == 1 and one["a_rate"] < one["b_rate"]
    md = (out / "report.md").read_text()
    assert "### Research codecs against deployed caches on" in md and "| octopus@2 (" in md
    page = (out / "report.html").read_text()
    assert "Research codecs against deployed caches on" in page and "vllm-int4-per-token-head@4 (" in page


@pytest.mark.engine_boundaries
def test_a_preset_that_keeps_every_layer_native_is_skipped_not_fatal(tmp_path):
    """vLLM's TurboQuant keeps the first and last two layers native: on a 2-layer model nothing is left to
    compress, so that configuration is skipped with the reason and the rest of the run goes on."""
    config = text_run_config(tmp_path, tasks=("perplexity",), codecs=("vllm-turboquant-k3v4-nc@3", "octopus"),
                             bits=[2], limit=1, codec_seeds=[0], batch_size=1)
    out = run(config, out=tmp_path / "run", model=tiny_causal_lm(head_dim=32), progress=False, log=lambda *_: None)
    labels = {r["label"] for r in read_rows(out / "rows.jsonl")}
    assert "octopus@2" in labels and "vllm-turboquant-k3v4-nc@3" not in labels
    skipped = json.loads((out / "model.json").read_text())["skipped"]
    assert [s["label"] for s in skipped] == ["vllm-turboquant-k3v4-nc@3"] and "nothing to compress" in skipped[0]["reason"]
    # the report's header says which layers the engine keeps native, as --protect's are said
    assert "by their engines' rule, layers vllm-turboquant-k3v4-nc: [0, 1]" in (out / "report.md").read_text()


def test_a_verdict_says_when_there_is_nothing_to_compare():
    from harness.report.formatting import verdict

    assert verdict({"word": None, "mean": None, "n": 0}) == "not comparable"
    assert verdict({"word": None, "mean": float("-inf"), "n": 4}) == "not comparable"
    assert verdict({"word": None, "mean": 0.1, "n": 1}) == "one cell (n = 1)"
    assert verdict({"word": None, "mean": 0.1, "n": 4}) == "indistinguishable"
    assert verdict({"word": "better", "mean": -0.1, "n": 4}) == "better"
