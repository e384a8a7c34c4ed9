"""adapters/loading.py: checkpoint files are read as tensors only; anything else is a one-line error
that names the file and the fix."""
from __future__ import annotations

import argparse

import pytest
import torch
from helpers.hostile import save_hostile

from adapters.loading import CheckpointError, safe_torch_load


def test_hostile_pickle_is_refused_and_runs_nothing(tmp_path):
    marker = tmp_path / "pwned"
    f = save_hostile({"state_dict": {"w": torch.ones(2)}}, tmp_path / "evil.pt", marker)
    with pytest.raises(CheckpointError) as e:
        safe_torch_load(f, "test checkpoint", "state_dict")
    assert not marker.exists()
    msg = str(e.value)
    assert "\n" not in msg and str(f) in msg and "safetensors" in msg and "['state_dict']" in msg


def test_release_training_args_are_allowed(tmp_path):
    torch.save({"model_state_dict": {"w": torch.arange(3.0)}, "args": argparse.Namespace(lr=1e-4, depth=[16]),
                "epoch": 7}, tmp_path / "ok.pth")
    ckpt = safe_torch_load(tmp_path / "ok.pth")
    assert torch.equal(ckpt["model_state_dict"]["w"], torch.arange(3.0)) and ckpt["args"].depth == [16]


@pytest.mark.parametrize("content", [b"", b"not a checkpoint at all", b"PK\x03\x04truncated zip"])
def test_corrupt_or_empty_file_is_one_line(tmp_path, content):
    f = tmp_path / "model.pt"
    f.write_bytes(content)
    with pytest.raises(CheckpointError) as e:
        safe_torch_load(f, "generator")
    assert "\n" not in str(e.value) and str(f) in str(e.value) and "not a readable" in str(e.value)


def test_safetensors_and_missing_file(tmp_path):
    from safetensors.torch import save_file
    save_file({"w": torch.ones(2, 3)}, tmp_path / "m.safetensors")
    assert safe_torch_load(tmp_path / "m.safetensors")["w"].shape == (2, 3)
    (tmp_path / "bad.safetensors").write_bytes(b"\x00" * 3)
    with pytest.raises(CheckpointError, match="not a readable safetensors"):
        safe_torch_load(tmp_path / "bad.safetensors")
    with pytest.raises(CheckpointError, match="does not exist"):
        safe_torch_load(tmp_path / "absent.pt")


def test_conversion_hint_picks_the_entry_the_loader_reads():
    """The hint's snippet, run on a checkpoint dict, selects what the loader would: the EMA weights
    where present, else the plain generator."""
    from adapters.loading import _entry_expr

    expr = _entry_expr(("generator_ema", "generator"))
    for ckpt, want in (({"generator": 1, "generator_ema": 2}, 2), ({"generator": 1}, 1)):
        scope = {"sd": ckpt}
        exec(expr.lstrip("; "), scope)  # the hint's own code
        assert scope["sd"] == want
    assert _entry_expr("model") == "['model']" and _entry_expr(None) == ""


def test_the_conversion_hint_converts_without_unsafe_loading(tmp_path):
    """A checkpoint that pickles a class of its own is refused; the one-line hint is a command that,
    run where the class's package is importable, loads the file weights-only with just that class
    allowed and writes the weights as safetensors, which then load."""
    import subprocess
    import sys

    from safetensors.torch import load_file

    (tmp_path / "trainmod.py").write_text("class Args:\n    def __init__(self):\n        self.lr = 0.1\n")
    code = ("import torch, trainmod; torch.save({'generator': {'w': torch.arange(3.0)}, 'args': trainmod.Args()}, "
            "'ck.pt')")
    subprocess.run([sys.executable, "-c", code], cwd=tmp_path, check=True)
    with pytest.raises(CheckpointError) as e:
        safe_torch_load(tmp_path / "ck.pt", key="generator")
    msg = str(e.value)
    assert "'trainmod.Args'" in msg and "weights_only=False" not in msg and "\n" not in msg
    command = msg.split('python -c "', 1)[1].rstrip('"')
    subprocess.run([sys.executable, "-c", command], cwd=tmp_path, check=True)
    assert torch.equal(load_file(tmp_path / "ck.safetensors")["w"], torch.arange(3.0))
