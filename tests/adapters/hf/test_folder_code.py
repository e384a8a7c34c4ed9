"""A model folder's Python never runs (issue 41, case 1): a folder whose config asks for its own classes
(``auto_map``) is refused in one line before transformers reads it, even with "y" waiting on stdin for
transformers' "run custom code? [y/N]"; every ``from_pretrained`` of the harness passes
``trust_remote_code=False``, which holds where that first check is bypassed; and lm-eval's ``kvcodec`` model
refuses ``trust_remote_code=True``."""
from __future__ import annotations

import ast
import io
import json
import shutil
import sys
from pathlib import Path

import pytest
from helpers.bad_input import one_line
from helpers.tiny_lm import save_tiny_checkpoint

ROOT = Path(__file__).resolve().parents[3]
#: what the folder's module does when it is imported: the marker the tests look for
MODULE = "import pathlib\npathlib.Path(__file__).with_name('RAN').write_text('the folder ran')\n"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return save_tiny_checkpoint(tmp_path_factory.mktemp("ck") / "tiny")


def _evil(tiny: Path, where: Path, model_type: str = "evilqwen") -> Path:
    """The tiny checkpoint with a config that names a class of its own module (which leaves a marker)."""
    evil = where / "evil"
    shutil.copytree(tiny, evil)
    config = json.loads((evil / "config.json").read_text())
    config.update(model_type=model_type, auto_map={"AutoConfig": "configuration_evil.EvilConfig",
                                                   "AutoModelForCausalLM": "modeling_evil.EvilModel"})
    (evil / "config.json").write_text(json.dumps(config))
    for name in ("configuration_evil.py", "modeling_evil.py"):
        (evil / name).write_text(MODULE)
    return evil


@pytest.fixture
def yes(monkeypatch):
    """transformers' prompt would read this: the answer that ran the folder's code before."""
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n" * 20))
    monkeypatch.delenv("HARNESS_DEBUG", raising=False)


def test_harness_run_refuses_the_folder_before_its_code_runs(tiny, tmp_path, capsys, yes):
    evil = _evil(tiny, tmp_path)
    line = one_line(capsys, ["run", "--model", "hf", "--model-path", str(evil), "--codec", "kivi", "--bits", "2",
                             "--task", "perplexity", "--out", str(tmp_path / "run")])
    assert "config.json asks to run the folder's own Python" in line and "evilqwen" in line, line
    assert not (evil / "RAN").exists()
    assert not (tmp_path / "run").exists()


def test_lm_eval_refuses_the_folder_and_trust_remote_code(tiny, tmp_path, yes):
    from harness.lm_eval.args import check_args

    evil = _evil(tiny, tmp_path)
    with pytest.raises(ValueError, match="asks to run the folder's own Python"):
        check_args({"pretrained": str(evil), "codec": "kivi", "bits": 2})
    with pytest.raises(ValueError, match="trust_remote_code=True: the harness never runs code from a model folder"):
        check_args({"pretrained": str(tiny), "codec": "kivi", "bits": 2, "trust_remote_code": True})
    assert not (evil / "RAN").exists()


def test_trust_remote_code_false_holds_without_the_first_check(tiny, tmp_path, yes, monkeypatch):
    """With the JSON check taken away, transformers itself refuses (trust_remote_code=False), and the load
    fails in one line naming the folder, the "y" on stdin unread."""
    import adapters.hf.models as models

    monkeypatch.setattr(models, "refuse_folder_code", lambda *a, **k: None)
    evil = _evil(tiny, tmp_path)
    with pytest.raises(ValueError, match="custom code|own Python") as e:
        models.load_checkpoint(evil, "hf", "cpu")
    assert "\n" not in str(e.value).strip()
    assert not (evil / "RAN").exists()
    assert sys.stdin.read() == "y\n" * 20


def test_a_folder_of_a_known_architecture_loads_transformers_own_classes(tiny, tmp_path, yes):
    """An auto_map beside a model type transformers ships (a config or a tokenizer naming the folder's module)
    is not refused: transformers' own classes load, and the folder's module is never imported."""
    from adapters.hf.models import load_checkpoint

    known = _evil(tiny, tmp_path, model_type=json.loads((tiny / "config.json").read_text())["model_type"])
    tok = json.loads((known / "tokenizer_config.json").read_text())
    tok.update(auto_map={"AutoTokenizer": [None, "tokenization_evil.EvilTokenizer"]}, tokenizer_class="EvilTokenizer")
    (known / "tokenizer_config.json").write_text(json.dumps(tok))
    (known / "tokenization_evil.py").write_text(MODULE)
    lm = load_checkpoint(known, "hf", "cpu")
    assert type(lm.model).__module__.startswith("transformers.")
    assert type(lm.tokenizer).__module__.startswith("transformers.")
    assert not (known / "RAN").exists()


#: from_pretrained calls that may go without the keyword, and why
FIXED_CLASSES = {"AutoencoderKLWan": "a diffusers model class: ModelMixin imports no module of a folder, and "
                                     "takes no trust_remote_code"}


#: the calls of transformers and diffusers that can run a folder's or a Hub repository's code (datasets'
#: load_dataset runs no loading script since datasets 4: it refuses trust_remote_code itself)
LOADERS = ("from_pretrained", "from_single_file", "pipeline")


def test_every_from_pretrained_passes_no_folder_code():
    """Each loader call (:data:`LOADERS`) in the harness's own code passes ``**NO_FOLDER_CODE`` (or
    ``trust_remote_code=False``), so a new loader cannot forget it."""
    missing, seen = [], 0
    for package in ("adapters", "harness", "kernels", "metrics", "scripts", "registry"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if not isinstance(node, ast.Call):
                    continue
                called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                if called not in LOADERS:
                    continue
                seen += 1
                owner = ast.unparse(node.func.value) if isinstance(node.func, ast.Attribute) else called
                passed = any((k.arg is None and ast.unparse(k.value) == "NO_FOLDER_CODE")
                             or (k.arg == "trust_remote_code" and ast.unparse(k.value) == "False")
                             for k in node.keywords)
                if not passed and owner not in FIXED_CLASSES:
                    missing.append(f"{path.relative_to(ROOT)}:{node.lineno} {owner}: {called}")
    assert seen >= 10, seen  # the walk found the loaders (config, model, tokenizer, GGUF, Wan, CLAP)
    assert not missing, missing
