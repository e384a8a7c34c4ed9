"""harness/run/config.py + harness/run/flags.py + harness/cli/main.py: the `harness run` command line is generated (tyro)
from RunConfig's annotated fields; every field is reachable from argv and survives the JSON round trip."""
from __future__ import annotations

import json
import re
from dataclasses import fields

import pytest

from adapters.cache.config import CacheConfig
from harness.cli.main import main
from harness.cli.commands import parse_run
from harness.run.config import DEFAULT_BITS, DEFAULT_CODECS, RunConfig, RunError


def parse(argv: list[str]) -> RunConfig:
    return parse_run(argv).config


def roundtrip(c: RunConfig) -> RunConfig:
    return RunConfig.from_json(c.to_json())


# argv -> the fields it sets, covering every RunConfig field
ARGV = {
    "model": (["--model", "hf"], "hf"),
    "model_path": (["--model-path", "/ckpt"], "/ckpt"),
    "tasks": (["--task", "perplexity,needle"], ["perplexity", "needle"]),
    "codecs": (["--codec", "octopus,qjl", "kivi"], ["octopus", "qjl", "kivi"]),
    "bits": (["--bits", "2", "3,4"], [2, 3, 4]),
    "prompts": (["--prompts", "wikitext2"], "wikitext2"),
    "limit": (["--limit", "3"], 3),
    "margin": (["--margin", "0.01"], 0.01),
    "seed": (["--seed", "7"], 7),
    "codec_seeds": (["--codec-seeds", "3", "5,8"], [3, 5, 8]),
    "residual": (["--residual", "16"], 16),
    "protect": (["--protect", "0,29"], [0, 29]),
    "value_bits": (["--value-bits", "4"], 4),
    "value_group": (["--value-group", "64"], 64),
    "attend": (["--attend", "reconstruct"], "reconstruct"),
    "backend": (["--backend", "torch"], "torch"),
    "device": (["--device", "cpu"], "cpu"),
    "dtype": (["--dtype", "float32"], "float32"),
    "batch_size": (["--batch-size", "3"], 3),
    "task_options": (["--task-opt", "needle.contexts=512,1024", "--task-opt", "needle.depths=0.5"],
                     {"needle": {"contexts": "512,1024", "depths": "0.5"}}),
    "codec_options": (["--codec-opt", "octopus.split=3,3,3", "--codec-opt", "qjl.sketch=64"],
                      {"octopus": {"split": "3,3,3"}, "qjl": {"sketch": "64"}}),
    "baseline": (["--no-baseline-row"], False),
    "device_map": (["--device-map", "auto"], "auto"),
    "graphs": (["--graphs", "off"], "off"),
    "prefill_chunk": (["--prefill-chunk", "4096"], 4096),
}


def test_every_field_has_a_flag_and_the_defaults_are_the_dataclass_defaults():
    assert set(ARGV) == {f.name for f in fields(RunConfig)}
    assert parse([]) == RunConfig()
    assert RunConfig().codecs == list(DEFAULT_CODECS) and RunConfig().bits == list(DEFAULT_BITS)


@pytest.mark.parametrize("name", sorted(ARGV))
def test_each_flag_sets_its_field_and_round_trips(name):
    argv, want = ARGV[name]
    c = parse(argv)
    assert getattr(c, name) == want
    assert roundtrip(c) == c
    assert all(getattr(c, f.name) == getattr(RunConfig(), f.name) for f in fields(RunConfig) if f.name != name)


def test_all_flags_together_round_trip():
    c = parse([a for argv, _ in ARGV.values() for a in argv])
    assert {n: getattr(c, n) for n in ARGV} == {n: want for n, (_, want) in ARGV.items()}
    assert roundtrip(c) == c


def test_presets_fill_what_the_flags_leave():
    from harness.run.config import PRESETS

    preset = parse

    assert preset([]) == RunConfig()  # 'default' is the dataclass defaults
    full = preset(["--preset", "full"])
    assert full.tasks == PRESETS["full"]["tasks"] and full.codec_seeds == PRESETS["full"]["codec_seeds"]
    assert full.task_options == PRESETS["full"]["task_options"]
    # a flag wins over the preset; task options merge per option; options of a task left out go
    mixed = preset(["--preset", "full", "--codec-seeds", "4", "--task-opt", "perplexity.context=600",
                    "--task", "perplexity"])
    assert mixed.codec_seeds == [4] and mixed.tasks == ["perplexity"]
    assert mixed.task_options == {"perplexity": {**PRESETS["full"]["task_options"]["perplexity"], "context": "600"}}
    with pytest.raises(SystemExit):
        preset(["--preset", "huge"])


def test_protect_names():
    assert parse(["--protect", "boundary-1"]).protect == "boundary-1"
    assert parse(["--protect", "none"]).protect == "none"


@pytest.mark.parametrize("argv, message", [
    (["--bits", "two"], "--bits takes int values, got 'two'"),
    (["--protect", "first"], "--protect takes 'none', 'boundary-1' or layer indices"),
    (["--attend", "fast"], "invalid choice 'fast' for argument '--attend'"),
    (["--task-opt", "needle=1"], "--task-opt takes TASK.NAME=VALUE, got 'needle=1'"),
    (["--codec-opt", "octopus.split"], "--codec-opt takes CODEC.NAME=VALUE, got 'octopus.split'"),
    (["--limit", "many"], "Error parsing --limit: no type matching {None}|INT could be instantiated from ['many']"),
    (["--preset", "huge"], "invalid choice 'huge' for argument '--preset'"),
])
def test_malformed_flags_are_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        parse(argv)
    # tyro draws a box around the message and folds it to the terminal's width: read it back as one line
    err = " ".join(re.sub(r"[│╭╮╰╯─]", " ", capsys.readouterr().err).split())
    assert e.value.code == 2 and message in err


def test_codec_options_reach_that_codecs_cache_configs_only():
    c = parse(["--codec", "octopus", "qjl", "--bits", "2", "3", "--codec-opt", "octopus.split=4,2",
               "--codec-opt", "octopus.rounding=nearest"])
    ccs = c.cache_configs()
    assert [cc.label for cc in ccs] == ["none", "octopus@2", "octopus@3", "qjl@2", "qjl@3"]
    # read by the types of the codec's Options: "4,2" is the tuple (b_u, b_r)
    from kernels import codec_class

    octo = codec_class("octopus").Options(split=(4, 2), rounding="nearest")
    assert [cc.options for cc in ccs] == [codec_class(n).Options() if n != "octopus" else octo
                                          for n in ("none", "octopus", "octopus", "qjl", "qjl")]
    assert ccs[1].options is ccs[2].options  # read once, shared by every bit width of the codec
    assert all(CacheConfig.from_json(json.loads(json.dumps(cc.to_json()))) == cc for cc in ccs)


@pytest.mark.parametrize("opt, message", [
    ("octopus.split=3,3,3", r"codec option octopus\.split=3,3,3: cannot read it as tuple\[int, int\] \| None"),
    ("octopus.rounding=round", r"codec option octopus\.rounding must be one of"),
    ("octopus.splt=4,2", r"codec 'octopus' got unknown option\(s\) \['splt'\]"),
])
def test_bad_codec_options_are_one_line_errors(opt, message):
    with pytest.raises(RunError, match=message):
        parse(["--codec", "octopus", "--codec-opt", opt]).cache_configs()


def test_codec_options_for_a_codec_the_run_does_not_have(capsys, tmp_path):
    with pytest.raises(RunError, match=r"options given for codec\(s\) \['kivi'\] that this run does not have"):
        parse(["--codec", "octopus", "--codec-opt", "kivi.group=64"]).cache_configs()
    assert main(["run", "--codec", "octopus", "--codec-opt", "kivi.group=64", "--quiet",
                 "--out", str(tmp_path / "x")]) == 2
    assert "options given for codec(s) ['kivi']" in capsys.readouterr().err


def test_batch_size_left_out_is_chosen_for_the_device_and_old_configs_load():
    from harness.run.config import AUTO_BATCH_SIZE, batch_size_for

    assert batch_size_for(None, "cpu") == AUTO_BATCH_SIZE["cpu"]
    assert batch_size_for(None, "cuda:1") == AUTO_BATCH_SIZE["cuda"]
    assert batch_size_for(5, "cuda") == 5
    # a config.json from before --batch-size, when perplexity's own batch option held the size
    old = {k: v for k, v in RunConfig().to_json().items() if k != "batch_size"}
    old["task_options"] = {"perplexity": {"batch": 8}}
    c = RunConfig.from_json(json.loads(json.dumps(old)))
    assert c.batch_size is None and c.task_options == {"perplexity": {"batch": 8}}


def _five_configs():
    from harness.scale.slurm import SlurmConfig
    from kernels import make_codec
    from kernels.config import CodecConfig
    from kernels.cuda.lut_config import default_config

    return [RunConfig(), CacheConfig(), SlurmConfig(), CodecConfig("octopus", 3, 64),
            default_config(make_codec("octopus", 3, 128))]


def test_configs_refuse_a_json_version_they_do_not_know():
    """The five configurations' one round trip (registry.versioned): the version checked in one wording,
    unknown fields refused naming the known ones; a file without a version is read as the current one by
    the configurations that always read it so (run, cache, slurm), refused by the others (codec, lut)."""
    for c in _five_configs():
        cls, what = type(c), type(c).json_form.what
        d = json.loads(json.dumps(c.to_json()))
        assert cls.from_json(d) == c and list(d)[0] == "version"
        with pytest.raises(ValueError, match=f"^{what} version 99 is not the supported {d['version']}$"):
            cls.from_json({**d, "version": 99})
        with pytest.raises(ValueError, match=rf"^unknown {cls.__name__} field\(s\) \['zzz'\]; known: \["):
            cls.from_json({**d, "zzz": 1})
        versionless = {k: v for k, v in d.items() if k != "version"}
        if cls.json_form.versionless:
            assert cls.from_json(versionless) == c
        else:
            with pytest.raises(ValueError, match=f"^{what} version None is not the supported"):
                cls.from_json(versionless)
    assert [type(c).json_form.versionless for c in _five_configs()] == [True, True, True, False, False]


def test_flags_are_read_from_the_annotations():
    from harness.run.config import flag

    assert [flag(f) for f in ("codecs", "tasks", "batch_size", "task_options", "baseline", "protect")] == \
        ["--codec", "--task", "--batch-size", "--task-opt", "--baseline-row", "--protect"]


@pytest.mark.parametrize("bad, says", [
    (dict(residual="8"), "--residual must be >= 0 tokens, got '8'"),
    (dict(value_bits=17), "--value-bits must be in 1..16, got 17"),
    (dict(value_group=1.5), "--value-group must be >= 1, got 1.5"),
    (dict(margin="x"), "--margin must be a finite number >= 0"),
    (dict(graphs="always"), "--graphs 'always' is not one of auto, static, off"),
    (dict(attend="fast"), "--attend 'fast' is not one of score, reconstruct"),
    (dict(protect="first"), "--protect takes 'none', 'boundary-1' or layer indices like 0,29 (or 0:29); got 'first'"),
    (dict(batch_size="auto"), "--batch-size must be a positive number of prompts, got 'auto'"),
])
def test_validate_checks_what_python_and_json_give(bad, says):
    """What tyro checks on the command line, validate checks for a RunConfig from Python or JSON; a front end
    that names the fields otherwise gets the same words with its names (lm-eval's model_args)."""
    with pytest.raises(RunError) as e:
        RunConfig(**bad).validate()
    assert str(e.value).startswith(says), str(e.value)
    with pytest.raises(RunError) as e:
        RunConfig(**bad).validate(lambda name: f"<{name}>")
    assert str(e.value).startswith(says.replace(says.split()[0], f"<{next(iter(bad))}>", 1))


def test_protect_takes_both_separators_and_is_held_canonical():
    assert parse(["--protect", "0:29"]).protect == [0, 29] == parse(["--protect", "0,29"]).protect
    c = RunConfig(protect="0:-1")  # from Python: read by the same parser when checked
    c.validate()
    assert c.protect == [0, -1]
