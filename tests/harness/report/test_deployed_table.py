"""The report's research-against-deployed table, grouped by engine: summary.json names each column's engine
(from registry.json, which takes it from the codec class), report.md and report.html show one table per engine,
in the order the run's codecs name the engines and each engine's caches by rate; a folder whose registry.json
predates the engine field gets the one table it had."""
from __future__ import annotations

import json
import re

from helpers.html_page import Page
from helpers.run_folder import rebuild, shown, synthetic_rows, write_run

from harness.report.run_data import write_registry
from harness.run.rows import dumps
from kernels.registry import CODECS

RESEARCH = {"octopus@2": (0.10, 2.1, (0,)), "turboquant-mse@4": (0.02, 4.1, (0,))}
DEPLOYED = {"llamacpp-q8_0@8": (0.001, 8.5, (0,)), "llamacpp-q4_0@4": (0.03, 4.5, (0,)),
            "mlx-g64@4": (0.025, 4.5, (0,)), "vllm-fp8@8": (0.004, 8.0, (0,))}
# write_run lists the codecs sorted: llamacpp-*, mlx-g64, octopus, turboquant-mse, vllm-fp8
WANT = [("llama.cpp", ["llamacpp-q4_0@4", "llamacpp-q8_0@8"]), ("MLX", ["mlx-g64@4"]), ("vLLM", ["vllm-fp8@8"])]


def _md_tables(md: str) -> list[tuple[str | None, list[str]]]:
    """(the bold line above it, its column labels) of each table in report.md's deployed section."""
    part = md.split("### Research codecs against deployed caches", 1)[1].split("\n### ", 1)[0]
    out, engine = [], None
    for line in part.splitlines():
        if re.fullmatch(r"\*\*[^*]+\*\*", line):
            engine = line.strip("*")
        elif line.startswith("| research codec |"):
            out.append((engine, [re.sub(r" \(.*", "", shown(c.strip())) for c in line.split("|")[2:-1]]))
            engine = None
    return out


def test_columns_group_by_engine_in_both_renderers(tmp_path):
    assert [CODECS[c.split("@")[0]].engine for c in DEPLOYED] == ["llama.cpp", "llama.cpp", "MLX", "vLLM"]
    out = write_run(tmp_path / "run", synthetic_rows(RESEARCH | DEPLOYED))
    md = rebuild(out).read_text()
    pairs = json.loads((out / "summary.json").read_text())["tasks"]["perplexity"]["against_deployed"]
    assert {p["b"]: p["b_engine"] for p in pairs} == {c: e for e, cs in WANT for c in cs}
    assert _md_tables(md) == WANT
    tables = [t for t in Page(out / "report.html").tables if "deployed" in t["class"]]
    assert len(tables) == len(WANT)
    for t, (engine, cols) in zip(tables, WANT):
        assert t["text"].lstrip().startswith(engine + "research codec") and t["rows"] == 1 + len(RESEARCH)
        others = {c for _, cs in WANT for c in cs} - set(cols)
        assert all(c in t["text"] for c in cols) and not any(c in t["text"] for c in others)


def test_a_registry_without_engines_keeps_one_table(tmp_path):
    out = write_run(tmp_path / "run", synthetic_rows(RESEARCH | DEPLOYED))
    write_registry(out, json.loads((out / "config.json").read_text()), json.loads((out / "model.json").read_text()))
    registry = json.loads((out / "registry.json").read_text())
    for entry in registry["codecs"].values():
        del entry["engine"]
    (out / "registry.json").write_text(dumps(registry, indent=2) + "\n")
    md = rebuild(out).read_text()
    assert [(e, sorted(cs)) for e, cs in _md_tables(md)] == [(None, sorted(DEPLOYED))]
