"""harness/report/speed.py through the runner and the reports: a speed line for every row of a tiny text
run, keyed and ordered like the rows and kept out of them; a crashed run resumes without repeating
a line; the reports' speed table (mean ± 95% over rollouts, a batch counted once) where speed.jsonl
exists, and nothing of it where it does not."""
from __future__ import annotations

import json
import math
import re
import statistics

import pytest
from helpers.run_folder import rebuild, synthetic_rows, write_run
from scipy.stats import t as student_t
from helpers.tiny_lm import text_run_config, tiny_causal_lm
from helpers.tolerances import U64, digits_rel, gamma

from harness.report.formatting import fmt
from harness.run.rows import dumps, read_rows, row_key
from harness.runner import run
from harness.report.speed import (BEGIN, END, NO_PEAK, NOT_CAPTURED, NOT_SHARED, NOTHING_DECODED, columns,
                                  without_speed)

QUIET = dict(progress=False, log=lambda *_: None)


@pytest.fixture(scope="module")
def lm():
    return tiny_causal_lm("qwen2")


def _config(tmp_path):
    return text_run_config(tmp_path)


def _table(md: str, task: str) -> dict[str, list[str]]:
    """{config: its cells} of ``task``'s speed table in report.md."""
    section = md[md.index(f"## {task}\n"):]
    section = section[section.index(BEGIN):section.index(END)]
    return {cells[0]: cells[1:] for line in section.splitlines() if line.startswith("| ") and "---" not in line
            for cells in [[c.strip() for c in line.strip("|").split("|")]] if cells[0] != "config"}


def test_every_row_has_its_speed_line_and_the_reports_show_them(lm, tmp_path):
    out = run(_config(tmp_path), out=tmp_path / "run", model=lm, **QUIET)
    rows, speed = read_rows(out / "rows.jsonl"), read_rows(out / "speed.jsonl")
    assert [row_key(s) for s in speed] == [row_key(r) for r in rows] and len(rows) == 8
    assert not {"speed", "prefill_s", "decode_per_s", "peak_bytes"} & {k for r in rows for k in r}
    device = json.loads((out / "model.json").read_text())["environment"]["device_name"]
    for s in speed:
        # both tasks run their 2 prompts as one batch: one rollout per configuration, named by its first prompt
        first = {"perplexity": "fox-000", "needle": "niah-c520-d0.2"}[s["task"]]
        assert s["sequences"] == 2 and s["rollout"] == first and s["device"] == device
        assert s["prefill_s"] > 0 and s["peak_bytes"] is None  # no allocator counter on the CPU
        if s["task"] == "perplexity":  # teacher forcing decodes nothing: no rate, not a zero
            assert s["decode_per_s"] is None and s["decode_units"] == 0
        else:
            assert s["decode_units"] > 0 and math.isfinite(s["decode_per_s"]) and s["decode_per_s"] > 0
            # both figures stored to 7 significant digits (each off by e = digits_rel(7): a quotient by 2e / (1 - e)),
            # one float64 quotient here
            e = digits_rel(7)
            assert s["decode_per_s"] == pytest.approx(s["decode_units"] / s["decode_s"], rel=2 * e / (1 - e) + gamma(2, U64))
    md = (out / "report.md").read_text()
    for task in ("perplexity", "needle"):
        table = _table(md, task)
        assert list(table) == ["none", "kivi@2"]
        for label, cells in table.items():
            mine = next(s for s in speed if s["task"] == task and s["label"] == label)
            # the batch's shared native forward apart from this configuration's own replay and encode of it
            assert mine["shared_forward_s"] > 0 and mine["capture_s"] == 0  # eager on the CPU: nothing captured
            assert cells[:4] == ["1", "2", f"{fmt(mine['shared_forward_s'])} (n = 1)", f"{fmt(mine['prefill_s'])} (n = 1)"]
            assert cells[4] == (NOTHING_DECODED if task == "perplexity" else f"{fmt(mine['decode_per_s'])} (n = 1)")
            assert cells[5:] == [NOT_CAPTURED, NO_PEAK, device]
    html = (out / "report.html").read_text()
    assert html.count("<h3>Speed and memory</h3>") == 2 and html.count(BEGIN) == 2 and NOTHING_DECODED in html


def test_a_crashed_run_resumes_without_repeating_a_line(lm, tmp_path):
    class Crash(Exception):
        pass

    seen = []

    def crash(row):
        seen.append(row)
        if len(seen) == 3:  # mid-batch: the perplexity prompts run together
            raise Crash

    out = tmp_path / "run"
    with pytest.raises(Crash):
        run(_config(tmp_path), out=out, model=lm, on_row=crash, **QUIET)
    before = (out / "speed.jsonl").read_text()
    assert len(before.splitlines()) == 3
    with open(out / "speed.jsonl", "a") as f:  # a line torn by the crash
        f.write('{"task": "perplexity", "prom')
    run(_config(tmp_path), out=out, model=lm, **QUIET)
    speed, rows = read_rows(out / "speed.jsonl"), read_rows(out / "rows.jsonl")
    assert (out / "speed.jsonl").read_text().startswith(before)  # the stored lines stay as they were
    assert [row_key(s) for s in speed] == [row_key(r) for r in rows] and len(speed) == 8


def _line(label: str, prompt: str, rollout: str, prefill: float, rate: float | None, peak: float | None, seqs=1):
    return {"task": "perplexity", "prompt": prompt, "label": label, "codec_seed": 0, "rollout": rollout,
            "device": "NVIDIA H100 80GB HBM3", "sequences": seqs, "prefill_s": prefill, "prefill_shared": False,
            "decode_s": None if rate is None else 1.0, "decode_units": 0 if rate is None else int(rate),
            "decode_unit": "token", "decode_per_s": rate, "peak_bytes": peak}


def test_the_table_is_a_mean_with_its_interval_over_rollouts(tmp_path):
    out = write_run(tmp_path / "run", synthetic_rows({"octopus@2": (0.1, 2.1, (0,))}))
    plain = rebuild(out).read_text()
    assert BEGIN not in plain and "Speed and memory" not in plain  # a run folder from before speed.jsonl
    plain_html = (out / "report.html").read_text()
    assert "Speed and memory" not in plain_html
    prefill, rate = [1.0, 1.2, 1.4, 1.6], [10.0, 20.0, 30.0, 40.0]
    lines = [_line("octopus@2", p, p, a, b, 100 * 2 ** 20) for p, a, b in zip(("p0", "p1", "p2", "p3"), prefill, rate)]
    # the baseline ran its 4 prompts as 2 batches of 2: 2 rollouts, each counted once
    lines += [_line("none", p, r, x, None, None, seqs=2) for p, r, x in
              (("p0", "p0", 0.5), ("p1", "p0", 0.5), ("p2", "p2", 0.7), ("p3", "p2", 0.7))]
    (out / "speed.jsonl").write_text("".join(dumps(x) + "\n" for x in lines))
    md = rebuild(out).read_text()
    assert without_speed(md) == plain  # the section is all that speed.jsonl adds

    def ci(xs):  # the t-interval over 4 (or 2) independent rollouts, computed here from its definition
        half = student_t.ppf(0.975, len(xs) - 1) * statistics.stdev(xs) / math.sqrt(len(xs))
        return f"{fmt(statistics.mean(xs))} ± {fmt(half, 2)}"

    table = _table(md, "perplexity")
    assert table["octopus@2"] == ["4", "1", NOT_SHARED, ci(prefill), ci(rate), NOT_CAPTURED, "100 ± 0",
                                  "NVIDIA H100 80GB HBM3"]
    assert table["none"] == ["2", "2", NOT_SHARED, ci([0.5, 0.7]), NOTHING_DECODED, NOT_CAPTURED, NO_PEAK,
                             "NVIDIA H100 80GB HBM3"]
    html = (out / "report.html").read_text()
    assert ci(rate) in html and without_speed(html) == plain_html


def test_an_unreadable_speed_file_is_named_not_fatal(tmp_path):
    out = write_run(tmp_path / "run", synthetic_rows({"octopus@2": (0.1, 2.1, (0,))}))
    plain = rebuild(out).read_text(), (out / "report.html").read_text()
    (out / "speed.jsonl").write_text("not json\n" + dumps(_line("none", "p0", "p0", 1.0, None, None)) + "\n")
    md = rebuild(out).read_text()
    assert re.search(r"\*\*Speed and memory\*\* not shown: .*speed\.jsonl:1: not a JSON row", md)
    assert "## perplexity" in md and "### Speed and memory" not in md
    html = (out / "report.html").read_text()
    assert "not shown: " in html
    assert (without_speed(md), without_speed(html)) == plain  # the note sits inside the markers in both


def test_a_damaged_speed_file_does_not_stop_a_resume_and_shard_lines_outlive_a_failed_merge(lm, tmp_path):
    """speed.jsonl is never a reason to stop: a resume appends after a damaged line (the report names
    it); and where a damaged speed shard file keeps the merge from happening, no shard's speed file
    is removed with its rows file (its lines are nowhere else)."""
    from harness.report.build import finish
    from harness.scale.shard import shard_files
    from harness.run.folder import RunFolder

    out = run(_config(tmp_path), out=tmp_path / "run", model=lm, **QUIET)
    lines = (out / "speed.jsonl").read_text().splitlines()
    (out / "speed.jsonl").write_text("not json\n" + "\n".join(lines[1:]) + "\n")
    rows = (out / "rows.jsonl").read_text().splitlines()
    (out / "rows.jsonl").write_text("\n".join(rows[1:]) + "\n")  # one row to recompute
    run(_config(tmp_path), out=out, model=lm, **QUIET)
    assert len(read_rows(out / "rows.jsonl")) == len(rows)
    assert "not shown: " in (out / "report.md").read_text()
    # as two shards left them: shard files of rows and speed, one speed file damaged
    (out / "speed.jsonl").unlink()
    (out / "rows.shard-0-of-2.jsonl").write_text("")
    (out / "speed.shard-0-of-2.jsonl").write_text("not json\n")
    (out / "speed.shard-1-of-2.jsonl").write_text("\n".join(lines[1:]) + "\n")
    assert finish(out)
    assert len(shard_files(out, RunFolder.SPEED)) == 2 and not (out / "rows.shard-0-of-2.jsonl").exists()


def test_the_table_keeps_the_shared_forward_and_the_captures_apart(tmp_path):
    """Two batches of two prompts, each batch's native forward shared by its configurations (the same seconds
    in each): the shared-forward column is over the batches, the own prefill over each configuration's replays,
    and the graphs' capture seconds apart from the decode; both reports name the columns and say which is which."""
    out = write_run(tmp_path / "run", synthetic_rows({"octopus@2": (0.1, 2.1, (0,))}))
    shared = {"p0": 3.0, "p2": 5.0}  # per batch (rollout), in every configuration
    lines = []
    for label, own, capture in (("none", (0.1, 0.3), (0.0, 0.0)), ("octopus@2", (0.5, 0.9), (2.0, 4.0))):
        for (p, r), x, c in zip((("p0", "p0"), ("p1", "p0"), ("p2", "p2"), ("p3", "p2")), (own[0], own[0], own[1], own[1]),
                                (capture[0], capture[0], capture[1], capture[1])):
            lines.append({**_line(label, p, r, x, 20.0, None, seqs=2), "prefill_shared": True,
                          "shared_forward_s": shared[r], "capture_s": c})
    (out / "speed.jsonl").write_text("".join(dumps(x) + "\n" for x in lines))
    md = rebuild(out).read_text()

    def ci(xs):
        half = student_t.ppf(0.975, len(xs) - 1) * statistics.stdev(xs) / math.sqrt(len(xs))
        return f"{fmt(statistics.mean(xs))} ± {fmt(half, 2)}"

    table = _table(md, "perplexity")
    assert table["none"][2:4] == [ci([3.0, 5.0]), ci([0.1, 0.3])] and table["none"][5] == NOT_CAPTURED
    assert table["octopus@2"][2:4] == [ci([3.0, 5.0]), ci([0.5, 0.9])] and table["octopus@2"][5] == ci([2.0, 4.0])
    head = columns([])
    assert head[3:5] == ["shared forward s (once per batch), mean ± 95%", "own prefill s (replay + encode), mean ± 95%"]
    assert head[6] == "capture s (once per shape), mean ± 95%"
    html = (out / "report.html").read_text()
    for text in (md, html):
        assert "shared forward s (once per batch)" in text and "own prefill s (replay + encode)" in text
        assert "the replay and encode of the shared forward" in text and "capturing graphed decode steps" in text
