"""``--codec NAME@B``: a codec at its own bit widths beside the run's ``--bits`` (an engine's preset); a bare
``NAME`` at the widths of ``--bits`` it takes, or at all of its own where it takes none; and ``--preset deployed``,
which runs the engines' KV caches beside OCTOPUS and TurboQuant-MSE."""
from __future__ import annotations

import json

import pytest
from helpers.bad_input import tiny_run_argv
from helpers.tiny_lm import FOX, text_run_config, tiny_causal_lm

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


# --- a bare name: the three cases (issue #40) ----------------------------------------------------------
def test_a_bare_fixed_width_codec_runs_at_its_width(capsys):
    """Issue #40's command: bare names of engine caches at --bits 2 3 4 run at the widths they take, each
    difference said in one note line (and the explicit NAME@B form is the one that can be wrong)."""
    notes = []
    config = RunConfig(codecs=["sglang-fp8-e4m3", "vllm-int4-per-token-head", "hf-quanto", "octopus"], bits=[2, 3, 4])
    assert config.codec_entries(notes.append) == [("sglang-fp8-e4m3", [8]), ("vllm-int4-per-token-head", [4]),
                                                  ("hf-quanto", [2, 4]), ("octopus", [2, 3, 4])]
    assert notes == ["note: --codec sglang-fp8-e4m3 runs at 8, its own width (it takes none of --bits 2 3 4)",
                     "note: --codec vllm-int4-per-token-head runs at 4 of --bits 2 3 4 (it takes 4)",
                     "note: --codec hf-quanto runs at 2,4 of --bits 2 3 4 (it takes 2,4)"]
    assert [c.label for c in config.cache_configs()] == [
        "none", "sglang-fp8-e4m3@8", "vllm-int4-per-token-head@4", "hf-quanto@2", "hf-quanto@4", "octopus@2",
        "octopus@3", "octopus@4"]


def test_a_bare_codec_with_no_width_in_common_runs_at_all_of_its_own():
    from kernels import codec_class

    notes = []
    assert RunConfig(codecs=["hf-hqq"], bits=[3]).codec_entries(notes.append) == [
        ("hf-hqq", list(codec_class("hf-hqq").bits_supported))]
    assert notes == [f"note: --codec hf-hqq runs at {','.join(map(str, codec_class('hf-hqq').bits_supported))}, its "
                     f"own widths (it takes none of --bits 3)"]
    assert RunConfig(codecs=["octopus"], bits=[2, 3]).codec_entries(notes.append) == [("octopus", [2, 3])]
    assert len(notes) == 1  # a bare name that takes every --bits says nothing


def test_issue_40s_command_runs_every_codec_at_its_width(tmp_path, checkpoint, capsys):
    """`harness run --task perplexity --codec sglang-fp8-e4m3 vllm-int4-per-token-head hf-quanto` on the tiny
    checkpoint: rows at 8, 4, 2 and 4 bits, nothing skipped, and one note per codec on stdout."""
    (tmp_path / "fox.txt").write_text(FOX)
    argv = tiny_run_argv(checkpoint, tmp_path / "fox.txt", tmp_path / "run")
    at = argv.index("--codec")
    argv[at + 1:at + 2] = ["sglang-fp8-e4m3", "vllm-int4-per-token-head", "hf-quanto"]
    argv[argv.index("--bits") + 1:argv.index("--bits") + 2] = ["2", "3", "4"]
    assert main(argv + ["--codec-seeds", "0", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert out.count("note: --codec ") == 3 and "skipping" not in out
    labels = {json.loads(line)["label"] for line in (tmp_path / "run" / "rows.jsonl").read_text().splitlines()}
    assert labels == {"none", "sglang-fp8-e4m3@8", "vllm-int4-per-token-head@4", "hf-quanto@2", "hf-quanto@4"}
    assert json.loads((tmp_path / "run" / "model.json").read_text())["skipped"] == []
