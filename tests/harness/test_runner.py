"""harness/runner.py + harness/report.py on a tiny model: rows, resume after a crash, determinism,
skipped codec/bit pairs, clear errors, the report and compare."""
from __future__ import annotations

import json

import pytest
from tiny_lm import tiny_causal_lm

from harness.report import compare
from harness.rows import read_rows
from harness.config import RunConfig, RunError
from harness.runner import run
from kernels import CODECS, Codec, list_codecs, register_codec

TWO = [c for c in ("turboquant-mse", "octopus", "quarot", "kivi", "polarquant") if c in list_codecs()][:2]
TEXT = ("The quick brown fox jumps over the lazy dog. A stitch in time saves nine. " * 60).strip()
OPTS = {"perplexity": {"context": 140, "prefix": 60, "chunk": 20},
        "needle": {"contexts": [520], "depths": [0.2, 0.8], "needles": 2, "max_new_tokens": 3}}


@pytest.fixture(scope="module")
def lm():
    return tiny_causal_lm("qwen2")


@pytest.fixture(scope="module")
def textfile(tmp_path_factory):
    f = tmp_path_factory.mktemp("text") / "fox.txt"
    f.write_text(TEXT)
    return f


def _config(textfile, **kw) -> RunConfig:
    base = dict(model="hf", model_path="(tiny)", tasks=["perplexity", "needle"], codecs=TWO, bits=[2, 4],
                prompts=str(textfile), limit=2, residual=8, task_options=OPTS)
    base.update(kw)
    base["task_options"] = {t: o for t, o in OPTS.items() if t in base["tasks"]}
    return RunConfig(**base)


def _files(out):
    return {n: (out / n).read_bytes() for n in ("rows.jsonl", "summary.json", "report.md")}


class Crash(Exception):
    pass


def test_run_resume_and_determinism(lm, textfile, tmp_path):
    config = _config(textfile)
    clean = run(config, out=tmp_path / "clean", model=lm, progress=False, log=lambda *_: None)
    rows = read_rows(clean / "rows.jsonl")
    n_cfg = 1 + 2 * len(TWO)
    assert len(rows) == 4 * n_cfg  # (2 perplexity + 2 needle prompts) x (baseline + codecs x bits)
    assert len({(r["task"], r["prompt"], r["label"]) for r in rows}) == len(rows)
    assert all(r["kl"] == 0 for r in rows if r["label"] == "none")
    assert {r["label"] for r in rows} == {"none", *(f"{c}@{b}" for c in TWO for b in (2, 4))}
    # every row embeds the exact codec config it ran: it rebuilds that codec, options resolved
    from kernels import CodecConfig, codec_class
    for r in rows:
        cfg = CodecConfig.from_json(r["codec_config"])
        assert (cfg.name, cfg.bits, cfg.head_dim, cfg.num_heads) == (r["codec"], r["bits"], lm.geometry.head_dim,
                                                                     lm.geometry.kv_heads)
        assert set(cfg.options) == {f for f in codec_class(cfg.name).Options.__dataclass_fields__}

    # the same command again, elsewhere: byte-identical rows, summary and report
    again = run(_config(textfile), out=tmp_path / "again", model=lm, progress=False, log=lambda *_: None)
    assert _files(again) == _files(clean)
    assert (clean / "perplexity_kl.png").exists()

    # crash after 3 rows (mid-prompt), with a torn half line on disk; the rerun completes the same file
    seen = []

    def crash(row):
        seen.append(row)
        if len(seen) == 3:
            raise Crash

    out = tmp_path / "crashed"
    with pytest.raises(Crash):
        run(_config(textfile), out=out, model=lm, progress=False, on_row=crash, log=lambda *_: None)
    with open(out / "rows.jsonl", "a") as f:
        f.write('{"task": "perplexity", "prom')
    n_baselines = len(list((out / "baselines").rglob("*.pt")))
    calls = []
    from harness.tasks.perplexity import PerplexityTask

    orig = PerplexityTask.baseline
    PerplexityTask.baseline = lambda self, *a: calls.append(a) or orig(self, *a)
    try:
        run(_config(textfile), out=out, model=lm, progress=False, log=lambda *_: None)
    finally:
        PerplexityTask.baseline = orig
    assert _files(out) == _files(clean)
    assert n_baselines == 1 and len(calls) == 1  # prompt 1 reused its stored baseline; prompt 2 computed once


def test_config_round_trip_and_mismatch(textfile, tmp_path, lm):
    c = _config(textfile, protect=[0, 1], value_bits=4)
    assert RunConfig.from_json(json.loads(json.dumps(c.to_json()))) == c
    with pytest.raises(ValueError, match="unknown RunConfig field"):
        RunConfig.from_json({**c.to_json(), "bogus": 1})
    out = tmp_path / "run"
    run(_config(textfile, tasks=["perplexity"], codecs=TWO[:1], bits=[2], limit=1), out=out, model=lm,
        progress=False, log=lambda *_: None)
    saved = RunConfig.from_json(json.loads((out / "config.json").read_text()))
    assert saved.codecs == TWO[:1] and saved.bits == [2]
    with pytest.raises(RunError, match="another configuration .*bits"):
        run(_config(textfile, tasks=["perplexity"], codecs=TWO[:1], bits=[3], limit=1), out=out, model=lm,
            progress=False, log=lambda *_: None)


def test_rejected_pairs_are_skipped_with_a_note(lm, textfile, tmp_path):
    codec = next(c for c, bits in list_codecs().items() if c != "none" and 1 not in bits)
    out = run(_config(textfile, tasks=["perplexity"], codecs=[codec], bits=[1, 2], limit=1), out=tmp_path / "r",
              model=lm, progress=False, log=lambda *_: None)
    labels = {r["label"] for r in read_rows(out / "rows.jsonl")}
    assert labels == {"none", f"{codec}@2"}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["skipped"][0]["label"] == f"{codec}@1" and "bits=1" in summary["skipped"][0]["reason"]
    assert f"`{codec}@1`" in (out / "report.md").read_text()
    with pytest.raises(RunError, match="no requested codec/bit width can run"):
        run(_config(textfile, tasks=["perplexity"], codecs=[codec], bits=[1], limit=1), out=tmp_path / "r2",
            model=lm, progress=False, log=lambda *_: None)


def test_head_dim_rejected_is_a_clear_error(lm, textfile, tmp_path):
    @register_codec("needs-d128")
    class NeedsD128(Codec):
        bits_supported = (2,)

        def __init__(self, config, device="cpu"):
            if config.head_dim % 128:
                raise ValueError(f"codec 'needs-d128' needs a head dim that is a multiple of 128, got {config.head_dim}")
            super().__init__(config, device)

    try:
        with pytest.raises(RunError, match="needs-d128@2: codec 'needs-d128' needs a head dim .* got 32"):
            run(_config(textfile, tasks=["perplexity"], codecs=["needs-d128"], bits=[2], limit=1),
                out=tmp_path / "r", model=lm, progress=False, log=lambda *_: None)
    finally:
        CODECS.pop("needs-d128")


def test_unknown_names_list_what_exists(textfile, tmp_path):
    with pytest.raises(ValueError, match="Unknown codec 'nope'. Available: .*"):
        run(_config(textfile, codecs=["nope"]), out=tmp_path / "a", progress=False)
    with pytest.raises(ValueError, match="Unknown task 'nope'. Available: .*perplexity"):
        run(_config(textfile, tasks=["nope"]), out=tmp_path / "b", progress=False)
    with pytest.raises(ValueError, match="Unknown model 'nope'. Available: .*hf"):
        run(_config(textfile, model="nope"), out=tmp_path / "c", progress=False)


def test_report_and_compare(lm, textfile, tmp_path):
    a = run(_config(textfile, tasks=["perplexity"], limit=1), out=tmp_path / "a", model=lm, progress=False,
            log=lambda *_: None)
    b = run(_config(textfile, tasks=["perplexity"], limit=1, residual=16), out=tmp_path / "b", model=lm,
            progress=False, log=lambda *_: None)
    md = (a / "report.md").read_text()
    assert "| config | key bits/coord |" in md and "perplexity ↓" in md and "![perplexity perplexity" in md
    text = compare([a, b])
    assert "## perplexity" in text and "a: none" in text and f"b: {TWO[0]}@2" in text and "Δ mean vs baseline" in text
    with pytest.raises(FileNotFoundError, match="not a run folder"):
        compare([tmp_path / "missing"])
