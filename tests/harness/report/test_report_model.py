"""harness/report/model.py: the report's content built once, report.md and report.html each rendering all of it.
A run folder with every kind of section (harness.report.sections.SECTION_KINDS: the reference, so a new kind is
covered without editing this file) gives both pages every section's headings and plots, and neither page a
section heading the report does not hold; a kind a renderer does not know is refused, not dropped."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

import numpy as np
import pytest
from helpers.html_page import Page
from helpers.run_folder import rebuild, shown, summary_of, synthetic_rows, write_run

from harness.report.formatting import plot_file
from harness.report.html.page import slug
from harness.report.model import build_report
from harness.report.run_data import read_run
from harness.report.document import SECTION_KINDS, TaskReport
from harness.report.sections import Section
from harness.report.speed import summarize_speed_by_task
from harness.run.rows import dumps

CONFIGS = {"octopus@2": (0.10, 2.1, (0, 1)), "kivi@2": (0.1001, 2.3, (0,)), "qjl@2": (0.20, 2.0, (0, 1)),
           "vllm-fp8@8": (0.01, 8.0, (0,))}  # vllm-fp8: an engine's deployed cache
NOTES = ["**Incomplete**: 3 of 9 planned rows are stored; rerun the same `harness run` command to resume.", ""]
#: section headings a page shows of its own, not of one section: report.md's heading over every task's outputs;
#: report.html's over a task's plots and over its outputs
OWN = {"md": {"Artifacts"}, "html": {"Rate against quality", "Outputs per prompt"}}


def _ruler_rows(labels) -> list[dict]:
    """RULER rows at three lengths and two of its tasks, the score dropping with length for the codecs: the
    breakdown by task and length and the effective length."""
    rng = np.random.default_rng(1)
    rows = []
    for label in ("none", *labels):
        codec, _, bits = label.partition("@")
        for context, drop in ((256, 0.1), (512, 0.5), (1024, 0.8)):
            for task in ("niah_single_1", "vt"):
                for repeat in (0, 1):
                    d = 0.0 if label == "none" else drop
                    score = float(np.clip(0.9 - d + rng.normal(0, 0.05), 0, 1))
                    rate = 16.0 if label == "none" else int(bits) + 0.1
                    rows.append({"task": "ruler", "prompt": f"{task}-{context}-{repeat}", "codec": codec,
                                 "bits": int(bits) if bits else 16, "label": label, "codec_seed": 0,
                                 "ruler_score": score, "ruler_pass": float(score > 0.5),
                                 "kl": d / 10 + abs(rng.normal(0, 1e-3)),
                                 "bits_per_coord": rate, "cache_bits_per_coord": rate, "cache_bytes": 1000,
                                 "uncompressed_bytes": 8000,
                                 "prompt_meta": {"ruler_task": task, "context": context, "repeat": repeat}})
    return rows


def _video_rows(out) -> list[dict]:
    """A video prompt (baseline and octopus@2) with the files its artifacts name (stand-in bytes); LPIPS not
    measured."""
    d = out / "video" / "clip"
    d.mkdir(parents=True)
    rows = []
    for label, value in (("none", 1.0), ("octopus@2", 0.9)):
        name = label.replace("@", "-")
        (d / f"{name}.drift.json").write_text(json.dumps({"prompt": "a red ball", "pixel_frames": 3,
                                                          "psnr": [None, 40.0, 35.0], "ssim": [1, value, value]}))
        arts = {"drift": f"video/clip/{name}.drift.json", "mp4_baseline": "video/clip/baseline.mp4"}
        if label != "none":
            arts.update(mp4=f"video/clip/{name}.mp4", contact_sheet=f"video/clip/{name}.sheet.png")
        for rel in arts.values():
            if not (out / rel).exists():
                (out / rel).write_bytes(b"stand-in")
        rate = 32.0 if label == "none" else 3.75
        rows.append({"task": "video", "prompt": "clip", "codec": label.split("@")[0],
                     "bits": 16 if label == "none" else 2, "label": label, "codec_seed": 0, "bits_per_coord": rate,
                     "cache_bits_per_coord": rate, "cache_bytes": 4096, "uncompressed_bytes": 4096,
                     "psnr": "inf" if label == "none" else 35.0, "ssim": value, "latent_cos": value, "artifacts": arts,
                     "unavailable": {"lpips": "no AlexNet weights"}})
    return rows


def _every_kind(path):
    """A run folder whose report has every kind of section, and its report (with notes under the title)."""
    out = path / "run"
    out.mkdir(parents=True)
    rows = synthetic_rows(CONFIGS) + _ruler_rows(["octopus@2", "kivi@2", "vllm-fp8@8"]) + _video_rows(out)
    write_run(out, rows)
    config = json.loads((out / "config.json").read_text())
    config.update(tasks=["perplexity", "ruler", "video"], codecs=["kivi", "octopus", "qjl", "vllm-fp8"], margin=0.05)
    (out / "config.json").write_text(dumps(config, indent=2) + "\n")
    speed = [{"task": r["task"], "prompt": r["prompt"], "label": r["label"], "codec_seed": r["codec_seed"],
              "rollout": r["prompt"], "sequences": 1, "device": "cpu", "prefill_s": 0.1 + 0.01 * (i % 7),
              "decode_per_s": None, "decode_unit": "token", "peak_bytes": None} for i, r in enumerate(rows)]
    (out / "speed.jsonl").write_text("".join(dumps(s) + "\n" for s in speed))
    from harness.report.build import write_reports

    run = read_run(out)
    write_reports(run, NOTES)
    summary = json.loads((out / "summary.json").read_text())
    return out, build_report(run, summary, summarize_speed_by_task(run.speed, summary), NOTES)


@dataclass
class Headings:
    """A page's headings (the section level ones apart) and the plots it draws."""
    all: list[str]
    sections: list[str]  # report.md's ## and ###, report.html's h2 and h3
    plots: set[str]


def _md(text: str) -> Headings:
    lines = text.splitlines()
    heads, sections = [], []
    for i, line in enumerate(lines):
        if m := re.match(r"(#+) (.*)", line):
            heads.append(m.group(2))
            if len(m.group(1)) in (2, 3):
                sections.append(m.group(2))
        heads += re.findall(r"<summary>(.*?)</summary>", line) + re.findall(r"!\[(.*?)\]", line)
        if m := re.match(r"\*\*(.+?)\*\*", line):
            heads.append(m.group(1))
        if line.startswith("| ") and i + 1 < len(lines) and lines[i + 1].startswith("|---"):
            heads.append(line[2:].split(" | ")[0])  # a table's first column names it
            if i >= 2 and not lines[i - 1] and lines[i - 2] and not lines[i - 2].startswith(("#", "|", "<", "!")):
                heads.append(lines[i - 2])  # the paragraph that introduces it
    return Headings([shown(h) for h in heads], [shown(h) for h in sections],
                    set(re.findall(r"!\[.*?\]\((.*?\.png)\)", text)))


class _HtmlHeadings(Page):
    HEADS = ("h1", "h2", "h3", "h4", "summary", "caption")

    def __init__(self, path):
        self.heads, self.sections, self._text, self._first_th = [], [], None, False
        super().__init__(path)

    def handle_starttag(self, tag, attrs):
        super().handle_starttag(tag, attrs)
        if tag == "thead":
            self._first_th = True
        if tag in self.HEADS or tag == "th" and self._first_th:
            self._text, self._tag, self._first_th = "", tag, False

    def handle_endtag(self, tag):
        super().handle_endtag(tag)
        if self._text is not None and tag == self._tag:
            self.heads.append(self._text.strip())
            if tag in ("h2", "h3"):
                self.sections.append(self._text.strip())
            self._text = None

    def handle_data(self, data):
        super().handle_data(data)
        if self._text is not None:
            self._text += data


def _html(path) -> Headings:
    page = _HtmlHeadings(path)
    assert page.problems == []
    return Headings(page.heads, page.sections, set(page.plot_ids()))


def test_both_pages_show_every_section_of_the_report(tmp_path):
    out, report = _every_kind(tmp_path)
    parts = report.parts()
    assert {type(s) for s in parts} == set(SECTION_KINDS), "the run folder must hold every kind of section"
    pages = {"md": _md((out / "report.md").read_text()), "html": _html(out / "report.html")}
    titles = set()
    for s in parts:
        assert s.titles or s.figures, f"a {type(s).__name__} section names no heading or plot to find it by"
        task = next((t.name for t in report.tasks if s is t or s in t.sections), None)
        for title in s.titles:
            titles.add(title)
            for name, page in pages.items():
                assert any(title in h for h in page.all), f"report.{name} lacks {type(s).__name__} '{title}' ({task})"
        for plot_task, plot in s.figures:
            assert plot_file(plot_task, plot) in pages["md"].plots, f"report.md lacks the plot {plot_task}/{plot}"
            assert slug("plot", plot_task, plot) in pages["html"].plots, \
                f"report.html lacks the plot {plot_task}/{plot}"
    # and neither page has a section heading of its own but those it declares
    for name, page in pages.items():
        extra = {h for h in page.sections if h not in OWN[name] and not any(t in h for t in titles)}
        assert not extra, f"report.{name} has sections the report does not hold: {sorted(extra)}"
    # what the page gained: report.html's q column and note, the RULER breakdown, the effective length's plot
    html = (out / "report.html").read_text()
    assert "Benjamini–Hochberg" in html and ">q</th>" in html and "plot-ruler-effective_length" in html
    assert "niah_single_1 @ 256" in html and "average @ 1024" in html and "Incomplete" in html


def test_the_report_is_a_function_of_the_run(tmp_path):
    """The same rows give an equal report; the pages are rebuilt from it byte for byte."""
    out, report = _every_kind(tmp_path)
    run = read_run(out)
    summary = json.loads((out / "summary.json").read_text())
    assert build_report(run, summary, summarize_speed_by_task(run.speed, summary), NOTES) == report
    assert summary == json.loads(dumps(summary_of(out), indent=2))
    md, html = (out / "report.md").read_bytes(), (out / "report.html").read_bytes()
    rebuild(out)  # no notes this time: only their lines go
    assert (out / "report.md").read_bytes() == md.replace(("\n".join(NOTES[:1]) + "\n\n").encode(), b"")
    assert b"Incomplete" not in (out / "report.html").read_bytes() and b"Incomplete" in html


@dataclass(frozen=True)
class _Unknown(Section):
    @property
    def titles(self):
        return ("a section no page knows",)


def test_a_section_a_page_cannot_render_is_refused(tmp_path):
    from dataclasses import replace

    from harness.report.html.run_page import task_view
    from harness.report.markdown import render

    out, report = _every_kind(tmp_path)
    t: TaskReport = replace(report.tasks[0], sections=(*report.tasks[0].sections, _Unknown()))
    with pytest.raises(TypeError, match="report.md has no rendering of a _Unknown section"):
        render(t.sections[-1], out)
    with pytest.raises(TypeError, match="report.html has no view of a _Unknown section"):
        task_view(out, t)
