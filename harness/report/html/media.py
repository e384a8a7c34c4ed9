"""The media of report.html, per task and prompt, from the artifacts the rows reference (a task's
:class:`~harness.report.sections.Outputs`: paths relative to the run folder, never inlined). A task declares
which of its artifact keys fill which role of a kind of section (``Task.media``, stored in registry.json:
:mod:`harness.report.run_data`); the kinds and their roles (:data:`ROLES`):

- ``video``: the ``baseline``'s and each codec's (``player``) MP4 as players that play, pause, step and
  seek together, the per-frame drift curves under them (``curves``: JSON files; clicking a frame seeks
  the players), then the contact sheets (``stills``);
- ``audio``: a player for the ``baseline`` and each codec (``player``; playing one pauses the others at the
  same moment: A/B listening), each codec's spectrogram (``image``: baseline beside codec), the per-scale
  teacher-forced curves (``curves``);
- any other artifact: a link.

An artifact whose file is missing is named, not linked: a page never points at nothing.
"""
from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import quote

from harness.run.input_files import read_json
from harness.run.rows import BASELINE_LABEL, within
from harness.report.formatting import display, fmt
from harness.report.html import plots
from harness.report.sections import OutputRow, Outputs, PromptOutputs

#: the roles of each kind of section, which a task's ``media`` maps to its artifact keys
ROLES = {"video": ("baseline", "player", "curves", "stills"), "audio": ("baseline", "player", "image", "curves")}
DRIFT_PANELS = [("psnr", "PSNR (dB)"), ("ssim", "SSIM"), ("lpips", "LPIPS"),
                ("latent_cos", "latent cosine (latent frames)")]
SCALE_PANELS = [("top1_agree", "top-1 agreement (teacher-forced)"), ("kl", "KL (teacher-forced)"),
                ("free_token_match", "token match (free-running)")]


class Media:
    """Resolves artifact paths of the run folder ``run`` for a page written in folder ``page_dir``."""

    def __init__(self, run: Path, page_dir: Path):
        self.run, self.page_dir = Path(run), Path(page_dir)
        self.missing: list[str] = []

    def _path(self, rel) -> Path | None:
        """The run's file that row path ``rel`` names, or None (noted) where it is missing or is not
        inside the run folder (rows are data: an absolute path, '..' or a link out is never read or linked)."""
        if not rel:
            return None
        if not isinstance(rel, str):
            self.missing.append(f"{rel!r} (not a path)")
            return None
        path = within(self.run, rel)
        if path is None:
            self.missing.append(f"{rel} (outside the run folder)")
            return None
        if not path.is_file():
            self.missing.append(rel)
            return None
        return path

    def src(self, rel: str | None) -> str | None:
        """The URL of artifact ``rel`` relative to the page (None, and noted, where the file is missing
        or outside the run folder)."""
        path = self._path(rel)
        return None if path is None else quote(Path(os.path.relpath(path, self.page_dir)).as_posix())

    def json(self, rel: str | None) -> dict | None:
        path = self._path(rel)
        return None if path is None else read_json(path, dict, "an artifact")


def _latest(rows: tuple[OutputRow, ...]) -> dict[str, OutputRow]:
    """{label: its last row}: the artifacts of a label are rewritten by each of its codec seeds, so
    the files on disk are the last row's."""
    return {r.label: r for r in rows}


def _caption(r: OutputRow) -> str:
    return " · ".join(f"{display(m)} {fmt(v)}" for m, v in r.values)


def _seed_note(rows: tuple[OutputRow, ...]) -> str:
    seeds = sorted({r.seed for r in rows})
    if len(seeds) < 2:
        return ""
    return f"Codec seeds {', '.join(map(str, seeds))} write the same files: shown are the last seed's."


def _baseline_player(media: Media, rows: tuple[OutputRow, ...], keys: dict[str, str], **extra) -> list[dict]:
    """The baseline's player, first of a prompt's players ([] where no row has the baseline's file)."""
    base_row = next((r for r in rows if r.files.get(keys.get("baseline"))), None)
    if base_row is not None and (src := media.src(base_row.files[keys["baseline"]])):
        return [{"label": "baseline (uncompressed)", "src": src, "caption": "", **extra}]
    return []


def video_section(media: Media, p: PromptOutputs, div_id: str, keys: dict[str, str]) -> dict:
    """``keys``: {role: artifact key} (:data:`ROLES`)."""
    rows = p.rows
    latest = _latest(rows)
    players = _baseline_player(media, rows, keys)
    drift, sheets, text, frames = {}, [], None, None
    for label, r in latest.items():
        arts = r.files
        d = media.json(arts.get(keys.get("curves")))
        if d is not None:
            text, frames = d.get("prompt", text), d.get("pixel_frames", frames)
            if label != BASELINE_LABEL:  # 'none' is the baseline: its curves are flat
                drift[label] = d
        if label == BASELINE_LABEL:
            continue
        if src := media.src(arts.get(keys.get("player"))):
            players.append({"label": label, "src": src, "caption": _caption(r)})
        if src := media.src(arts.get(keys.get("stills"))):
            sheets.append({"label": label, "src": src})
    frame_counts = [len(next((c[k] for c in drift.values() if c.get(k)), [])) for k, _ in DRIFT_PANELS
                    if any(c.get(k) for c in drift.values())]
    return {"kind": "video", "prompt": p.prompt, "text": text, "players": players, "frames": frames,
            "plot": plots.curves(DRIFT_PANELS, drift, div_id, "frame"), "plot_id": div_id,
            "plot_frames": frame_counts, "sheets": sheets, "note": _seed_note(rows)}


def audio_section(media: Media, p: PromptOutputs, div_id: str, keys: dict[str, str]) -> dict:
    """``keys``: {role: artifact key} (:data:`ROLES`)."""
    rows = p.rows
    latest = _latest(rows)
    players = _baseline_player(media, rows, keys, image=None)
    scales = {}
    for label, r in latest.items():
        arts = r.files
        c = media.json(arts.get(keys.get("curves")))
        if c is not None and label != BASELINE_LABEL:
            scales[label] = c
        if label != BASELINE_LABEL and (src := media.src(arts.get(keys.get("player")))):
            players.append({"label": label, "src": src, "caption": _caption(r),
                            "image": media.src(arts.get(keys.get("image")))})
    return {"kind": "audio", "prompt": p.prompt, "text": None, "players": players,
            "plot": plots.curves(SCALE_PANELS, scales, div_id, "scale"), "plot_id": div_id,
            "note": _seed_note(rows)}


def links_section(media: Media, p: PromptOutputs) -> dict:
    items = []
    for label, r in _latest(p.rows).items():
        links = [(name, media.src(rel)) for name, rel in r.artifacts]
        items.append({"label": label, "links": [(n, s) for n, s in links if s]})
    return {"kind": "links", "prompt": p.prompt, "items": items}


SECTIONS = {"video": video_section, "audio": audio_section}


def sections(media: Media, outputs: Outputs, id_prefix: str) -> list[dict]:
    """One media section per prompt of ``outputs`` (a task's), in row order: the first kind the task declares
    ({kind: {role: artifact key}}) whose keys its rows' artifacts hold, else links."""
    out = []
    for i, p in enumerate(outputs.prompts):
        keys = {k for r in p.rows for k, _ in r.artifacts}
        declared = p.declared
        kind = next((k for k, roles in declared.items() if k in SECTIONS and keys & set(roles.values())), None)
        if kind is None:
            out.append(links_section(media, p))
        else:
            out.append(SECTIONS[kind](media, p, f"{id_prefix}-media-{i}", declared[kind]))
    return out
