"""Issue #41 (7b, 7e): text from input (prompt ids, labels, metric display names, model.json's entries, run
folder names) is shown as written wherever the harness renders it: in report.md's Markdown (no raw HTML, no
cell, link or code span made from it), in report.html, in matplotlib's plots (a '$' makes no mathtext) and on
the terminal (no control character reaches it)."""
from __future__ import annotations

import json
import re

from helpers.bad_input import one_line
from helpers.run_folder import MODEL, synthetic_rows, write_run

from harness.cli.main import error, main
from harness.report.formatting import md_code, md_text
from harness.report.run_data import read_run
from harness.run.rows import dumps

#: raw HTML, a cell separator, a code span, mathtext, a terminal's title-setting sequence and bell, a carriage return
HOSTILE = "<img src=x>|`x`$x^^$\x1b]0;T\x07\r"
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # every control character but a line break and a tab


def _planted(out, rows=None, name_suffix=""):
    """A run folder whose rows, model.json and registry.json carry :data:`HOSTILE`: a configuration's label, the
    model's type, a skipped configuration's label and reason, and the display name of the headline metric (KL)."""
    rows = rows or synthetic_rows({"kivi@2": (0.05, 2.5, (0,)), "octopus@2": (0.04, 2.1, (0,))})
    for r in rows:
        if r["label"] == "kivi@2":
            r["label"] = "kivi@2" + HOSTILE
    write_run(out, rows)
    model = json.loads((out / "model.json").read_text())
    model["model"] = {**MODEL, "model_type": "llama" + HOSTILE}
    model["skipped"] = [{"label": "qjl@2" + HOSTILE, "reason": "no" + HOSTILE}]
    (out / "model.json").write_text(json.dumps(model))
    registry = read_run(out).registry
    registry["metrics"]["kl"]["display"] = "KL" + HOSTILE
    (out / "registry.json").write_text(dumps(registry, indent=2))
    return out


def _tables(md: str) -> list[list[int]]:
    """Each Markdown table of ``md`` as its lines' cell counts (a backslash-escaped '|' splits no cell)."""
    tables, lines = [], []
    for line in [*md.splitlines(), ""]:
        if line.startswith("|"):
            lines.append(len(re.split(r"(?<!\\)\|", line)) - 2)
        elif lines:
            tables, lines = [*tables, lines], []
    return tables


def test_report_shows_planted_text_as_written(tmp_path):
    """``harness report`` of the planted run: it ends (a '$' pair in a metric's name made its plot's mathtext fail),
    and report.md holds no raw HTML outside a code span and no control character, every table keeps its columns,
    the label is its escaped text and a skipped label a code span of it; report.html holds neither either, and
    shows the code span's text as written (no markup made of its backticks)."""
    run = _planted(tmp_path / "run")
    assert main(["report", str(run)]) == 0
    md = (run / "report.md").read_text(encoding="utf-8")
    span = md_code("qjl@2" + HOSTILE)  # a code span's text is never HTML: only its backticks need a longer fence
    assert span == "``qjl@2<img src=x>|`x`$x^^$\ufffd]0;T\ufffd\ufffd``"
    assert "<img" not in md.replace(span, "") and not CONTROL.search(md)
    tables = _tables(md)
    assert len(tables) >= 8 and all(len(set(t)) == 1 for t in tables), tables
    label = md_text("kivi@2" + HOSTILE)
    assert label == "kivi@2&lt;img src=x&gt;\\|\\`x\\`$x^^$\ufffd]0;T\ufffd\ufffd"
    assert f"| {label} |" in md and f"### Ranking on {md_text('KL' + HOSTILE)} ↓" in md
    assert f"- {span}: {md_text('no' + HOSTILE)}" in md
    assert (run / "perplexity_kl.png").stat().st_size > 0
    page = (run / "report.html").read_text(encoding="utf-8")
    assert "<img src=x" not in page and not CONTROL.search(page)
    assert "<code>qjl@2&lt;img src=x&gt;|`x`$x^^$\ufffd]0;T\ufffd\ufffd</code>" in page
    assert "llama&lt;img src=x&gt;|`x`$x^^$\ufffd]0;T\ufffd" in page  # md_text's escapes undone, HTML's made


def test_compare_prints_planted_text_as_written(tmp_path, capsys):
    """``harness compare`` of the planted run against one in a folder named with raw HTML and ESC: stdout holds
    no control character but line breaks and no raw HTML, and every table keeps its columns."""
    a = _planted(tmp_path / "a")
    b = _planted(tmp_path / ("b" + HOSTILE.replace("/", "")))
    assert main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "Paired" in out and md_text("b" + HOSTILE) in out
    assert "<img" not in out and not CONTROL.search(out.replace("\t", ""))
    tables = _tables(out)
    assert len(tables) >= 4 and all(len(set(t)) == 1 for t in tables), tables


def test_an_error_quoting_control_characters_prints_none(capsys):
    assert error("run", ValueError("prompt id 'a\x1b[31mRED\x1b]0;pwn\x07'\r\nis bad")) == 2
    assert capsys.readouterr().err == "harness run: error: prompt id 'a\ufffd[31mRED\ufffd]0;pwn\ufffd' is bad\n"


def test_a_duplicate_prompt_id_with_escapes_gets_one_line_without_them(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("HARNESS_DEBUG", raising=False)
    pid = "a\x1b[31mRED\x1b]0;pwn\x07"
    (tmp_path / "p.json").write_text(json.dumps([{"id": pid, "prompt": "x"}, {"id": pid, "prompt": "y"}]))
    line = one_line(capsys, ["run", "--model", "causvid-tiny", "--codec", "octopus", "--bits", "2", "--prompts",
                             str(tmp_path / "p.json"), "--out", str(tmp_path / "run")])
    assert "id 'a\ufffd[31mRED\ufffd]0;pwn\ufffd' appears twice" in line and not CONTROL.search(line)


def test_the_runs_notes_print_no_control_character(capsys):
    """The notes ``harness run`` prints (here: a repeated prompt, named by its id) go through its ``say``."""
    from harness.cli.main import say
    from harness.runner import unique_prompts
    from harness.tasks.base import Prompt

    pid = "a\x1b]0;T\x07"
    assert [p.id for p in unique_prompts("video", [Prompt(pid, "x"), Prompt(pid, "x")], log=say)] == [pid]
    assert capsys.readouterr().out == "video: prompt 'a\ufffd]0;T\ufffd' is repeated; it is run once\n"


def test_a_video_run_of_a_prompt_id_with_dollars_and_escapes_ends(tmp_path, capsys, monkeypatch):
    """``harness run`` of a video prompt whose id holds '$x^^$' (mathtext once the rollout is done, in the
    contact sheet's and drift plot's titles) and a terminal escape: the run ends with its plots written, and
    its progress line shows the id without a control character but the progress bar's own carriage return."""
    monkeypatch.setenv("KVCODEC_CACHE", str(tmp_path / "cache"))
    pid = "cost $x^^$ \x1b]0;T\x07 now"
    (tmp_path / "p.json").write_text(json.dumps([{"id": pid, "prompt": "a red ball"}]))
    out = tmp_path / "run"
    assert main(["run", "--model", "causvid-tiny", "--codec", "octopus", "--bits", "2", "--codec-seeds", "0",
                 "--prompts", str(tmp_path / "p.json"), "--task-opt", "video.stills=2", "--task-opt",
                 "video.lpips=false", "--out", str(out)]) == 0
    shown = capsys.readouterr()
    assert "video/cost $x^^$ \ufffd]0;T\ufffd now" in shown.err  # the progress line names the prompt
    assert not CONTROL.search(shown.out) and not CONTROL.search(shown.err.replace("\r", ""))
    (row,) = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines() if "octopus" in line]
    assert row["prompt"] == pid  # the id itself is kept as given
    for key in ("contact_sheet", "drift_plot"):
        assert (out / row["artifacts"][key]).stat().st_size > 0
    assert (out / "video_psnr.png").stat().st_size > 0
