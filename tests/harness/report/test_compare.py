"""harness/report/compare.py and ``harness compare``: the paired difference B − A over the cells both runs
have; refusals (one line, exit code 2) for other models and for a prompt id with other content;
a warning where the environments differ."""
from __future__ import annotations

import copy

import numpy as np
import pytest
from helpers.run_folder import ENV, MODEL, synthetic_rows, write_run
from scipy.stats import t as student_t

from harness.cli.main import main
from harness.report.compare import CompareError, compare, load_run, pair_runs
from harness.run.rows import read_rows

CONFIGS = {"octopus@2": (0.10, 2.1, (0, 1, 2)), "kivi@2": (0.10, 2.3, (0,))}


@pytest.fixture
def rows():
    return synthetic_rows(CONFIGS)


def shifted(rows: list[dict], label: str, by: float, seed: int = 1) -> list[dict]:
    """A copy of ``rows`` whose ``label`` rows have kl raised by ``by`` + noise (sd 0.001)."""
    rng = np.random.default_rng(seed)
    out = copy.deepcopy(rows)
    for r in out:
        if r["label"] == label:
            r["kl"] += by + rng.normal(0, 0.001)
    return out


def test_pairs_the_common_cells(tmp_path, rows):
    b_rows = [r for r in shifted(rows, "octopus@2", 0.01) if r["prompt"] != "p3"]  # b lacks one prompt
    a, b = write_run(tmp_path / "a", rows), write_run(tmp_path / "b", b_rows)
    pairs = {(p["label"], p["metric"]): p for p in pair_runs(load_run(a), load_run(b), "perplexity")}
    d = pairs[("octopus@2", "kl")]["diff"]
    # by hand: B − A on the 3 common prompts x 3 seeds; the shift is the same on every cell, so the
    # differences are noise around 0.01 with no prompt or seed structure to speak of
    cell = {(r["prompt"], r["codec_seed"]): r["kl"] for r in read_rows(a / "rows.jsonl") if r["label"] == "octopus@2"}
    diffs = np.array([r["kl"] - cell[(r["prompt"], r["codec_seed"])] for r in read_rows(b / "rows.jsonl")
                      if r["label"] == "octopus@2"])
    assert d["n"] == 9 == diffs.size and d["mean"] == pytest.approx(diffs.mean())  # float64 of stored rows: default rel
    assert d["ci95"][0] > 0.005 and d["ci95"][1] < 0.015 and d["word"] == "worse"  # KL: higher is worse
    same = pairs[("kivi@2", "kl")]["diff"]
    assert (same["mean"], same["ci95"], same["word"], same["n"]) == (0.0, (0.0, 0.0), "indistinguishable", 3)
    text = compare([a, b])
    assert "## b against a" in text and "Paired 3 prompt(s) (1 only in a, 0 only in b)." in text
    assert "| octopus@2 |" in text and "worse" in text and "indistinguishable" in text
    assert "## perplexity: per-prompt values" in text and "Δ mean vs baseline" in text


def test_one_seed_each_pairs_by_prompt(tmp_path, rows):
    """Two deterministic-codec runs: the interval is the t-interval of the per-prompt differences."""
    b_rows = shifted(rows, "kivi@2", 0.01, seed=5)
    a, b = write_run(tmp_path / "a", rows), write_run(tmp_path / "b", b_rows)
    d = next(p for p in pair_runs(load_run(a), load_run(b), "perplexity")
             if p["label"] == "kivi@2" and p["metric"] == "kl")["diff"]
    ra, rb = read_rows(a / "rows.jsonl"), read_rows(b / "rows.jsonl")  # as stored: 7 significant digits
    x = np.array([y["kl"] - x["kl"] for x, y in zip(ra, rb) if x["label"] == "kivi@2"])
    half = student_t.ppf(0.975, x.size - 1) * x.std(ddof=1) / np.sqrt(x.size)
    assert d["ci95"] == pytest.approx((x.mean() - half, x.mean() + half))  # float64, a few roundings: default rel


def test_refuses_other_models(tmp_path, rows, capsys):
    a = write_run(tmp_path / "a", rows)
    b = write_run(tmp_path / "b", rows, model={**MODEL, "layers": 4})
    with pytest.raises(CompareError, match="different models .*differs in layers"):
        compare([a, b])
    assert main(["compare", str(a), str(b)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("harness compare: error:") and "layers" in err and len(err.strip().splitlines()) == 1
    # where it ran is not the model: another device pairs; another dtype pairs with a note
    c = write_run(tmp_path / "c", rows, model={**MODEL, "device": "cuda:0"})
    assert "## c against a" in compare([a, c]) and "Note:" not in compare([a, c])
    d = write_run(tmp_path / "d", rows, model={**MODEL, "dtype": "bfloat16"})
    assert "Note: the model ran in float32 in a and in bfloat16 in d." in compare([a, d])


def test_refuses_a_prompt_with_other_content(tmp_path, rows, capsys):
    a = write_run(tmp_path / "a", rows)
    other = copy.deepcopy(rows)
    for r in other:
        if r["prompt"] == "p1":
            r["prompt_meta"]["text_sha"] = "sha-something-else"
    b = write_run(tmp_path / "b", other)
    with pytest.raises(CompareError, match="prompt 'p1' of task 'perplexity' differs .*text_sha"):
        compare([a, b])
    assert main(["compare", str(a), str(b)]) == 2 and "text_sha" in capsys.readouterr().err
    longer = [{**r, "scored_tokens": 90} for r in rows]
    with pytest.raises(CompareError, match="scored_tokens"):
        compare([a, write_run(tmp_path / "c", longer)])
    # where the prompt was read from may differ between machines
    moved = [{**r, "prompt_meta": {**r["prompt_meta"], "source": "/elsewhere/x.txt"}} for r in rows]
    assert "## d against a" in compare([a, write_run(tmp_path / "d", moved)])


def test_warns_on_another_environment(tmp_path, rows):
    a = write_run(tmp_path / "a", rows)
    env = {**ENV, "packages": {**ENV["packages"], "torch": "2.5.0"}, "git": {"commit": "def", "dirty": True}}
    text = compare([a, write_run(tmp_path / "b", rows, environment=env)])
    assert "**Warning**: the runs' environments differ in git.commit, git.dirty, packages.torch." in text
    assert "Warning" not in compare([a, write_run(tmp_path / "c", rows)])
    text = compare([a, write_run(tmp_path / "d", rows, environment=None)])
    assert "Environment not recorded (d)" in text


def test_one_run_gets_its_per_prompt_tables(tmp_path, rows, capsys):
    a = write_run(tmp_path / "a", rows)
    assert main(["compare", str(a)]) == 0
    out = capsys.readouterr().out
    assert "## perplexity" in out and "against" not in out and "| octopus@2 (2.1 b/coord) |" in out
