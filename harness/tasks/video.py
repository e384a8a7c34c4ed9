"""The ``video`` task: a causal Wan rollout per prompt, each codec's against the uncompressed one.

Per prompt: the text embedding, then one rollout with a native cache (the baseline: latents and
decoded frames). Per cache configuration: the same rollout (same private generator, so the same
initial noise and re-noising draws) with the self-attention cache compressed, decoded, and
compared frame by frame with the baseline: LPIPS, PSNR, SSIM on decoded frames, cosine on latent
frames. The row holds each metric's per-prompt value (mean over frames; PSNR from the video's
MSE) and its min / max over frames; the per-frame series (the drift curve) goes to a JSON file.
Artifacts: MP4s (baseline and codec), a contact sheet of stills (baseline above codec) and a
drift plot of every codec evaluated so far on the prompt.

The native window is counted in frames (option ``residual_frames``, default 1: the paper's one
native frame), whatever the cache config's token count says; the rest of the cache config
(codec, bits, value group, protection) is used as given.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from adapters.cache.stats import cache_row_stats
from adapters.cache.config import CacheConfig
from adapters.cache.kv_cache import CompressedKVCache
from adapters.cache.rollout_clock import RolloutClock
from kernels import private_generator
from registry.options import Allowed, option
from metrics import video as vm

from harness.run.input_files import InputError, field, read_json, read_text
from harness.run.rows import atomic_write, inside, is_regular, safe_name, write_via
from harness.run.safe_text import plot_text
from harness.tasks.base import Prompt, Task, artifact_label, register_task

PROMPTS_DIR = Path(__file__).resolve().parents[2] / "prompts" / "video"
METRICS = ("lpips", "psnr", "ssim", "latent_cos")


@dataclass
class VideoRollout:
    latents: torch.Tensor  # [1, C, F, h, w] on the CPU, model dtype
    frames: torch.Tensor | None  # [T, 3, H, W] float32 in [-1, 1], CPU (None: not decoded yet)
    cache: CompressedKVCache | None = None  # the cache at the end of the rollout (None: dropped, a baseline)
    speed: dict | None = None  # RolloutClock.record() of a timed rollout


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")[:40] or "prompt"


def _safe(label: str) -> str:
    return label.replace("@", "-").replace("/", "_")


def to_uint8(frames: torch.Tensor) -> np.ndarray:
    """[T, 3, H, W] in [-1, 1] -> [T, H, W, 3] uint8."""
    return ((frames.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()


def mp4_status() -> tuple[bool, str]:
    """(available, why not): MP4s need imageio with its ffmpeg plugin (imageio-ffmpeg)."""
    import importlib.util

    for mod in ("imageio", "imageio_ffmpeg"):
        if importlib.util.find_spec(mod) is None:
            name = mod.replace("_", "-")
            return False, f"MP4s not written: {name} is not installed (pip install imageio imageio-ffmpeg)"
    return True, ""


def write_mp4(path: Path, frames: torch.Tensor, fps: int) -> None:
    import imageio.v2 as iio

    path.parent.mkdir(parents=True, exist_ok=True)
    write_via(path, lambda p: iio.mimwrite(str(p), to_uint8(frames), format="FFMPEG", fps=fps, codec="libx264",
                                           quality=8, macro_block_size=16))


def still_indices(num_frames: int, stills: int) -> list[int]:
    """``stills`` evenly spaced frame indices, first and last included."""
    if stills <= 1 or num_frames == 1:
        return [num_frames - 1]
    return sorted({round(i * (num_frames - 1) / (stills - 1)) for i in range(stills)})


def write_contact_sheet(path: Path, rows: list[tuple[str, torch.Tensor]], stills: int, title: str) -> None:
    """A PNG grid: one row per (label, frames), the same ``stills`` frame indices in every row; the labels and
    the title (which name a prompt id) drawn as written (:func:`~harness.run.safe_text.plot_text`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    T, _, H, W = rows[0][1].shape
    idx = still_indices(T, stills)
    cell_w = 2.2
    fig, axes = plt.subplots(len(rows), len(idx), figsize=(cell_w * len(idx), cell_w * H / W * len(rows) + 0.6),
                             squeeze=False)
    for r, (label, frames) in enumerate(rows):
        imgs = to_uint8(frames[idx])
        for c, i in enumerate(idx):
            ax = axes[r][c]
            ax.imshow(imgs[c])
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                ax.set_title(f"frame {i}", fontsize=8)
            if c == 0:
                ax.set_ylabel(plot_text(label), fontsize=8)
    fig.suptitle(plot_text(title), fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_via(path, lambda p: fig.savefig(p, dpi=100))
    plt.close(fig)


def write_drift_plot(path: Path, curves: dict[str, dict], title: str) -> None:
    """Per-frame PSNR, SSIM, LPIPS (pixel frames) and latent cosine (latent frames), one line per codec; the
    labels and the title drawn as written (:func:`~harness.run.safe_text.plot_text`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [m for m in ("psnr", "ssim", "lpips", "latent_cos") if any(c.get(m) for c in curves.values())]
    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels), 3.0), squeeze=False)
    for ax, m in zip(axes[0], panels):
        # identical frames (PSNR +inf, stored as None) are drawn on one line above every finite value
        finite = [y for c in curves.values() for y in (c.get(m) or []) if y is not None]
        cap = (max(finite) + 5) if finite else 100.0
        for label, c in sorted(curves.items()):
            ys = c.get(m)
            if ys:
                ax.plot(range(len(ys)), [cap if y is None else y for y in ys], label=plot_text(label), lw=1)
        if m == "psnr" and any(y is None for c in curves.values() for y in (c.get(m) or [])):
            ax.axhline(cap, color="0.6", lw=0.5, ls=":")
            ax.text(0, cap, " identical (inf)", fontsize=6, va="bottom", color="0.4")
        ax.set_title(m + (" (latent frames)" if m == "latent_cos" else ""), fontsize=9)
        ax.set_xlabel("frame")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(plot_text(title), fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_via(path, lambda p: fig.savefig(p, dpi=90))
    plt.close(fig)


@register_task("video")
class VideoTask(Task):
    modality = "video"
    metrics = METRICS
    media = {"video": {"baseline": "mp4_baseline", "player": "mp4", "curves": "drift", "stills": "contact_sheet"}}

    @dataclass(frozen=True)
    class Options:
        residual_frames: int = option(
            1, "native window of the cache, in latent frames (overrides --residual)", Allowed(lo=0))
        stills: int = option(6, "frames per row of the contact sheet", Allowed(lo=1))
        save_video: bool = option(True, "write MP4s and contact sheets")
        lpips: bool = option(True, "compute LPIPS (needs the AlexNet weights in the torch hub cache)")

    def __init__(self, **options):
        super().__init__(**options)
        self.residual_frames = int(self.opts.residual_frames)
        self.stills = int(self.opts.stills)
        self.save_video = bool(self.opts.save_video)
        self.use_lpips = bool(self.opts.lpips)
        ok, why = vm.lpips_status()
        #: metric -> why it is not reported (the report shows this instead of a number)
        self.unavailable: dict[str, str] = {}
        if not self.use_lpips:
            self.unavailable["lpips"] = "LPIPS disabled (task option lpips=False)"
        elif not ok:
            self.unavailable["lpips"] = why
        mp4_ok, mp4_why = mp4_status()
        if self.save_video and not mp4_ok:
            self.unavailable["mp4"] = mp4_why

    # --- prompts -----------------------------------------------------------------------------
    def prompts(self, source: str | None = None, limit: int | None = None) -> list[Prompt]:
        """source: None (prompts/video/prompts.json), a JSON file ({"prompts": [{"id", "prompt"}]} or a
        list of strings) or a text file with one prompt per line."""
        p = Path(source) if source else PROMPTS_DIR / "prompts.json"
        if not p.is_file():
            raise FileNotFoundError(f"video prompts: no file '{p}' (a .json list or a .txt file, one prompt a line)")
        shape = 'a JSON list of prompts, or {"prompts": [...]}, each a string or {"id": ..., "prompt": ...}'
        if p.suffix == ".json":
            spec = read_json(p, (dict, list), "video prompts", fix=shape)
            items = field(spec, "prompts", list, str(p)) if isinstance(spec, dict) else spec
        else:
            items = [line.strip() for line in read_text(p, "video prompts").splitlines() if line.strip()]
        out, seen = [], set()
        for i, it in enumerate(items):
            where = f"{p}: prompt {i}"
            if not isinstance(it, (str, dict)):
                raise InputError(f"{where}: each prompt is a string or an object; {shape}")
            text = field(it, "prompt", str, where) if isinstance(it, dict) else it
            pid = field(it, "id", (str, int), where, "") if isinstance(it, dict) else ""
            pid = pid or f"{i:03d}_{_slug(text)}"
            if pid in seen:
                raise ValueError(f"video prompts: id '{pid}' appears twice in {p}")
            seen.add(pid)
            out.append(Prompt(pid, text, {"source": str(p)}))
        if not out:
            raise InputError(f"{p}: no video prompts in it; {shape}")
        return out[:limit] if limit else out

    # --- rollouts ----------------------------------------------------------------------------
    @staticmethod
    def _generator(prompt: Prompt, seed: int) -> torch.Generator:
        # CPU generator: the model draws its noise on the CPU and moves it, so every device agrees
        return private_generator("video", prompt.id, seed)

    def generate(self, model, prompt: Prompt, cache_config: CacheConfig, seed: int, timed: bool = False) -> VideoRollout:
        """One rollout of ``prompt`` under ``cache_config`` (window in frames), decoded; ``timed``:
        with its speed record (the VAE's decode is not in it)."""
        if getattr(model, "modality", None) != "video":
            raise TypeError(f"the video task drives a video model (causvid, causal-forcing and their -tiny and "
                            f"-random variants), got {type(model).__name__}")
        cache = model.new_cache(cache_config, window=self.residual_frames)
        clock = RolloutClock(model.device, unit="latent frame") if timed else None
        latents = model.rollout(model.encode_prompt(prompt.data), cache, self._generator(prompt, seed), speed=clock)
        return VideoRollout(latents.cpu(), model.decode(latents), cache, clock.record() if clock else None)

    def baseline(self, model, prompt: Prompt, seed: int) -> VideoRollout:
        return replace(self.generate(model, prompt, CacheConfig(codec="none"), seed), cache=None)

    # the runner keeps baselines on disk for resumed runs: latents only (81 decoded 480x832 frames
    # are 388 MB); decoding is deterministic, so the frames are decoded again when first needed
    def save_baseline(self, baseline: VideoRollout, path: Path, key: str | None = None) -> None:
        super().save_baseline({"latents": baseline.latents}, path, key)

    def load_baseline(self, path: Path) -> VideoRollout:
        return VideoRollout(super().load_baseline(path)["latents"], None)

    def evaluate(self, model, prompt: Prompt, cache_config, seed: int, baseline: VideoRollout, out_dir: Path) -> dict:
        if baseline.frames is None:
            baseline.frames = model.decode(baseline.latents)
        r = self.generate(model, prompt, cache_config, seed, timed=True)
        row, curves = self.score(r, baseline)
        row.update(cache_row_stats(r.cache))
        row["speed"] = r.speed
        if self.unavailable:
            row["unavailable"] = dict(self.unavailable)
        label = artifact_label(cache_config)
        row["artifacts"] = self._write_artifacts(model, prompt, label, baseline, r, row, curves, Path(out_dir))
        return row

    # --- scoring -----------------------------------------------------------------------------
    def score(self, r: VideoRollout, base: VideoRollout) -> tuple[dict, dict]:
        """(row of per-prompt values, per-frame curves) of rollout ``r`` against ``base``."""
        per_frame = {"psnr": self.metric("psnr")(r.frames, base.frames),
                     "ssim": self.metric("ssim")(r.frames, base.frames),
                     "latent_cos": self.metric("latent_cos")(r.latents, base.latents)}
        if "lpips" not in self.unavailable:
            try:
                per_frame["lpips"] = self.metric("lpips")(r.frames, base.frames)
            except vm.MetricUnavailable as e:
                self.unavailable["lpips"] = str(e)
        row = {}
        for name, values in per_frame.items():
            agg = vm.summarize(values)
            row[name] = agg["mean"]
            row[f"{name}_min"], row[f"{name}_max"] = agg["min"], agg["max"]
        row["psnr"] = vm.psnr_video(r.frames, base.frames)  # from the whole video's MSE (see metrics.video)
        curves = {k: [vm.finite_or_none(float(x)) for x in v] for k, v in per_frame.items()}
        return row, curves

    # --- artifacts ---------------------------------------------------------------------------
    def _write_artifacts(self, model, prompt, label, base, r, row, curves, out_dir: Path) -> dict:
        rel = Path("video") / safe_name(prompt.id)  # ids come from the prompt file: one checked component
        d = inside(out_dir, rel)
        d.mkdir(parents=True, exist_ok=True)
        name = safe_name(_safe(label))
        drift = {"prompt": prompt.data, "label": label, "frames_per_block": model.spec.frames_per_block,
                 "latent_frames": int(r.latents.shape[2]), "pixel_frames": int(r.frames.shape[0]),
                 "note": "null = +inf (identical frame)", **curves}
        atomic_write(d / f"{name}.drift.json", json.dumps(drift, indent=1))
        arts = {"drift": str(rel / f"{name}.drift.json")}
        all_curves = {}
        for f in sorted(d.glob("*.drift.json")):
            c = read_json(f, dict, "a drift file")
            all_curves[field(c, "label", str, str(f))] = c
        write_drift_plot(d / "drift.png", all_curves, f"{prompt.id} | {model.spec.name} | per-frame vs uncompressed")
        arts["drift_plot"] = str(rel / "drift.png")
        if self.save_video:
            fps = model.spec.fps
            mp4 = "mp4" not in self.unavailable
            if mp4 and not is_regular(d / "baseline.mp4"):
                write_mp4(d / "baseline.mp4", base.frames, fps)
            if mp4:
                arts["mp4_baseline"] = str(rel / "baseline.mp4")
            if label == "none":  # identical to the baseline (the row's metrics say so): no copy
                return arts
            if mp4:
                write_mp4(d / f"{name}.mp4", r.frames, fps)
                arts["mp4"] = str(rel / f"{name}.mp4")
            psnr = row["psnr"]
            lp = f", LPIPS {row['lpips']:.3f}" if "lpips" in row else ""
            title = (f"{prompt.id} | {model.spec.name} | {label}: PSNR "
                     f"{'inf' if math.isinf(psnr) else f'{psnr:.2f}'} dB, SSIM {row['ssim']:.3f}{lp}")
            write_contact_sheet(d / f"{name}.sheet.png", [("baseline", base.frames), (label, r.frames)],
                                self.stills, title)
            arts["contact_sheet"] = str(rel / f"{name}.sheet.png")
        return arts
