"""harness/report/run_data.py and the report pipeline it starts: registry.json written before a run's first row, built
from the registries for an older run folder; the summary a function of rows, registry and config alone; a merge
that reads the rows once; and the report wing's imports (rows -> summary -> renderers)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers.checkout_env import ROOT
from helpers.imports import imports, module_name
from helpers.run_folder import rebuild, summary_of, synthetic_rows, write_run
from helpers.tiny_lm import text_run_config, tiny_causal_lm

from harness.run.input_files import InputError
from harness.run.rows import dumps
from harness.report.run_data import declared, describe_task, read_run, write_registry
from harness.run.folder import RunFolder
from harness.report.summary import summarize, summarize_run
from harness.tasks import get_task

CONFIGS = {"octopus@2": (0.10, 2.1, (0, 1)), "kivi@2": (0.1001, 2.3, (0,)), "qjl@2": (0.20, 2.0, (0, 1))}
QUIET = dict(progress=False, log=lambda *_: None)


def _registry(out: Path) -> dict:
    """registry.json of ``out`` as the runner writes it."""
    config, model = (json.loads((out / n).read_text()) for n in ("config.json", "model.json"))
    write_registry(out, config, model)
    return json.loads((out / RunFolder.REGISTRY).read_text())


def test_the_runner_writes_the_registry_before_the_first_row(tmp_path):
    from harness.runner import run

    seen = []
    config = text_run_config(tmp_path, tasks=("perplexity",), codecs=("kivi",), limit=1, codec_seeds=[0])
    out = run(config, out=tmp_path / "run", model=tiny_causal_lm("qwen2"),
              on_row=lambda r: seen.append((tmp_path / "run" / RunFolder.REGISTRY).is_file()), **QUIET)
    assert seen and seen[0]
    stored = json.loads((out / RunFolder.REGISTRY).read_text())
    assert (out / RunFolder.REGISTRY).read_text() == dumps(stored, indent=2) + "\n"  # deterministic JSON
    assert stored == json.loads(dumps(declared(json.loads((out / "config.json").read_text()),
                                               json.loads((out / "model.json").read_text())), indent=2))
    assert stored["version"] == 1 and stored["tasks"]["perplexity"] == describe_task(get_task("perplexity"))
    assert set(stored["metrics"]) == set(get_task("perplexity").metrics)
    assert stored["metrics"]["kl"]["higher_is_better"] is False and stored["metrics"]["kl"]["description"]
    assert stored["codecs"] == {"kivi": {"engine_preset": False, "engine": None, "native_layers": []}}
    assert RunFolder(out).is_run_file(RunFolder.REGISTRY)  # --fresh clears it with the rest


def test_an_older_run_gets_its_registry_from_the_registries(tmp_path):
    out = write_run(tmp_path / "run", synthetic_rows(CONFIGS))
    run = read_run(out)
    assert not (out / RunFolder.REGISTRY).exists()  # reading builds it, never writes it
    assert run.registry == declared(run.config, run.model, run.rows)
    assert run.registry["tasks"]["perplexity"]["metrics"] == list(get_task("perplexity").metrics)
    # stored, the same registry gives the same summary
    before = dumps(summarize_run(run), indent=2)
    _registry(out)
    assert dumps(summary_of(out), indent=2) == before


def test_a_task_no_registry_knows_shows_its_rows_numeric_columns(tmp_path):
    rows = synthetic_rows(CONFIGS)
    for r in rows:
        r["task"] = "mystery"
    run = read_run(write_run(tmp_path / "run", rows))
    assert run.registry["tasks"]["mystery"] is None
    t = summarize_run(run)["tasks"]["mystery"]
    assert [m["name"] for m in t["metrics"]] == ["kl", "perplexity", "scored_tokens", "tokens", "top1_agree"]
    by_name = {m["name"]: m for m in t["metrics"]}
    assert by_name["kl"]["display"] == "KL (nats)" and by_name["kl"]["higher_is_better"] is False  # the registry's
    assert by_name["tokens"] == {"name": "tokens", "display": "tokens", "higher_is_better": None, "scale": "linear"}
    assert t["headline"] == "kl" and t["effective_length"] is None and t["breakdown"] is None


def test_the_summary_follows_the_stored_registry_and_reads_nothing(tmp_path, monkeypatch):
    out = write_run(tmp_path / "run", synthetic_rows(CONFIGS))
    registry = _registry(out)
    registry["tasks"]["perplexity"]["headline"] = "top1_agree"
    registry["metrics"]["top1_agree"]["display"] = "agreement, as stored"
    (out / RunFolder.REGISTRY).write_text(dumps(registry, indent=2) + "\n")
    run = read_run(out)
    shutil.rmtree(out)  # nothing on disk from here on

    def refuse(*_, **__):
        raise AssertionError("the summary consulted a registry")

    import kernels
    import metrics
    import harness.tasks

    for module, name in ((harness.tasks, "get_task"), (harness.tasks, "list_tasks"), (metrics, "list_metrics"),
                         (metrics, "get_metric"), (kernels, "codec_class")):
        monkeypatch.setattr(module, name, refuse)
    t = summarize(run.rows, run.registry, run.config, run.model["skipped"])["tasks"]["perplexity"]
    means = {g["label"]: g["metrics"]["top1_agree"]["mean"] for g in t["groups"]}
    assert t["headline"] == "top1_agree" and [c["mean"] for c in t["ranking"][0]["configs"]] == [
        pytest.approx(means[c["label"]]) for c in t["ranking"][0]["configs"]]  # one float64 figure in two places
    assert {m["name"]: m["display"] for m in t["metrics"]}["top1_agree"] == "agreement, as stored"


def test_a_registry_of_another_version_is_refused(tmp_path):
    out = write_run(tmp_path / "run", synthetic_rows(CONFIGS))
    (out / RunFolder.REGISTRY).write_text(dumps({"version": 99, "tasks": {}}, indent=2))
    with pytest.raises(InputError, match="version 99"):
        read_run(out)


def test_finish_reads_the_rows_once(tmp_path, monkeypatch):
    from harness.report.build import finish

    out = write_run(tmp_path / "run", synthetic_rows(CONFIGS))
    rebuild(out)
    expected = {n: (out / n).read_bytes() for n in ("summary.json", "report.md", "report.html")}
    import harness.run.rows as rows

    read, real = [], rows.read_bytes  # the one reader of row files (bounded, regular files only)

    def counted(path, *args, **kwargs):
        if Path(path).name.startswith("rows"):
            read.append(Path(path).name)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(rows, "read_bytes", counted)
    finish(out)
    assert read == ["rows.jsonl"]
    assert {n: (out / n).read_bytes() for n in expected} == expected


# --- the report wing runs one way -------------------------------------------------------------------------
REPORT = sorted(p for p in (ROOT / "harness" / "report").rglob("*.py"))


def _graph() -> dict[str, set[str]]:
    return {module_name(p): {name for _, name in imports(p, typing=False)} for p in REPORT}


def _reaches(names: set[str], module: str) -> bool:
    return any(n == module or n.startswith(module + ".") for n in names)


def test_the_pipeline_runs_one_way():
    """rows -> summary -> renderers (the package layering itself: tests/test_architecture.py)."""
    graph = _graph()
    # the summary: no registry, no disk (the loader reads the folder)
    summary = graph["harness.report.summary"]
    for upstream in ("harness.tasks", "metrics", "kernels", "harness.report.run_data", "harness.run.input_files"):
        assert not _reaches(summary, upstream), upstream
    assert not _reaches(graph["harness.stats.effective_length"] if "harness.stats.effective_length" in graph
                        else set(), "harness.report.summary")
    # the renderers: report.md's and report.html's never import each other, nor anything upstream of the summary
    html = [m for m in graph if m.startswith("harness.report.html")]
    markdown = ["harness.report.markdown", "harness.report.tables", "harness.report.png_plots"]
    for m in markdown:
        assert not _reaches(graph[m], "harness.report.html"), m
    for m in html:
        assert not any(_reaches(graph[m], md) for md in markdown), m
    for m in [*markdown, *html]:
        for upstream in ("harness.report.summary", "harness.report.run_data", "harness.tasks", "metrics"):
            assert not _reaches(graph[m], upstream), (m, upstream)
    # the report's content, which both render: made from the summary alone, rendering nothing itself
    for m in ("harness.report.model", "harness.report.document", "harness.report.sections", "harness.report.values"):
        for other in ("harness.report.summary", "harness.report.run_data", "harness.tasks", "metrics",
                      "harness.report.html", *markdown):
            assert not _reaches(graph[m], other), (m, other)
