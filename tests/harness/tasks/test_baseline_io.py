"""harness/tasks/baseline_io.py: baselines are stored as safetensors + JSON and read back without
unpickling anything; a hostile pickle left in a run folder runs no code."""
from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
from helpers.hostile import save_hostile

from harness.tasks.baseline_io import META_KEY, READS, BaselineFormatError, load_tree, save_tree


@dataclass
class Inner:
    tokens: list
    scale: float
    cache: object = None


@dataclass
class Outer:
    emb: torch.Tensor
    inner: Inner
    seconds: float


def _same(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return type(b) is dict and list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return type(a) is type(b) and a == b


def test_round_trip_every_kind_of_baseline(tmp_path):
    base = torch.arange(12.0).reshape(3, 4)
    tree = {"ids_sha": "ab12", "tokens": [1, 2, 3], "nll": base[0], "view": base[:, 1],  # views share storage
            "top": (torch.tensor([[1, 2]], dtype=torch.int64), torch.ones(2, dtype=torch.bfloat16)),
            "value": 7, 3: None, "inf": math.inf, "nan": math.nan, "flag": True, "empty": torch.zeros(0, 4)}
    save_tree(tree, tmp_path / "b.pt")
    assert _same(tree, load_tree(tmp_path / "b.pt"))
    obj = Outer(torch.randn(1, 5), Inner([torch.tensor([3, 1]), torch.tensor([[4]])], 0.5), 10.0)
    save_tree(obj, tmp_path / "d.pt")
    back = load_tree(tmp_path / "d.pt", (Outer, Inner))
    assert isinstance(back, Outer) and isinstance(back.inner, Inner) and back.inner.cache is None
    assert _same(obj.emb, back.emb) and _same(obj.inner.tokens, back.inner.tokens) and back.seconds == 10.0
    with pytest.raises(BaselineFormatError, match="does not store"):
        load_tree(tmp_path / "d.pt", (Inner,))  # a class the task did not name is never built
    with pytest.raises(TypeError, match="cannot hold a set"):
        save_tree({"s": {1}}, tmp_path / "x.pt")


@pytest.mark.parametrize("damage", ["tree", "fields", "tensor"])
def test_damaged_baseline_is_a_format_error(tmp_path, damage):
    """A file with the harness format tag but a damaged body is one BaselineFormatError, not a traceback."""
    from safetensors.torch import load_file, save_file
    from safetensors import safe_open

    f = tmp_path / "b.pt"
    save_tree({"x": torch.ones(2), "inner": Inner([1, 2], 3.0)}, f)
    with safe_open(str(f), framework="pt") as h:
        meta = dict(h.metadata())
    tensors = load_file(str(f))
    if damage == "tree":
        meta[META_KEY] = meta[META_KEY][:-3]
    elif damage == "fields":
        meta[META_KEY] = meta[META_KEY].replace('"fields"', '"fieldz"')
    else:
        tensors = {}
    save_file(tensors, str(f), metadata=meta)
    with pytest.raises(BaselineFormatError, match="is damaged"):
        load_tree(f, (Inner,))


def test_hostile_pickle_baseline_runs_no_code(tmp_path):
    marker = tmp_path / "pwned"
    f = save_hostile({"latents": torch.zeros(1)}, tmp_path / "000_prompt.pt", marker)
    with pytest.raises(BaselineFormatError) as e:
        load_tree(f)
    assert not marker.exists()
    assert str(f) in str(e.value) and "computed again" in str(e.value) and "\n" not in str(e.value)


def test_old_plain_pickle_baseline_still_reads(tmp_path):
    torch.save({"latents": torch.ones(2, 3), "ids_sha": "x"}, tmp_path / "old.pt")
    d = load_tree(tmp_path / "old.pt")
    assert torch.equal(d["latents"], torch.ones(2, 3)) and d["ids_sha"] == "x"
    (tmp_path / "junk.pt").write_bytes(b"garbage")
    with pytest.raises(BaselineFormatError, match="neither a safetensors file nor a PyTorch file"):
        load_tree(tmp_path / "junk.pt")


def test_resuming_a_run_folder_with_a_hostile_baseline_runs_no_code(tmp_path):
    """Resuming someone else's run folder used to unpickle its baselines/*.pt."""
    from harness.run.config import RunConfig
    from harness.runner import run
    from helpers.tiny_lm import tiny_causal_lm

    text = tmp_path / "fox.txt"
    text.write_text(("The quick brown fox jumps over the lazy dog. " * 40).strip())
    cfg = RunConfig(model="hf", model_path="(tiny)", tasks=["perplexity"], codecs=["kivi"], bits=[4],
                    prompts=str(text), limit=1, residual=8,
                    task_options={"perplexity": {"context": 100, "prefix": 40, "chunk": 20}})
    lm = tiny_causal_lm("qwen2")
    out = run(cfg, out=tmp_path / "run", model=lm, progress=False, log=lambda *_: None)
    [stored] = list((out / "baselines").rglob("*.safetensors"))
    with open(stored, "rb") as f:
        assert f.read(8) != b"PK\x03\x04" and b"kvcodec-harness baseline" in f.read(4096)  # safetensors
    (out / "rows.jsonl").write_text("")  # resume: every row again, from the stored baseline
    marker = tmp_path / "pwned"
    save_hostile({"nll": torch.zeros(1)}, stored, marker)
    with pytest.raises(ValueError, match="never runs code"):
        run(cfg, out=out, model=lm, progress=False, log=lambda *_: None)
    assert not marker.exists()
    # a folder from before the files were named .safetensors: its .pt is read the same way
    legacy = stored.with_suffix(".pt")
    stored.rename(legacy)
    with pytest.raises(ValueError, match="never runs code"):
        run(cfg, out=out, model=lm, progress=False, log=lambda *_: None)
    assert not marker.exists()


def test_a_baseline_is_the_same_bytes_every_time(tmp_path):
    """safetensors writes its metadata map in a hash order that changes from one write to the next (a new hash
    seed per map: two keys come out in either order), so the baseline keeps everything under one key: twenty
    writes of the same baseline are the same bytes (with two keys, 20 writes agreeing has odds of 2 ** -19)."""
    files = [tmp_path / f"{i}.pt" for i in range(20)]
    for f in files:
        save_tree({"a": torch.arange(3.0), "b": [1, "x"], "c": (2.5,)}, f)
    assert len({f.read_bytes() for f in files}) == 1


def test_a_format_1_baseline_still_reads(tmp_path):
    """Format 1 (two metadata keys, the tree as text) reads as it did."""
    import json

    from safetensors.torch import save_file

    tree = {"$dict": [["x", {"$tensor": "t0", "device": "cpu"}], ["n", 3]]}
    save_file({"t0": torch.ones(2)}, str(tmp_path / "old.pt"), metadata={"format": READS[0], "tree": json.dumps(tree)})
    d = load_tree(tmp_path / "old.pt")
    assert torch.equal(d["x"], torch.ones(2)) and d["n"] == 3
