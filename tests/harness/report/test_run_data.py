"""harness/report/run_data.py and the report pipeline it starts: registry.json written before a run's first row, built
from the registries for an older run folder; the summary a function of rows, registry and config alone; a merge
that reads the rows once; and the import graph of the report modules (one way, no private names)."""
from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path

import pytest
from helpers.run_folder import rebuild, summary_of, synthetic_rows, write_run
from helpers.tiny_lm import text_run_config, tiny_causal_lm

import harness
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
    from harness.run.folder import is_run_file
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
    assert stored["codecs"] == {"kivi": {"engine_preset": False, "native_layers": []}}
    assert is_run_file(RunFolder.REGISTRY)  # --fresh clears it with the rest


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
    read, real = [], Path.read_bytes

    def counted(self):
        if self.name.startswith("rows"):
            read.append(self.name)
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", counted)
    finish(out)
    assert read == ["rows.jsonl"]
    assert {n: (out / n).read_bytes() for n in expected} == expected


# --- the import graph of the report modules ---------------------------------------------------------
HARNESS = Path(harness.__file__).parent
HTML = [f"html_report.{p.stem}" for p in sorted((HARNESS / "html_report").glob("*.py"))]
PIPELINE = ["run_data", "summary", "effective_length", "ranking", "formatting", "report_text", "tables", "report",
            "speed", "merge", "compare", *HTML]


def _imports(module: str) -> list[tuple[str, list[str]]]:
    """(harness module, names) of every import of ``module`` (a harness module) outside ``if TYPE_CHECKING``."""
    path = HARNESS / (module.replace(".", "/") + ".py")
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                   and getattr(node.test, "id", None) == "TYPE_CHECKING" for n in ast.walk(node)}
    package = module.split(".")[:-1]
    found = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.module is None:  # from . import plots: modules
            base = package[:len(package) - node.level + 1]
            found += [(".".join([*base, a.name]), []) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            name = ".".join([*base, *node.module.split(".")])
            found.append((name if node.level else name.removeprefix("harness."), [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            found += [(a.name.removeprefix("harness."), []) for a in node.names]
    return found


@pytest.mark.parametrize("module", PIPELINE)
def test_no_private_name_crosses_a_module(module):
    assert not [(m, n) for m, names in _imports(module) for n in names if n.startswith("_") and n != "__future__"]


def test_the_pipeline_runs_one_way():
    graph = {m: {name for name, _ in _imports(m)} for m in PIPELINE}
    # the summary: no registry, no disk (the loader reads the folder)
    assert not {"tasks", "metrics", "kernels", "run_data", "input_files"} & graph["summary"]
    assert "summary" not in graph["effective_length"]  # no cycle: the summary hands it the cells
    # the renderers: report.md's and report.html's never import each other, nor anything upstream of the summary
    assert not {"html_report", *HTML} & graph["report"]
    assert not {"report", "tables"} & set().union(*map(graph.get, HTML))
    for renderer in ["report", *HTML]:
        assert not {"summary", "run_data", "tasks", "metrics"} & graph[renderer], renderer
