"""harness bench --generate on the CPU (--tiny): the table per (context, batch, cache), its figures
positive and finite, the ratio to native and the roofline from the bytes the step reads."""
from __future__ import annotations

import json
import math

import pytest
import torch

from harness.bench.generate import HEADER, cache_bytes, roofline_tok_s, weight_bytes
from harness.cli.main import main

ARGS = ["bench", "--generate", "--tiny", "--device", "cpu", "--contexts", "96,160", "--batches", "1,2",
        "--codecs", "octopus@2,kivi@2", "--new-tokens", "4"]


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench") / "gen.json"
    return main(ARGS + ["--json", str(path)]), json.loads(path.read_text())


def test_tiny_on_the_cpu_end_to_end(bench, capsys):
    rc, result = bench
    assert rc == 0
    rows = result["rows"]
    # native first, then each codec, per context and batch
    assert [(r["context"], r["batch"], r["cache"]) for r in rows] == [
        (c, b, cache) for c in (96, 160) for b in (1, 2) for cache in ("native", "octopus@2", "kivi@2")]
    assert result["copy_bandwidth_Bps"] > 0 and result["weight_bytes"] > 0
    for r in rows:
        for k in ("decode_tok_s", "decode_steps_s", "prefill_s", "roofline_tok_s", "vs_native", "step_ms_median"):
            assert math.isfinite(r[k]) and r[k] > 0, (k, r)
        # float64 products and quotients of the same stored figures (a few roundings): approx's default rel
        assert r["decode_tok_s"] == pytest.approx(r["decode_steps_s"] * r["batch"])
        assert r["roofline_tok_s"] == pytest.approx(roofline_tok_s(r["batch"], result["copy_bandwidth_Bps"],
                                                                   result["weight_bytes"], r["cache_bytes"]))
        native = next(x for x in rows if (x["context"], x["batch"], x["cache"]) == (r["context"], r["batch"], "native"))
        assert r["vs_native"] == pytest.approx(r["decode_tok_s"] / native["decode_tok_s"])
        assert r["native_bytes"] == native["cache_bytes"]  # the same tokens, uncompressed
        if r["cache"] != "native":
            assert r["cache_bytes"] < r["native_bytes"]
        assert r["peak_bytes"] is None  # the CPU
    # native bytes: layers x (K + V) x KV heads x head dim x float32 x (context + 1 + new tokens - 1) per sequence
    r = rows[0]
    assert r["cache_bytes"] == 2 * 2 * 2 * 32 * 4 * (96 + 4) * r["batch"]


def test_the_printed_table(bench, capsys):
    main(ARGS[:-4] + ["--codecs", "kivi@2", "--new-tokens", "3", "--contexts", "64", "--batches", "1"])
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("| ")]
    assert lines[0] == "| " + " | ".join(HEADER) + " |"
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines[1:]]
    assert [c[:5] for c in cells] == [["64", "1", "native", "-", "eager"], ["64", "1", "kivi@2", "auto", "eager"]]
    assert cells[0][6] == "1.00x" and all(float(c[5]) > 0 and float(c[9]) > 0 for c in cells)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_on_cuda_the_steps_are_graphed_where_the_cache_allows(tmp_path):
    path = tmp_path / "gen.json"
    assert main(["bench", "--generate", "--tiny", "--device", "cuda", "--contexts", "300", "--codecs", "kivi@2",
                 "--new-tokens", "8", "--json", str(path)]) == 0
    rows = {r["cache"]: r for r in json.loads(path.read_text())["rows"]}
    assert rows["native"]["decode"] == "graphed" and rows["native"]["decode_tok_s"] > 0
    assert rows["kivi@2"]["decode"] == "graphed"  # its blocks commit in captured steps (adapters.cache.static_kv)
    off = tmp_path / "off.json"
    assert main(["bench", "--generate", "--tiny", "--device", "cuda", "--contexts", "300", "--codecs", "kivi@2",
                 "--new-tokens", "8", "--graphs", "off", "--json", str(off)]) == 0
    assert {r["decode"] for r in json.loads(off.read_text())["rows"]} == {"eager (--graphs off)"}


def test_what_a_step_reads():
    from harness.bench.generate import TINY, load_model

    model = load_model(TINY, "cpu", __import__("torch").float32)
    params = sum(p.numel() for p in model.parameters())
    emb = model.get_input_embeddings().weight
    tied = emb is model.get_output_embeddings().weight
    assert weight_bytes(model) == 4 * (params - (0 if tied else emb.numel()))

    class Layer:
        def __init__(self, n):
            import torch
            self.keys, self.values = torch.zeros(n, dtype=torch.bfloat16), torch.zeros(n, dtype=torch.bfloat16)

    class Native:
        layers = [Layer(10), Layer(6)]

    assert cache_bytes(Native()) == (2 * 2 * 16, 2 * 2 * 16)


def test_bad_codec_spec_is_an_error(capsys):
    assert main(["bench", "--generate", "--tiny", "--device", "cpu", "--codecs", "octopus"]) == 2
    assert "codec@bits" in capsys.readouterr().err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_on_cuda_model_generate_takes_graphed_steps(tmp_path):
    path = tmp_path / "gen.json"
    assert main(["bench", "--generate", "--tiny", "--device", "cuda", "--contexts", "300", "--codecs", "octopus@3",
                 "--new-tokens", "8", "--graphs", "generate", "--json", str(path)]) == 0
    rows = json.loads(path.read_text())["rows"]
    assert [r["decode"] for r in rows] == ["graphed generate"] * 2 and all(r["decode_tok_s"] > 0 for r in rows)
