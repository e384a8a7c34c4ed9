"""Issue #27: no traceback from any input. Each case below is a malformed file, option or run folder a
careless user (or an attacker) could hand the harness; the CLI must answer with one line on stderr that
names the problem (and the file and line where there is one) and exit code 2, and, for what can be
checked without the model, before any model loads. A new case is one line in a table."""
from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest
import torch

from harness.cli.main import main
from helpers.bad_input import fill, one_line, tiny_run_argv
from helpers.tiny_lm import FOX

TEXT = ["run", "--model", "hf", "--model-path", "{ck}", "--codec", "octopus", "--bits", "3", "--out", "{out}"]
VIDEO = ["run", "--model", "causvid-tiny", "--codec", "octopus", "--bits", "2", "--out", "{out}"]
AUDIO = ["run", "--model", "aar-tiny", "--codec", "octopus", "--bits", "2", "--out", "{out}"]
PPL = TEXT + ["--task", "perplexity"]
NEEDLE = TEXT + ["--task", "needle"]

# (id, {file name: content}, argv, what the one line must say)
CASES = [
    # prompt files, every modality
    ("text-jsonl-text-not-a-string", {"p.jsonl": '{"text": 5}\n'}, PPL + ["--prompts", "{d}/p.jsonl"],
     "p.jsonl:1: 'text' must be a string, found the int 5"),
    ("text-jsonl-no-text", {"p.jsonl": '{"text": "a b"}\n\n{"body": "x"}\n'}, PPL + ["--prompts", "{d}/p.jsonl"],
     "p.jsonl:3: needs 'text'"),
    ("text-jsonl-not-json", {"p.jsonl": "hello\n"}, PPL + ["--prompts", "{d}/p.jsonl"],
     "p.jsonl:1:1: is not valid JSON"),
    ("text-jsonl-a-list-line", {"p.jsonl": '["a"]\n'}, PPL + ["--prompts", "{d}/p.jsonl"],
     "p.jsonl:1: each line of text prompts (.jsonl) must be a JSON object, found a list"),
    ("kvpress-bad-line", {"k.jsonl": '{"context": "a"}\n{oops\n'}, TEXT + ["--task", "kvpress", "--prompts", "{d}/k.jsonl"],
     "k.jsonl:2:2: is not valid JSON"),
    ("video-empty-file", {"v.json": ""}, VIDEO + ["--prompts", "{d}/v.json"], "v.json: is empty"),
    ("video-id-a-list", {"v.json": '{"prompts": [{"id": [5], "prompt": "x"}]}'}, VIDEO + ["--prompts", "{d}/v.json"],
     "v.json: prompt 0: 'id' must be a string or an integer, found a list"),
    ("video-no-prompt", {"v.json": '[{"id": "a"}]'}, VIDEO + ["--prompts", "{d}/v.json"], "v.json: prompt 0: needs 'prompt'"),
    ("video-numbers", {"v.json": "[1, 2]"}, VIDEO + ["--prompts", "{d}/v.json"],
     "v.json: prompt 0: each prompt is a string or an object"),
    ("video-prompts-not-a-list", {"v.json": '{"prompts": 3}'}, VIDEO + ["--prompts", "{d}/v.json"],
     "v.json: 'prompts' must be a JSON list"),
    ("video-no-prompts", {"v.json": "[]"}, VIDEO + ["--prompts", "{d}/v.json"], "v.json: no video prompts in it"),
    ("video-a-number", {"v.json": "7"}, VIDEO + ["--prompts", "{d}/v.json"],
     "video prompts must be a JSON object or a JSON list, found the int 7"),
    ("video-empty-text-file", {"v.txt": "\n\n"}, VIDEO + ["--prompts", "{d}/v.txt"], "v.txt: no video prompts in it"),
    ("audio-no-clips", {"m.json": '{"x": 1}'}, AUDIO + ["--prompts", "{d}/m.json"], "m.json: needs 'clips'"),
    ("audio-a-list", {"m.json": "[1]"}, AUDIO + ["--prompts", "{d}/m.json"],
     "m.json: an audio manifest must be a JSON object, found a list"),
    ("audio-no-file", {"m.json": '{"clips": [{"id": "a"}]}'}, AUDIO + ["--prompts", "{d}/m.json"],
     "m.json: clip 0: needs 'file'"),
    ("audio-clip-a-string", {"m.json": '{"clips": ["a.wav"]}'}, AUDIO + ["--prompts", "{d}/m.json"],
     "m.json: clip 0: each clip is an object"),
    # options, checked before the model loads
    ("needle-no-needles", {}, NEEDLE + ["--task-opt", "needle.needles=0"], "needle.needles=0: 0 is out of range (1 <= value)"),
    ("needle-negative-answer", {}, NEEDLE + ["--task-opt", "needle.max_new_tokens=-1"], "needle.max_new_tokens=-1: -1 is out"),
    ("needle-past-the-positions", {}, NEEDLE + ["--task-opt", "needle.contexts=99999999999"],
     "needle.contexts: 99999999999 tokens exceed the model's 4096 positions"),
    ("needle-depth-above-one", {}, NEEDLE + ["--task-opt", "needle.depths=0.5,1.5"], "needle.depths=0.5,1.5: 1.5 is out of range"),
    ("needle-no-depths", {}, NEEDLE + ["--task-opt", "needle.depths="], "give at least one value"),
    ("needle-unknown-ruler-form", {}, NEEDLE + ["--task-opt", "needle.ruler=bogus"], "must be one of"),
    ("needle-contexts-not-numbers", {}, NEEDLE + ["--task-opt", "needle.contexts=abc"], "task option needle.contexts=abc: cannot read it as tuple[int, ...]"),
    ("perplexity-negative-context", {}, PPL + ["--task-opt", "perplexity.context=-5"], "perplexity.context=-5: -5 is out of range"),
    ("perplexity-chunk-zero", {}, PPL + ["--task-opt", "perplexity.chunk=0"], "perplexity.chunk=0: 0 is out of range"),
    ("perplexity-prefix-past-context", {}, PPL + ["--task-opt", "perplexity.prefix=600"],
     "prefix (600) must leave at least 2 tokens of the context (512)"),
    ("protect-a-layer-it-lacks", {}, PPL + ["--protect", "999"], "--protect 999: layer(s) [999] do not exist in a model of 2 layers"),
    ("lut-on-a-cpu", {}, PPL + ["--backend", "lut", "--device", "cpu"], "--backend lut: the table-lookup kernel runs on CUDA only"),
    ("negative-seed", {}, PPL + ["--seed", "-1"], "--seed must be an integer >= 0, got -1"),
    ("empty-text-prompts", {"p.jsonl": "\n"}, PPL + ["--prompts", "{d}/p.jsonl"], "p.jsonl: no text in it"),
    ("audio-top-p-above-one", {}, AUDIO + ["--task-opt", "audio.top_p=2"], "task option audio.top_p=2: 2.0 is out of range"),
    ("kvpress-unknown-scorer", {}, TEXT + ["--task", "kvpress", "--task-opt", "kvpress.scorer=nope"], "must be one of"),
]


@pytest.mark.parametrize("files, argv, says", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_gets_one_line_before_the_model_loads(files, argv, says, tmp_path, checkpoint, capsys, no_model_loads,
                                                        monkeypatch):
    monkeypatch.delenv("HARNESS_DEBUG", raising=False)
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    line = one_line(capsys, fill(argv, ck=checkpoint, out=tmp_path / "run", d=tmp_path))
    assert says in line, line
    assert "a model loaded" not in line
    assert not (tmp_path / "run").exists()  # nothing written either


def test_harness_debug_0_is_not_debugging(tmp_path, checkpoint, capsys, no_model_loads, monkeypatch):
    monkeypatch.setenv("HARNESS_DEBUG", "0")
    assert "out of range" in one_line(capsys, fill(PPL + ["--task-opt", "perplexity.chunk=0"], ck=checkpoint,
                                                     out=tmp_path / "run", d=tmp_path))
    monkeypatch.setenv("HARNESS_DEBUG", "1")
    with pytest.raises(ValueError, match="out of range"):
        main(fill(PPL + ["--task-opt", "perplexity.chunk=0"], ck=checkpoint, out=tmp_path / "run", d=tmp_path))


def test_any_other_exception_is_one_line_naming_its_type(capsys, monkeypatch):
    import harness.cli.main as cli

    monkeypatch.delenv("HARNESS_DEBUG", raising=False)
    monkeypatch.setattr(cli, "cmd_list", lambda a: {}["nothing"])
    line = one_line(capsys, ["list"])
    assert line.startswith("harness list: error: KeyError: 'nothing'") and "HARNESS_DEBUG=1" in line


def test_pickled_weights_are_refused_in_one_line(tmp_path, checkpoint, capsys, monkeypatch):
    import datetime

    monkeypatch.delenv("HARNESS_DEBUG", raising=False)
    ck = tmp_path / "pickled"
    shutil.copytree(checkpoint, ck)
    for f in ck.glob("*.safetensors"):
        f.unlink()
    torch.save({"model.embed_tokens.weight": datetime.date(2026, 1, 1)}, ck / "pytorch_model.bin")
    line = one_line(capsys, fill(PPL, ck=ck, out=tmp_path / "run"))
    assert "pickled weights (*.bin) hold more than tensors" in line and str(ck) in line
    assert pickle.UnpicklingError.__name__ not in line.split(":")[0]


# --- a run folder's own files, edited or planted ------------------------------------------------------
def _first_row(run: Path) -> dict:
    return json.loads((run / "rows.jsonl").read_text().splitlines()[0])


FOLDER_CASES = [
    ("row-without-its-key", lambda run: (run / "rows.jsonl").write_text('{"x": 1}\n'),
     "rows.jsonl:1: a row needs 'task' (a string)"),
    ("row-seed-not-a-number", lambda run: (run / "rows.jsonl").write_text(
        json.dumps({**_first_row(run), "codec_seed": "abc"}) + "\n"), "rows.jsonl:1: 'codec_seed' must be an integer"),
    ("row-prompt-a-list", lambda run: (run / "rows.jsonl").write_text(
        json.dumps({**_first_row(run), "prompt": [3]}) + "\n"), "rows.jsonl:1: a row needs 'prompt' (a string), found [3]"),
    ("config-a-list", lambda run: (run / "config.json").write_text("[]"), "config.json: config.json must be a JSON object"),
    ("model-a-list", lambda run: (run / "model.json").write_text("[1]"), "model.json: model.json must be a JSON object"),
    ("config-not-json", lambda run: (run / "config.json").write_text("{"), "config.json:1:2: is not valid JSON"),
]


@pytest.mark.parametrize("spoil, says", [c[1:] for c in FOLDER_CASES], ids=[c[0] for c in FOLDER_CASES])
def test_a_spoiled_run_folder_gets_one_line(spoil, says, finished_run, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("HARNESS_DEBUG", raising=False)
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    spoil(run)
    assert says in one_line(capsys, ["report", str(run)])


def test_a_summary_of_the_wrong_shape_is_rebuilt(finished_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    (run / "summary.json").write_text("[]")
    assert main(["report", str(run)]) == 0
    assert isinstance(json.loads((run / "summary.json").read_text()), dict)


# --- harness lm-eval: model_args checked before the checkpoint loads ----------------------------------
LM_EVAL_CASES = [
    ("no-pretrained", "codec=octopus,bits=3", [], "needs pretrained= in --model_args"),
    ("batch-size-auto", "pretrained={ck}", ["--batch_size", "auto"], "batch_size must be a positive number"),
    ("batch-size-twice", "pretrained={ck},batch_size=2", ["--batch_size", "4"], "batch_size given both"),
    ("no-such-device", "pretrained={ck}", ["--device", "nosuch"], "device 'nosuch' is not a device"),
    ("unknown-codec", "pretrained={ck},codec=zip,bits=3", [], "Unknown codec 'zip'"),
    ("codec-without-bits", "pretrained={ck},codec=octopus", [], "codec=octopus needs bits="),
    ("bits-the-codec-lacks", "pretrained={ck},codec=octopus,bits=9", [], "codec 'octopus' does not support bits=9"),
    ("protect-a-layer-it-lacks", "pretrained={ck},codec=octopus,bits=3,protect=0:7", [], "protect=0:7"),
    ("chunk-zero", "pretrained={ck},chunk=0", [], "model option kvcodec.chunk=0: 0 is out of range (1 <= value)"),
    ("graphs-unknown", "pretrained={ck},graphs=always", [], "graphs 'always' is not one of auto, static, off"),
    ("protect-not-layers", "pretrained={ck},protect=first", [],
     "model 'kvcodec': protect takes 'none', 'boundary-1' or layer indices like 0,29 (or 0:29); got 'first'"),
    ("value-bits-above-16", "pretrained={ck},codec=octopus,bits=3,value_bits=17", [],
     "model 'kvcodec': value_bits must be in 1..16, got 17; leave it out to use the key bits"),
    # issue 41: no key dropped, no cache that cannot compress, no code from the folder
    ("misspelt-key", "pretrained={ck},codec=kivi,bits=2,resdual=4", [],
     "model 'kvcodec': unknown model_args key resdual=; did you mean residual=? kvcodec takes pretrained, codec,"),
    ("unknown-key", "pretrained={ck},bogus=1", [], "unknown model_args key bogus=; kvcodec takes"),
    ("hflm-loading-option", "pretrained={ck},revision=main", [],
     "revision= is an option of lm-eval's own loading, which kvcodec replaces"),
    ("trust-remote-code", "pretrained={ck},trust_remote_code=True", [],
     "trust_remote_code=True: the harness never runs code from a model folder"),
    ("residual-holds-every-position", "pretrained={ck},codec=kivi,bits=2,residual=100000", [],
     "model 'kvcodec': residual=100000: the native window would hold all of the model's 4096 positions, so no "
     "token ever reaches the codec"),
    ("residual-holds-max-length", "pretrained={ck},codec=kivi,bits=2,residual=64,max_length=64", [],
     "residual=64: the native window would hold all of the model's 64 positions"),
]


@pytest.fixture(scope="module")
def weightless(tmp_path_factory, checkpoint) -> Path:
    """The tiny checkpoint without its weights: a case that reached the load would fail on them instead."""
    d = tmp_path_factory.mktemp("weightless") / "ck"
    shutil.copytree(checkpoint, d)
    for f in d.glob("*.safetensors"):
        f.unlink()
    return d


@pytest.mark.parametrize("model_args, extra, says", [c[1:] for c in LM_EVAL_CASES], ids=[c[0] for c in LM_EVAL_CASES])
def test_lm_eval_model_args_are_checked_before_the_checkpoint_loads(model_args, extra, says, weightless):
    """What lm-eval calls to build the model (its options as its CLI passes them), every case."""
    pytest.importorskip("lm_eval.api")
    from harness.lm_eval.model import KVCodecLM

    options = {"batch_size": 1, "max_batch_size": None, "device": None}
    options.update({k.lstrip("-"): v for k, v in zip(extra[::2], extra[1::2])})
    with pytest.raises(ValueError) as e:
        KVCodecLM.create_from_arg_string(model_args.format(ck=weightless), options)
    assert says in str(e.value)


# one bad value through both front ends: (model_args name, value, harness run's flag)
SAME_WORDS = [("value_bits", "17", "--value-bits"), ("residual", "-1", "--residual"),
              ("batch_size", "0", "--batch-size"), ("device", "nosuch", "--device"), ("dtype", "float8", "--dtype"),
              ("codec_seed", "-1", "--codec-seeds"), ("bits", "0", "--bits")]


@pytest.mark.parametrize("arg, value, flag", SAME_WORDS, ids=[c[0] for c in SAME_WORDS])
def test_lm_eval_refuses_what_the_cli_refuses_in_its_words(arg, value, flag, weightless):
    """lm-eval's model_args are checked by the run's own declarations and checks: its line is the CLI's, with
    the model's name in front and the option named as model_args name it."""
    pytest.importorskip("lm_eval.api")
    from lm_eval.utils import simple_parse_args_string

    from harness.cli.commands import parse_run
    from harness.lm_eval.args import check_args
    from harness.run.config import RunError

    with pytest.raises(RunError) as cli:
        parse_run([f"{flag}={value}"]).config.validate()
    codec = ",codec=octopus" if arg == "bits" else ""
    with pytest.raises(ValueError) as lm:
        check_args(simple_parse_args_string(f"pretrained={weightless}{codec},{arg}={value}"))
    assert str(lm.value) == f"model 'kvcodec': {str(cli.value).replace(flag, arg)}"


THROUGH_THE_CLI = ("no-pretrained", "batch-size-auto", "no-such-device", "protect-a-layer-it-lacks")
LM_EVAL_LOG = r"\d{4}-\d\d-\d\d:\d\d:\d\d:\d\d (INFO|WARNING) "  # lm-eval's own log lines on stderr


def _lm_eval_argv(model_args: str, extra: list[str], weightless: Path, tmp_path: Path) -> list[str]:
    """`harness lm-eval` over one local task (the case fails before any request is made)."""
    (tmp_path / "t.yaml").write_text("task: t\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
                                     f"    test: {tmp_path / 't.jsonl'}\ntest_split: test\noutput_type: loglikelihood\n"
                                     "doc_to_text: '{{q}}'\ndoc_to_target: '{{a}}'\n")
    (tmp_path / "t.jsonl").write_text('{"q": "a", "a": " b"}\n')
    return ["lm-eval", "--model", "kvcodec", "--model_args", model_args.format(ck=weightless), "--tasks", "t",
            "--include_path", str(tmp_path), *extra]


@pytest.fixture
def lm_eval_unlogged(monkeypatch):
    """lm-eval logs through a handler it installs once, on the sys.stderr of that moment (a test's capsys
    stream, closed after it): in process its log goes nowhere, so no test's stderr holds it, nor a later
    test's a logging error about that closed stream, whatever the order."""
    import logging

    pytest.importorskip("lm_eval.api")
    import lm_eval.utils

    monkeypatch.setattr(lm_eval.utils, "_LOGGING_CONFIGURED", True)
    monkeypatch.setattr(logging.getLogger("lm_eval"), "handlers", [logging.NullHandler()])


@pytest.mark.parametrize("model_args, extra, says", [c[1:] for c in LM_EVAL_CASES if c[0] in THROUGH_THE_CLI],
                         ids=THROUGH_THE_CLI)
def test_lm_eval_model_args_get_one_line(model_args, extra, says, weightless, tmp_path, capsys, monkeypatch,
                                         lm_eval_unlogged):
    """Through the command a user types, in process: one line on stderr, exit code 2 (the subprocess below
    shows the same from a shell, lm-eval's own log lines aside)."""
    import functools

    import lm_eval.tasks

    monkeypatch.delenv("HARNESS_DEBUG", raising=False)
    # only the test's task is indexed (lm-eval's thousands of built-in tasks take ~10 s to index)
    monkeypatch.setattr(lm_eval.tasks, "TaskManager", functools.partial(lm_eval.tasks.TaskManager,
                                                                        include_defaults=False))
    line = one_line(capsys, _lm_eval_argv(model_args, extra, weightless, tmp_path))
    assert line.startswith("harness lm-eval: error: ") and says in line, line


def test_lm_eval_model_args_get_one_line_from_a_shell(weightless, tmp_path):
    """One case as a user runs it, `python -m harness.cli lm-eval ...`: one line on stderr, exit code 2."""
    import os
    import re
    import subprocess
    import sys

    pytest.importorskip("lm_eval.api")
    model_args, extra, says = next(c[1:] for c in LM_EVAL_CASES if c[0] == "no-pretrained")
    env = {k: v for k, v in os.environ.items() if k != "HARNESS_DEBUG"}
    r = subprocess.run([sys.executable, "-m", "harness.cli", *_lm_eval_argv(model_args, extra, weightless, tmp_path)],
                       capture_output=True, text=True, env=env, cwd=Path(__file__).resolve().parents[3], timeout=300)
    lines = [line for line in r.stderr.splitlines() if line.strip() and not re.match(LM_EVAL_LOG, line)]
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert lines[0].startswith("harness lm-eval: error: ") and says in lines[0], lines[0]


def test_harness_report_takes_the_lock(finished_run, tmp_path, capsys, monkeypatch):
    """Issue #27: a report of a folder that a single-process run still writes is refused in one line
    (it no longer rewrites the summary under the run); once the run ends it goes through."""
    from harness.run.lock import RunLock

    monkeypatch.delenv("HARNESS_DEBUG", raising=False)
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    before = (run / "summary.json").read_bytes()
    (run / "summary.json").write_text("{}")
    lock = RunLock(run)  # this live process, role 'run'
    lock.acquire()
    try:
        assert "is being written by a run still going" in one_line(capsys, ["report", str(run)])
        assert (run / "summary.json").read_text() == "{}"
    finally:
        lock.release()
    assert main(["report", str(run)]) == 0 and (run / "summary.json").read_bytes() == before


def test_report_md_shows_input_as_text(finished_run, tmp_path):
    """Issue #27: a prompt id with raw HTML, Markdown and a NUL byte is shown escaped in report.md, and
    an artifact path from a row is linked only inside the folder."""
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    hostile = '<img src=x onerror=alert(1)>|*b*\x00`c`'
    rows = [json.loads(line) for line in (run / "rows.jsonl").read_text().splitlines()]
    for r in rows:
        r["prompt"] = hostile
    (run / "video").mkdir()
    (tmp_path / "outside.png").write_bytes(b"not ours")
    (run / "video" / "link.png").symlink_to(tmp_path / "outside.png")
    rows[-1]["artifacts"] = {"drift": "/abs/secret.json", "sheet": "../../x.png", "mp4": "video/a b.mp4",
                             "plot": "video/link.png"}
    (run / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "summary.json").unlink()
    assert main(["report", str(run)]) == 0
    md = (run / "report.md").read_text()
    assert "<img" not in md and "\x00" not in md and "&lt;img src=x onerror=alert(1)&gt;\\|\\*b\\*\ufffd\\`c\\`" in md
    assert "](/abs" not in md and "](../" not in md and "drift (outside the run folder)" in md
    assert "plot (outside the run folder)" in md and "link.png" not in md  # a link inside that leads out
    assert "[mp4](video/a%20b.mp4)" in md
    # raw HTML (<summary>) gets HTML escapes only: Markdown's backslashes would show there
    assert "<summary>perplexity / &lt;img src=x onerror=alert(1)&gt;|*b*\ufffd`c`</summary>" in md


def test_triton_on_a_cpu_without_the_interpreter_is_refused_before_the_model_loads(tmp_path, checkpoint, capsys,
                                                                                   no_model_loads, monkeypatch):
    import kernels.triton as kt

    monkeypatch.delenv("HARNESS_DEBUG", raising=False)
    monkeypatch.setattr(kt, "interpreting", lambda: False)  # the test suite itself runs under TRITON_INTERPRET=1
    line = one_line(capsys, fill(PPL + ["--backend", "triton", "--device", "cpu"], ck=checkpoint, out=tmp_path / "run"))
    assert "--backend triton: the Triton kernels need a CUDA device (or TRITON_INTERPRET=1)" in line


def test_a_plan_of_the_wrong_shape_is_planned_again(finished_run, tmp_path, checkpoint):
    """plan.json is the harness's own record of the batches; a resume that finds it unreadable plans again."""
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    config = json.loads((run / "config.json").read_text())
    (run / "plan.json").write_text("[]")
    (run / "fox.txt").write_text(FOX)
    assert main(tiny_run_argv(checkpoint, config["prompts"], run)) == 0
    assert isinstance(json.loads((run / "plan.json").read_text()), dict)


def test_harness_report_of_a_folder_that_is_no_run(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("HARNESS_DEBUG", raising=False)
    assert "is not a run folder (no config.json)" in one_line(capsys, ["report", str(tmp_path / "nosuch")])


def test_valid_input_that_looks_unusual_is_accepted(tmp_path, checkpoint):
    """What the checks must not refuse: numeric prompt ids, value bits apart from the codec's key bits, a
    torch dtype from Python, and contexts that RoPE scaling stretches past max_position_embeddings."""
    from adapters.hf.models import declared_shape
    from harness.tasks import get_task

    f = tmp_path / "v.json"
    f.write_text('[{"id": 7, "prompt": "a corgi"}, "a cat"]')
    assert [p.id for p in get_task("video")().prompts(str(f))] == [7, "001_a_cat"]
    pytest.importorskip("lm_eval.api")
    from harness.lm_eval.args import check_args

    check_args({"pretrained": str(checkpoint), "codec": "octopus", "bits": 3, "value_bits": 8, "dtype": torch.bfloat16})
    ck = tmp_path / "yarn"
    shutil.copytree(checkpoint, ck)
    config = json.loads((checkpoint / "config.json").read_text())
    base = {k: v for k, v in config.items() if k not in ("layer_types", "rope_parameters")}
    base.update(num_hidden_layers=4, max_position_embeddings=32768)
    (ck / "config.json").write_text(json.dumps({**base, "rope_scaling": {"type": "yarn", "factor": 4.0,
                                                                         "original_max_position_embeddings": 32768}}))
    assert declared_shape(ck, "hf")[::3] == (4, 131072)  # (layers, positions)
    (ck / "config.json").write_text(json.dumps({**base, "max_position_embeddings": 131072, "rope_scaling": {
        "rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0}}))
    assert declared_shape(ck, "hf")[::3] == (4, 131072)  # llama 3.1 declares the stretched length already
