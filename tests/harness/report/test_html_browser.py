"""report.html in a real browser (headless Chromium over the DevTools protocol; skipped where there
is none: scripts/setup installs Debian's ``chromium`` where apt is available), for a tiny text run
and a tiny video run: the page loads without an exception, console error or failed load; every
plot is drawn; every media element's file exists and the browser decodes it; the video players
play, pause, seek and step together and move the drift plot's cursor; the screenshot is not blank."""
from __future__ import annotations

import io

import numpy as np
import pytest
from helpers.browser import Browser, find_chromium
from helpers.html_page import Page
from helpers.tiny_lm import tiny_causal_lm

from harness.run.config import RunConfig
from harness.runner import run

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    find_chromium() is None, reason="no chromium on PATH (scripts/setup installs Debian's chromium where apt is available)")]
TEXT = ("The quick brown fox jumps over the lazy dog. A stitch in time saves nine. " * 40).strip()


@pytest.fixture(scope="module")
def text_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("text")
    (d / "fox.txt").write_text(TEXT)
    cfg = RunConfig(model="hf", model_path="(tiny)", tasks=["perplexity"], codecs=["octopus", "quarot"], bits=[2],
                    prompts=str(d / "fox.txt"), limit=2, residual=8, codec_seeds=[0],
                    task_options={"perplexity": {"context": 140, "prefix": 60, "chunk": 20}})
    return run(cfg, out=d / "run", model=tiny_causal_lm("qwen2"), progress=False, log=lambda *_: None)


@pytest.fixture(scope="module")
def video_run(tmp_path_factory):
    from adapters.wan import CAUSVID, build_random, tiny_spec
    from harness.tasks.video import mp4_status

    if not mp4_status()[0]:
        pytest.skip(mp4_status()[1])
    cfg = RunConfig(model="causvid-tiny", tasks=["video"], codecs=["octopus", "turboquant-mse"], bits=[2], limit=1,
                    codec_seeds=[0], task_options={"video": {"stills": "4", "lpips": "false"}})
    model = build_random(tiny_spec(CAUSVID, num_frames=6), seed=3)  # 21 pixel frames
    return run(cfg, out=tmp_path_factory.mktemp("video") / "run", model=model, progress=False, log=lambda *_: None)


def _not_blank(png: bytes) -> float:
    """The fraction of pixels that differ from the page's background (the most common colour)."""
    from PIL import Image

    img = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))
    colours, counts = np.unique(img.reshape(-1, 3), axis=0, return_counts=True)
    assert len(colours) > 1
    return 1.0 - counts.max() / counts.sum()


def _until(b: Browser, condition: str, seconds: float = 20.0):
    """Wait for the page's JavaScript ``condition`` to hold, polled every 50 ms up to a generous deadline
    (within the browser's 30 s per command; the events that arrive meanwhile are kept): its last value."""
    return b.eval(f"""new Promise(done => {{ const t0 = performance.now(); (function poll() {{
        const v = ({condition}); if (v || performance.now() - t0 > {seconds * 1000}) done(v);
        else setTimeout(poll, 50); }})(); }})""", await_promise=True)


@pytest.fixture
def b():
    with Browser(1280, 900) as browser:
        yield browser


def _load(b: Browser, out, tmp_path) -> Page:
    """Open ``out``'s report.html and check what every page must be; its parsed HTML."""
    page = Page(out / "report.html")
    assert page.problems == []
    for src in page.media_sources() + page.references():  # every file the page points at is there
        assert page.local_file(src) is not None and page.local_file(src).is_file(), src
    b.open(out / "report.html")
    # every plot drawn: plotly gave each div its SVG (waited for, not slept on)
    drawn = "Array.from(document.querySelectorAll('.plotly-graph-div')).filter(d => d.querySelector('svg.main-svg')).length"
    _until(b, f"{drawn} >= {len(page.plot_ids())}")
    assert b.errors == []
    assert b.eval(drawn) == len(page.plot_ids()) > 0
    # every media element loaded: metadata read, no decode or network error
    states = b.eval("""new Promise(done => { const t0 = performance.now(); (function poll() {
        const m = Array.from(document.querySelectorAll('video, audio'));
        if (m.every(e => e.readyState >= 1 || e.error) || performance.now() - t0 > 10000)
          done(m.map(e => [e.getAttribute('src'), e.readyState, e.error && e.error.code]));
        else setTimeout(poll, 50); })(); })""", await_promise=True)
    assert all(ready >= 1 and err is None for _, ready, err in states), states
    png = b.screenshot()
    (tmp_path / "page.png").write_bytes(png)
    assert _not_blank(png) > 0.05
    return page


def test_text_page_in_a_browser(text_run, b, tmp_path):
    page = _load(b, text_run, tmp_path)
    assert page.find("table", "ranking") and not page.media_sources()
    # sorting a column reorders the rows by its numbers
    order = b.eval("""(() => { const t = document.querySelector('table.configs');
        t.querySelectorAll('th')[1].click(); t.querySelectorAll('th')[1].click();
        return Array.from(t.tBodies[0].rows).map(r => parseFloat(r.cells[1].dataset.sort)); })()""")
    assert order == sorted(order, reverse=True) and len(order) == 3
    assert b.errors == []


def test_video_page_in_a_browser(video_run, b, tmp_path):
    page = _load(b, video_run, tmp_path)
    assert [a["src"].rsplit("/", 1)[1] for a in page.find("video")] == ["baseline.mp4", "octopus-2.seed0.mp4",
                                                                        "turboquant-mse-2.seed0.mp4"]
    group = "document.querySelector('.sync-group')"
    videos = f"Array.from({group}.querySelectorAll('video'))"
    # play: every player plays; pause: every player stops, at one time. Waited for: the lead past 0.3 s of play,
    # so at least one timeupdate (every <= 250 ms) has brought each follower within half a frame of it
    b.eval(f"{group}.querySelector('.sync-play').click()")
    _until(b, f"{videos}.every(v => !v.paused) && {videos}[0].currentTime >= 0.3 || {videos}[0].ended")
    assert b.eval(f"{videos}.map(v => !v.paused)") == [True] * 3
    b.eval(f"{group}.querySelector('.sync-play').click()")
    _until(b, f"{videos}.every(v => v.paused)")
    times = b.eval(f"{videos}.map(v => v.paused ? v.currentTime : -1)")
    # each follower within half a frame (1/32 s at 16 fps) of the lead at its last timeupdate: 1/16 s apart at most;
    # 0.1 s allows what the players moved apart since (no clean bound: their decoders run on their own)
    assert min(times) >= 0 and max(times) - min(times) < 0.1
    # seek to the middle: every player there, the drift plot's cursor with them
    b.eval(f"(() => {{ const s = {group}.querySelector('.sync-seek'); s.value = 500; s.dispatchEvent(new Event('input')); }})()")
    _until(b, f"{videos}.every(v => !v.seeking)")
    times, duration = b.eval(f"{videos}.map(v => v.currentTime)"), b.eval(f"{videos}[0].duration")
    # the seek sets duration x 500 / 1000; Chromium keeps media times in whole microseconds (base::TimeDelta)
    assert all(abs(t - duration / 2) <= 1e-6 for t in times), (times, duration)
    cursor = b.eval(f"document.getElementById({group}.dataset.plot).layout.shapes.map(s => s.x0)")
    assert len(cursor) == 3 and cursor[0] == 10  # frame 10 of 21 pixel frames; latent frames likewise
    # one frame on: every player on the next frame
    b.eval(f"{group}.querySelector('.sync-step[data-step=\"1\"]').click()")
    _until(b, f"{videos}.every(v => !v.seeking) && {group}.querySelector('.sync-time').textContent !== 'frame 10 / 20'")
    assert b.eval(f"{group}.querySelector('.sync-time').textContent") == "frame 11 / 20"
    assert b.errors == []
