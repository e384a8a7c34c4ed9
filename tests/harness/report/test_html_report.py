"""report.html read with html.parser (runs everywhere, no browser): it parses with every element
closed, opens with the ranking and its 95% intervals, has a plot per metric, sortable tables,
media whose files exist (videos and audio of a synthetic run folder), nothing from the network,
and the same bytes for the same rows; the compare page likewise."""
from __future__ import annotations

import json

import pytest
from helpers.html_page import Page
from helpers.run_folder import rebuild, summary_of, synthetic_rows, write_run

from harness.report.html import write_compare_page
from harness.run.rows import dumps
from harness.report.formatting import fmt, fmt_ci
from harness.tasks import get_task

CONFIGS = {"octopus@2": (0.10, 2.1, (0, 1)), "kivi@2": (0.1001, 2.3, (0,)), "qjl@2": (0.20, 2.0, (0, 1)),
           "octopus@3": (0.05, 3.1, (0, 1))}


@pytest.fixture(autouse=True)
def headline_kl(monkeypatch):
    monkeypatch.setattr(get_task("perplexity"), "headline", "kl", raising=False)


def _media_rows(out, task: str) -> list[dict]:
    """Rows of a video or audio task for one prompt (baseline + octopus@2) and the files their
    artifacts name, as the tasks write them (the media bytes are stand-ins: nothing decodes them here)."""
    d = out / task / "clip"
    d.mkdir(parents=True)
    rows = []
    for label, value in (("none", 1.0), ("octopus@2", 0.9)):
        name = label.replace("@", "-")
        rate = {"bits_per_coord": 32.0 if label == "none" else 3.75, "cache_bits_per_coord": 32.0 if label == "none" else 3.75,
                "cache_bytes": 4096, "uncompressed_bytes": 4096}
        r = {"task": task, "prompt": "clip", "codec": label.split("@")[0], "bits": 16 if label == "none" else 2,
             "label": label, "codec_seed": 0, **rate}
        if task == "video":
            (d / f"{name}.drift.json").write_text(json.dumps({"prompt": "a red ball", "label": label, "pixel_frames": 5,
                                                              "psnr": [None, None, 40.0, 35.0, 30.0],
                                                              "ssim": [1, 1, value, value, value], "latent_cos": [1, value]}))
            r.update(psnr="inf" if label == "none" else 35.0, ssim=value, latent_cos=value,
                     artifacts={"drift": f"video/clip/{name}.drift.json", "mp4_baseline": "video/clip/baseline.mp4"})
            if label != "none":
                r["artifacts"].update(mp4=f"video/clip/{name}.mp4", contact_sheet=f"video/clip/{name}.sheet.png")
        else:
            (d / f"{name}.per_scale.json").write_text(json.dumps({"scales": [1, 2], "top1_agree": [1.0, value],
                                                                  "kl": [0.0, 1 - value]}))
            r.update(snr_db=20.0 * value, lsd=1 - value, kl=1 - value, top1_agree=value,
                     artifacts={"per_scale": f"audio/clip/{name}.per_scale.json", "wav_baseline": "audio/clip/baseline.wav",
                                "wav": f"audio/clip/{name}.wav", "spectrogram": f"audio/clip/{name}.png"})
        for key, rel in r["artifacts"].items():
            if not (out / rel).exists():
                (out / rel).write_bytes(b"stand-in")
        rows.append(r)
    return rows


def _run(path, media: bool = True):
    out = write_run(path, synthetic_rows(CONFIGS))
    if media:
        extra = _media_rows(out, "video") + _media_rows(out, "audio")
        with (out / "rows.jsonl").open("a") as f:
            f.write("".join(dumps(r) + "\n" for r in extra))
    rebuild(out)
    return out


def test_page_has_the_ranking_plots_tables_and_media(tmp_path):
    out = _run(tmp_path / "run")
    page = Page(out / "report.html")
    assert page.problems == []
    # the ranking on the headline metric, with each configuration's mean ± 95% and its interval
    s = summary_of(out)
    ranking = next(t for t in page.tables if "ranking" in t["class"])
    assert "KL (nats) ↓, mean ± 95%" in ranking["text"] and "95% interval" in ranking["text"]
    for c in s["tasks"]["perplexity"]["ranking"][0]["configs"]:
        assert fmt_ci(c, with_n=False) in ranking["text"] and f"[{fmt(c['ci95'][0])}, {fmt(c['ci95'][1])}]" in ranking["text"]
    assert ranking["rows"] == 1 + len(CONFIGS)  # the header and one row per configuration
    # one rate-quality plot per metric with values, then the drift and per-scale curves
    ids = page.plot_ids()
    for task, t in s["tasks"].items():
        measured = [m["name"] for m in t["metrics"] if any(m["name"] in g["metrics"] for g in t["groups"])]
        assert [i for i in ids if i.startswith(f"plot-{task}-")] == [f"plot-{task}-{m}" for m in measured]
    assert "video-media-0" in ids and "audio-media-0" in ids
    # sortable tables with numbers to sort by; per-prompt tables among them
    assert len(page.find("table", "sortable")) == len(page.tables) and page.find("table", "per-prompt")
    assert any(a.get("data-sort") for a in page.find("td"))
    # media: the baseline and the codec for video (in a synchronized group) and audio; each file exists
    assert [a["src"] for a in page.find("video")] == ["video/clip/baseline.mp4", "video/clip/octopus-2.mp4"]
    assert [a["src"] for a in page.find("audio")] == ["audio/clip/baseline.wav", "audio/clip/octopus-2.wav"]
    assert page.find("div", "sync-group") and page.find("div", "ab-group")
    assert {"video/clip/octopus-2.sheet.png", "audio/clip/octopus-2.png"} <= {a["src"] for a in page.find("img")}
    for ref in page.references():
        local = page.local_file(ref)
        assert local is not None, f"{ref}: the page must not reach the network"
        assert local.is_file(), ref
    assert [a["src"] for a in page.find("script") if a.get("src")] == ["plotly.min.js"]
    assert (out / "plotly.min.js").stat().st_size > 1_000_000


def test_same_rows_same_bytes(tmp_path):
    a, b = _run(tmp_path / "a"), _run(tmp_path / "b")
    first = (a / "report.html").read_bytes()
    assert first == (b / "report.html").read_bytes()
    rebuild(a)  # written twice
    assert (a / "report.html").read_bytes() == first
    assert str(tmp_path).encode() not in first  # nothing of where the folder is


def test_a_missing_artifact_is_named_not_linked(tmp_path):
    out = _run(tmp_path / "run")
    (out / "video" / "clip" / "octopus-2.mp4").unlink()
    rebuild(out)
    page = Page(out / "report.html")
    assert [a["src"] for a in page.find("video")] == ["video/clip/baseline.mp4"]
    assert "video/clip/octopus-2.mp4" in (out / "report.html").read_text()


def test_compare_page(tmp_path):
    a, b = _run(tmp_path / "a", media=False), _run(tmp_path / "b", media=False)
    path = write_compare_page([a, b], tmp_path / "cmp" / "compare.html")
    page = Page(path)
    assert page.problems == []
    assert {"../a/report.html", "../b/report.html"} <= set(page.references())
    assert all(page.local_file(r) and page.local_file(r).is_file() for r in page.references())
    paired = [t for t in page.tables if "b − a ± 95%" in t["text"]]
    assert len(paired) == 3 and "indistinguishable" in paired[0]["text"]  # the same rows: no difference
    assert page.plot_ids() == [f"plot-perplexity-{m}" for m in ("perplexity", "kl", "top1_agree")]
    assert path.read_bytes() == write_compare_page([a, b], tmp_path / "cmp" / "compare.html").read_bytes()


# --- media as a task declares them -------------------------------------------------------------------
def _declared_run(path, media: dict):
    """A run folder whose rows carry the video artifacts under other keys (a task 'clips'), and whose
    registry.json declares ``media`` for that task."""
    from harness.report.run_data import declared
    from harness.run.folder import RunFolder

    out = write_run(path, synthetic_rows(CONFIGS))
    rows = _media_rows(out, "video")
    keys = {"mp4": "movie", "mp4_baseline": "movie_ref", "drift": "frames", "contact_sheet": "sheet"}
    for r in rows:
        r["task"] = "clips"
        r["artifacts"] = {keys[k]: v for k, v in r["artifacts"].items()}
    with (out / "rows.jsonl").open("a") as f:
        f.write("".join(dumps(r) + "\n" for r in rows))
    config, model = (json.loads((out / n).read_text()) for n in ("config.json", "model.json"))
    registry = declared(config, model, rows)
    registry["tasks"]["clips"] = {"metrics": ["psnr", "ssim"], "headline": None, "score_metric": None,
                                  "breakdown": [], "media": media}
    (out / RunFolder.REGISTRY).write_text(dumps(registry, indent=2) + "\n")
    rebuild(out)
    return Page(out / "report.html")


def test_a_task_declares_its_media(tmp_path):
    page = _declared_run(tmp_path / "run", {"video": {"baseline": "movie_ref", "player": "movie", "curves": "frames",
                                                      "stills": "sheet"}})
    assert page.problems == []
    assert [a["src"] for a in page.find("video")] == ["video/clip/baseline.mp4", "video/clip/octopus-2.mp4"]
    assert "video/clip/octopus-2.sheet.png" in {a["src"] for a in page.find("img")}
    assert "clips-media-0" in page.plot_ids()


def test_artifacts_no_media_declares_are_links(tmp_path):
    page = _declared_run(tmp_path / "run", {})
    assert page.problems == [] and not page.find("video")
    links = {a["href"] for a in page.find("a") if a.get("href")}
    assert {"video/clip/octopus-2.mp4", "video/clip/baseline.mp4"} <= links


def test_every_task_declares_media_the_page_knows():
    from harness.report.html.media import ROLES
    from harness.tasks import list_tasks

    declared = {name: cls.media for name, cls in list_tasks().items()}
    assert declared["video"] and declared["audio"]
    for name, media in declared.items():
        for kind, roles in media.items():
            assert kind in ROLES and set(roles) <= set(ROLES[kind]), (name, kind)
