"""``harness lm-eval-sweep`` with a stand-in for lm-eval's evaluate (results built by hand in the
log_samples layout): the configurations it runs and their model_args, the table it writes, the
arguments it refuses before any model loads, and the one-line error without lm-eval."""
from __future__ import annotations

import sys

import pytest

DOCS = 6


def fake_result(acc: list[int], bits: float = 3.0) -> dict:
    """A simple_evaluate dict of one task 'mc' (2-choice log-likelihood, acc per document)."""
    samples = [{"doc_id": d, "filter": "none", "metrics": ["acc"], "acc": float(a),
                "resps": [[(-1.0 - d, True)], [(-2.0 - d, False)]]} for d, a in enumerate(acc)]
    return {"results": {"mc": {"alias": "mc", "acc,none": sum(acc) / len(acc), "acc_stderr,none": 0.1}},
            "higher_is_better": {"mc": {"acc": True}}, "samples": {"mc": samples},
            "config": {"kvcodec": {"mean": {"bits_per_coord": bits, "value_bits_per_coord": bits}}}}


class FakeEvaluate:
    """Records every (model, model_args); the hf reference answers all documents, codecs miss one."""

    def __init__(self):
        self.calls: list[tuple[str, str]] = []

    def __call__(self, model: str, model_args: str) -> dict:
        self.calls.append((model, model_args))
        return fake_result([1] * DOCS if model == "hf" else [0] + [1] * (DOCS - 1))


@pytest.fixture
def sweep_module():
    pytest.importorskip("lm_eval.api")
    import harness.lm_eval.sweep

    return harness.lm_eval.sweep


def test_runs_hf_then_each_configuration_at_its_codec_seeds(sweep_module, capsys):
    evaluate = FakeEvaluate()
    ref, rows = sweep_module.sweep(evaluate, "CK", ["mc"], ["kivi", "octopus"], [2], [0, 1], extra="residual=4")
    assert evaluate.calls == [
        ("hf", "pretrained=CK,dtype=float32"),
        ("kvcodec", "pretrained=CK,dtype=float32,codec=none,residual=4,codec_seed=0"),  # not randomized: once
        ("kvcodec", "pretrained=CK,dtype=float32,codec=kivi,bits=2,residual=4,codec_seed=0"),
        ("kvcodec", "pretrained=CK,dtype=float32,codec=octopus,bits=2,residual=4,codec_seed=0"),  # randomized
        ("kvcodec", "pretrained=CK,dtype=float32,codec=octopus,bits=2,residual=4,codec_seed=1")]
    assert ref.seed == 0 and [r.label for r in rows] == ["none", "kivi@2", "octopus@2"]
    assert [[run.seed for run in r.runs] for r in rows] == [[0], [0], [0, 1]]
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert [line.split("|")[1].strip() for line in printed] == ["none", "kivi@2", "octopus@2"]


def test_main_writes_the_table_with_its_checkpoint(sweep_module, monkeypatch, tmp_path, capsys):
    seen = {}

    def evaluator(include_path, tasks):
        seen.update(include_path=include_path, tasks=tasks)
        return FakeEvaluate()

    monkeypatch.setattr(sweep_module, "evaluator", evaluator)
    out = tmp_path / "t" / "table.md"
    assert sweep_module.main(["--pretrained", "CK", "--tasks", "mc", "--codecs", "kivi", "--bits", "2",
                              "--seeds", "0", "--out", str(out)]) == 0
    assert seen == {"include_path": "prompts/lm_eval", "tasks": ["mc"]}
    text = out.read_text(encoding="utf-8")
    assert text.startswith("checkpoint: CK\n\n| ")
    table = text.splitlines()[2:]
    assert [line.split("|")[1].strip() for line in table[2:]] == ["`--model hf`", "none", "kivi@2"]
    assert "\n".join(table) in capsys.readouterr().out


@pytest.mark.parametrize("args, message", [(["--codecs", "nosuch"], "nosuch"),
                                           (["--seeds", "0", "0"], "--seeds must be distinct")])
def test_bad_arguments_fail_before_a_model_loads(sweep_module, monkeypatch, capsys, args, message):
    monkeypatch.setattr(sweep_module, "evaluator", lambda *a: pytest.fail("evaluated after a bad argument"))
    with pytest.raises(SystemExit) as e:
        sweep_module.main(args)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_without_lm_eval_says_how_to_install(monkeypatch, capsys):
    from harness.cli.main import main

    for mod in ("harness.lm_eval.model", "harness.lm_eval.command", "harness.lm_eval.sweep"):
        monkeypatch.delitem(sys.modules, mod, raising=False)
    for name in [m for m in sys.modules if m == "lm_eval" or m.startswith("lm_eval.")] or ["lm_eval"]:
        monkeypatch.setitem(sys.modules, name, None)
    assert main(["lm-eval-sweep", "--codecs", "kivi"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["harness lm-eval-sweep: error: lm_eval is not installed: pip install '.[lm-eval]'"]
