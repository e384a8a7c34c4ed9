"""harness/cli/main.py: list, run end to end on a tiny checkpoint (--model hf --model-path), compare,
report, delegation to probe/bench, and clear errors."""
from __future__ import annotations

import json

import pytest
from helpers.tiny_lm import save_tiny_checkpoint

from harness.cli.main import _delegate, main
from kernels import list_codecs

CODEC = next(c for c in ("octopus", "turboquant-mse", "quarot") if c in list_codecs())


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return save_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny")


def test_list(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for word in ("models:", "smollm2-135m", "qwen2.5-7b-instruct-1m", "codecs (bits):", CODEC, "tasks:",
                 "perplexity", "needle", "--task-opt needle.contexts=", "metrics (direction):", "kl"):
        assert word in out
    # how widths are chosen (issue #40): said once, under the codecs
    assert "  widths: a bare NAME runs at the --bits it takes, or where it takes none of them at its own" in out
    assert "exl2-fp8                   8  " in out  # a fixed-width cache lists its one width
    # every codec option is listed with its default, in the form --codec-opt reads back
    from harness.run.config import RunConfig
    from kernels import codec_class, list_codecs

    for line in out.splitlines():
        if "--codec-opt" in line:
            name, opt = line.split()[1].split(".", 1)
            key, default = opt.split("=", 1)
            parsed = RunConfig(codecs=[name], codec_options={name: {key: default}}).codec_options_for(name)
            assert parsed == codec_class(name).Options()  # each default reads back as itself
    assert "--codec-opt octopus.rounding=local  (one of local|full|nearest)" in out
    # and where each may lie (issue 41: every codec option ranged)
    assert "--codec-opt octopus.split=none  (tuple[int, int] | None; 1..10, 0..10)" in out
    assert "--codec-opt kivi.group_size=32  (int; >= 1; <= the model's positions)" in out
    assert "--codec-opt hf-hqq.axis_key=0  (int; one of 0, 1)" in out
    assert sum("--codec-opt" in line for line in out.splitlines()) == sum(
        len(codec_class(c).Options.__dataclass_fields__) for c in list_codecs())


def test_run_compare_report(ckpt, tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text("Colorless green ideas sleep furiously, and the cat sat on the mat. " * 20)
    args = ["run", "--model", "hf", "--model-path", str(ckpt), "--codec", CODEC, "--bits", "2,4", "--task",
            "perplexity", "--prompts", str(text), "--limit", "1", "--residual", "8", "--quiet",
            "--task-opt", "perplexity.context=120", "--task-opt", "perplexity.prefix=40", "--task-opt",
            "perplexity.chunk=16", "--codec-seeds", "3", "--out", str(tmp_path / "run")]
    assert main(args) == 0
    rows = [json.loads(l) for l in (tmp_path / "run" / "rows.jsonl").read_text().splitlines()]
    assert [(r["label"], r["codec_seed"]) for r in rows] == [("none", 3), (f"{CODEC}@2", 3), (f"{CODEC}@4", 3)]
    cfg = json.loads((tmp_path / "run" / "config.json").read_text())
    assert {k: cfg["task_options"]["perplexity"][k] for k in ("context", "prefix", "chunk")} == \
        {"context": 120, "prefix": 40, "chunk": 16}
    assert cfg["task_options"]["perplexity"]["topk"] == 256  # defaults are written out too
    assert cfg["bits"] == [2, 4] and cfg["codecs"] == [CODEC]
    assert main(args) == 0  # a rerun resumes: nothing to do, same rows
    assert len((tmp_path / "run" / "rows.jsonl").read_text().splitlines()) == 3
    capsys.readouterr()
    assert main(["compare", str(tmp_path / "run"), "--html", str(tmp_path / "cmp.html")]) == 0
    assert "## perplexity" in capsys.readouterr().out and (tmp_path / "plotly.min.js").exists()
    assert 'href="run/report.html"' in (tmp_path / "cmp.html").read_text()
    for name in ("report.md", "report.html"):
        (tmp_path / "run" / name).unlink()
    assert main(["report", str(tmp_path / "run")]) == 0
    assert (tmp_path / "run" / "report.md").exists() and (tmp_path / "run" / "report.html").exists()


@pytest.mark.parametrize("args, message", [
    (["run", "--model", "nope"], "Unknown model 'nope'. Available:"),
    (["run", "--model", "hf", "--model-path", "/nonexistent/ckpt"], "expected a directory with config.json"),
    (["run", "--model", "hf"], "needs --model-path"),
    (["run", "--codec", "nope"], "Unknown codec 'nope'. Available:"),
    (["run", "--task", "nope"], "Unknown task 'nope'. Available:"),
])
def test_clear_errors(args, message, capsys, tmp_path):
    assert main(args + ["--out", str(tmp_path / "x"), "--quiet"]) == 2
    assert message in capsys.readouterr().err


def test_rejected_bit_width_is_a_clear_error(ckpt, capsys, tmp_path):
    codec, bits = next((c, b) for c, b in list_codecs().items() if c != "none")
    bad = max(bits) + 1
    assert main(["run", "--model", "hf", "--model-path", str(ckpt), "--codec", f"{codec}@{bad}",
                 "--quiet", "--out", str(tmp_path / "x")]) == 2
    assert f"does not support bits={bad}" in capsys.readouterr().err


def test_delegation(capsys):
    assert _delegate("harness.not_written_yet", "bench", []) == 2
    assert "not available" in capsys.readouterr().err


def test_bad_task_option(capsys, tmp_path):
    assert main(["run", "--task", "perplexity", "--task-opt", "perplexity.contxt=5", "--quiet",
                 "--out", str(tmp_path / "x")]) == 2
    assert "task 'perplexity' got unknown option(s) ['contxt']; it takes ['batch', 'chunk', 'context'" \
        in capsys.readouterr().err
    assert main(["run", "--task", "perplexity", "--task-opt", "perplexity.context=lots", "--quiet",
                 "--out", str(tmp_path / "y")]) == 2
    assert "task option perplexity.context=lots: cannot read it as int" in capsys.readouterr().err


def _one_line_error(capsys, message):
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("harness ") and ": error: " in lines[0], err
    assert message in lines[0] and "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize("extra, message", [
    (["--limit", "0"], "--limit must be a positive number"), (["--limit", "-1"], "--limit must be a positive number"),
    (["--residual", "-5"], "--residual must be >= 0"), (["--bits", "0"], "--bits must be positive integers"),
    (["--dtype", "float8"], "--dtype 'float8' is not a dtype"), (["--value-bits", "0"], "--value-bits must be"),
])
def test_bad_arguments_are_one_line_before_the_model_loads(ckpt, capsys, tmp_path, extra, message):
    args = ["run", "--model", "hf", "--model-path", str(ckpt), "--codec", CODEC, "--bits", "2", "--task", "perplexity",
            "--quiet", "--out", str(tmp_path / "x")]
    assert main(args + extra) == 2
    _one_line_error(capsys, message)
    assert not (tmp_path / "x").exists()  # no config.json to block the corrected command


def test_out_that_is_a_file_or_unwritable(capsys, tmp_path, ckpt):
    (tmp_path / "f").write_text("mine")
    model = ["--model", "hf", "--model-path", str(ckpt)]  # not the default's GGUF, which GPU images lack
    for out in (tmp_path / "f", tmp_path / "f" / "sub"):
        assert main(["run", *model, "--codec", CODEC, "--bits", "2", "--task", "perplexity", "--out", str(out)]) == 2
        _one_line_error(capsys, "is a file, not a folder")
    assert (tmp_path / "f").read_text() == "mine"
    import os

    if os.geteuid() != 0:  # root writes anywhere
        (tmp_path / "ro").mkdir(mode=0o500)
        assert main(["run", *model, "--codec", CODEC, "--bits", "2", "--task", "perplexity",
                     "--out", str(tmp_path / "ro" / "run")]) == 2
        _one_line_error(capsys, "is not writable")


def test_load_errors_are_one_line(ckpt, capsys, tmp_path, monkeypatch):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(ckpt, bad)
    (bad / "config.json").write_text("{not json")
    assert main(["run", "--model", "hf", "--model-path", str(bad), "--codec", CODEC, "--bits", "2", "--task",
                 "perplexity", "--limit", "1", "--quiet", "--out", str(tmp_path / "o")]) == 2
    _one_line_error(capsys, "config.json")
    assert not (tmp_path / "o").exists()

    # the adapters raise ValueError subclasses for a corrupt or refused checkpoint: one line, exit 2
    class CheckpointError(ValueError):
        pass

    def corrupt(*a, **k):
        raise CheckpointError("checkpoint /x/model.pt is empty or corrupt\nre-download it")

    import adapters.hf.models as hf

    monkeypatch.setattr(hf, "load_checkpoint", corrupt)
    assert main(["run", "--model", "hf", "--model-path", str(ckpt), "--codec", CODEC, "--bits", "2", "--task",
                 "perplexity", "--limit", "1", "--quiet", "--out", str(tmp_path / "o")]) == 2
    assert _one_line_error(capsys, "is empty or corrupt re-download it")
    assert not (tmp_path / "o").exists()


def test_graphs_reach_the_text_model(ckpt, tmp_path, monkeypatch):
    """--graphs off reaches the loaded text model (its decode steps then run eagerly on CUDA too),
    and the run's config.json records it; an unknown value is refused before anything loads."""
    import adapters.hf.models as hf

    seen = []
    real = hf.load_checkpoint
    monkeypatch.setattr(hf, "load_checkpoint", lambda *a, **k: seen.append(k.get("graphs")) or real(*a, **k))
    out = tmp_path / "o"
    assert main(["run", "--model", "hf", "--model-path", str(ckpt), "--codec", CODEC, "--bits", "2", "--task",
                 "perplexity", "--limit", "1", "--quiet", "--graphs", "off", "--out", str(out)]) == 0
    assert seen == ["off"] and json.loads((out / "config.json").read_text())["graphs"] == "off"
    assert json.loads((out / "model.json").read_text())["model"]["decode_steps"] == "eager"
    with pytest.raises(SystemExit):
        main(["run", "--model", "hf", "--graphs", "sometimes"])


def test_device_cuda_without_cuda(capsys, tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["run", "--device", "cuda", "--codec", CODEC, "--bits", "2", "--task", "perplexity", "--quiet",
                 "--out", str(tmp_path / "x")]) == 2
    _one_line_error(capsys, "CUDA is not available on this machine; use --device cpu")
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("extra, message", [
    (["--dim", "0"], "--dim must be a head dimension >= 2"), (["--dim", "1"], "--dim must be"),
    (["--dim", "-4"], "--dim must be"), (["--n", "0"], "--n must be >= 1"), (["--seeds", "0"], "--seeds must be >= 1"),
    (["--codecs", "zip"], "Unknown codec 'zip'. Available:"), (["--bits", "9"], "--bits 9: no codec supports it"),
    (["--dim", "5", "--codecs", "polarquant-2d"], "head_dim must be even"),
])
def test_probe_arguments_are_checked_first(capsys, tmp_path, extra, message):
    args = ["probe", "--dim", "64", "--n", "64", "--seeds", "1", "--codecs", CODEC, "--bits", "2", "--no-sweep"]
    assert main(args + extra + ["--out", str(tmp_path / "p")]) == 2
    _one_line_error(capsys, message)
    assert not (tmp_path / "p").exists()
