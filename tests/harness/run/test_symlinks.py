"""No write through a symbolic link planted in a run folder (issue #27): a report replaces each
artifact link with the file, a resumed run refuses to append through one in a line, and nothing
outside the folder changes. The cases are a table: a new artifact kind is one line."""
from __future__ import annotations

import os

import pytest
from helpers.tiny_lm import text_run_config, tiny_causal_lm

from harness.report.build import report
from harness.run.rows import UnsafePath, append_line, atomic_write, cut_torn_line, write_via
from harness.runner import run

QUIET = dict(progress=False, log=lambda *_: None)

#: artifacts a report rewrites: each becomes a link to an outside file, the report must leave that file alone
REPORT_ARTIFACTS = ["report.md", "report.html", "plotly.min.js", "perplexity_ppl_delta.png"]
#: files a resumed run appends to or repairs: a link there is refused with one line
RESUME_FILES = ["rows.jsonl", "timings.jsonl"]


@pytest.fixture(scope="module")
def lm():
    return tiny_causal_lm("qwen2")


def _config(tmp_path):
    return text_run_config(tmp_path, tasks=("perplexity",), codecs=("turboquant-mse",), limit=1, codec_seeds=[0])


def _plant(path, outside) -> None:
    path.unlink(missing_ok=True)
    os.symlink(outside, path)


@pytest.mark.parametrize("name", REPORT_ARTIFACTS)
def test_a_report_never_writes_through_a_link(lm, tmp_path, name):
    out = run(_config(tmp_path), out=tmp_path / "run", model=lm, **QUIET)
    if name.endswith(".png") and not (out / name).exists():
        name = sorted(p.name for p in out.glob("*.png"))[0]  # whichever plot the report drew
    outside = tmp_path / "outside.txt"
    outside.write_text("the user's own file")
    _plant(out / name, outside)
    report(out)
    assert outside.read_text() == "the user's own file"
    assert not (out / name).is_symlink() and (out / name).stat().st_size > 0  # the artifact, rewritten in place


@pytest.mark.parametrize("name", RESUME_FILES)
def test_a_resume_refuses_to_append_through_a_link(lm, tmp_path, name):
    config = _config(tmp_path)
    out = run(config, out=tmp_path / "run", model=lm, **QUIET)
    outside = tmp_path / "outside.jsonl"
    outside.write_text("line one\nline two, torn")  # a torn last line: the repair would cut it
    _plant(out / name, outside)
    if name != "rows.jsonl":
        (out / "rows.jsonl").write_text("")  # rows to compute again, so the run appends
    with pytest.raises(UnsafePath, match=f"{name} is a symbolic link"):
        run(config, out=out, model=lm, **QUIET)
    assert outside.read_text() == "line one\nline two, torn"


def test_the_write_primitives_replace_or_refuse_a_link(tmp_path):
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"keep")
    folder = tmp_path / "run"
    folder.mkdir()
    for i, write in enumerate((lambda p: atomic_write(p, "text"), lambda p: atomic_write(p, b"bytes"),
                               lambda p: write_via(p, lambda t: t.write_bytes(b"a plot, a video, a wav")))):
        link = folder / f"artifact{i}.png"
        _plant(link, outside)
        write(link)
        assert not link.is_symlink() and outside.read_bytes() == b"keep"
    # a planted link where the temporary file goes: removed, not written through
    _plant(folder / f"artifact.{os.getpid()}.tmp", outside)
    atomic_write(folder / "artifact", "x")
    assert outside.read_bytes() == b"keep" and (folder / "artifact").read_text() == "x"
    for refuse in (lambda p: append_line(p, "{}"), cut_torn_line):
        link = folder / "rows.jsonl"
        _plant(link, outside)
        with pytest.raises(UnsafePath, match="is a symbolic link"):
            refuse(link)
        assert outside.read_bytes() == b"keep"


@pytest.mark.parametrize("rel", ["/etc/passwd", "../../../../etc/passwd", "video/p/link.json", 5])
def test_the_page_never_reads_or_links_a_path_outside_the_run(tmp_path, rel):
    """Paths named in rows are data: an absolute one, '..' or a link out is neither read nor linked."""
    from harness.report.html.media import Media

    secret = tmp_path / "secret.json"
    secret.write_text('{"psnr": [1, 2]}')
    run_dir = tmp_path / "run"
    (run_dir / "video" / "p").mkdir(parents=True)
    os.symlink(secret, run_dir / "video" / "p" / "link.json")
    (run_dir / "video" / "p" / "own.json").write_text('{"psnr": [3]}')
    media = Media(run_dir, run_dir)
    if isinstance(rel, str) and rel.startswith("/"):
        rel = str(secret)
    assert media.src(rel) is None and media.json(rel) is None
    assert any("outside the run folder" in m or "not a path" in m for m in media.missing)
    assert media.json("video/p/own.json") == {"psnr": [3]} and media.src("video/p/own.json") == "video/p/own.json"


# --- video and audio artifacts, end to end ---------------------------------------------------------
def _media_config(modality: str):
    from harness.run.config import RunConfig

    options = {"video": {"stills": "2", "lpips": "false"},
               "audio": {"clip_seconds": "1", "top_k": "8", "save_audio": "true"}}[modality]
    model = {"video": "causvid-tiny", "audio": "aar-tiny"}[modality]
    return RunConfig(model=model, tasks=[modality], codecs=["octopus"], bits=[2], limit=1, codec_seeds=[0],
                     prompts="synthetic" if modality == "audio" else None, task_options={modality: options})


@pytest.mark.parametrize("modality", ["video", "audio"])
def test_a_resumed_media_rollout_never_writes_through_a_link(tmp_path, modality):
    """Every artifact a codec row writes (videos, contact sheets, drift curves and their plot; WAVs,
    spectrograms, per-scale curves) is planted as a link to an outside file before the row is
    computed again: the resumed run replaces each link with the artifact, and no outside file changes."""
    from harness.run.rows import read_rows

    config = _media_config(modality)
    out = run(config, out=tmp_path / "run", **QUIET)
    rows = read_rows(out / "rows.jsonl")
    codec_row = next(r for r in rows if r["label"] != "none")
    arts = [out / rel for rel in codec_row["artifacts"].values()]
    assert arts and all(p.is_file() for p in arts)
    outside = []
    for i, p in enumerate(arts):
        o = tmp_path / f"outside-{i}"
        o.write_text(f"the user's own file {i}")
        _plant(p, o)
        outside.append(o)
    (out / "rows.jsonl").write_text("".join(__import__("json").dumps(r) + "\n" for r in rows if r is not codec_row))
    run(config, out=out, **QUIET)
    assert [o.read_text() for o in outside] == [f"the user's own file {i}" for i in range(len(outside))]
    assert all(not p.is_symlink() and p.is_file() and p.stat().st_size > 0 for p in arts)
