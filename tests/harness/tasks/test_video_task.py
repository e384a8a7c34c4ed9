"""The video task end to end on a tiny random causal Wan: rows, artifacts, the 'none' identity."""
from __future__ import annotations

import json

import numpy as np
import pytest
from helpers.rate_refs import key_bytes
from scipy.ndimage import correlate1d
from skimage.metrics import peak_signal_noise_ratio
from helpers.tolerances import U64, digits_abs, digits_rel, gamma, sum_rel

from adapters.wan import CAUSVID, build_random, tiny_spec
from harness.tasks.base import Prompt
from harness.tasks.video import VideoTask, mp4_status, still_indices


def ssim_by_definition(x: np.ndarray, y: np.ndarray) -> float:
    """SSIM of two frames [C, H, W] in [-1, 1], float64, as metrics.video documents it (torchmetrics' form):
    an 11-tap Gaussian window (sigma 1.5), frames padded by reflection (without repeating the edge: scipy's
    'mirror'), K = 0.01, 0.03 and range 2, the map averaged over every pixel and channel (no border cropped)."""
    taps = np.exp(-(np.arange(11) - 5.0) ** 2 / (2 * 1.5 ** 2))
    taps /= taps.sum()

    def window(a):
        return correlate1d(correlate1d(a, taps, axis=-1, mode="mirror"), taps, axis=-2, mode="mirror")

    c1, c2 = (0.01 * 2) ** 2, (0.03 * 2) ** 2
    mx, my = window(x), window(y)
    vx, vy, vxy = window(x * x) - mx ** 2, window(y * y) - my ** 2, window(x * y) - mx * my
    return float((((2 * mx * my + c1) * (2 * vxy + c2)) / ((mx ** 2 + my ** 2 + c1) * (vx + vy + c2))).mean())


@pytest.fixture(scope="module")
def model():
    return build_random(tiny_spec(CAUSVID, num_frames=6), seed=3)  # 2 blocks -> 21 pixel frames


def test_prompts(tmp_path):
    task = VideoTask()
    ps = task.prompts()
    assert len(ps) >= 10 and len({p.id for p in ps}) == len(ps) and all(isinstance(p.data, str) for p in ps)
    assert [p.id for p in task.prompts(limit=2)] == [p.id for p in ps[:2]]
    (tmp_path / "p.txt").write_text("a cat\n\nA dog, running!\n")
    assert [p.id for p in task.prompts(str(tmp_path / "p.txt"))] == ["000_a_cat", "001_a_dog_running"]
    (tmp_path / "dup.json").write_text(json.dumps([{"id": "x", "prompt": "a"}, {"id": "x", "prompt": "b"}]))
    with pytest.raises(ValueError, match="appears twice"):
        task.prompts(str(tmp_path / "dup.json"))


def test_still_indices():
    assert still_indices(81, 6) == [0, 16, 32, 48, 64, 80]
    assert still_indices(5, 10) == [0, 1, 2, 3, 4]


def test_run_through_the_runner_and_resume(model, tmp_path):
    """harness run --model causvid-tiny --task video --codec octopus --bits 2 --limit 1, then a resume."""
    from harness.run.rows import read_rows
    from harness.run.config import RunConfig
    from harness.runner import run

    cfg = RunConfig(model="causvid-tiny", tasks=["video"], codecs=["octopus"], bits=[2], limit=1, codec_seeds=[0],
                    task_options={"video": {"stills": "4"}})
    out = run(cfg, out=tmp_path / "run", model=model, progress=False, log=lambda *a: None)
    rows = {r["label"]: r for r in read_rows(out / "rows.jsonl")}
    assert set(rows) == {"none", "octopus@2"}
    none, row2 = rows["none"], rows["octopus@2"]
    # codec 'none' reproduces the baseline bit for bit
    assert none["psnr"] == "inf" and none["ssim"] == 1.0 and none["latent_cos"] == 1.0
    if "lpips" in none:
        assert none["lpips"] == 0.0
    else:
        assert "LPIPS unavailable" in none["unavailable"]["lpips"]
    assert none["cache_bytes"] == none["uncompressed_bytes"] and none["bits_per_coord"] == 32.0
    # the codec changed the video, from the second block on. Reference: both rollouts again (same prompt, seed and
    # cache configs as the run), scored here (rows keep 7 significant digits: digits_rel(7)): scikit-image's PSNR
    # (data range 2: frames in [-1, 1]) of the whole video and of each frame; SSIM by its definition; the latent
    # cosine per latent frame; all in float64
    task = VideoTask(stills="4")
    prompt = task.prompts(limit=1)[0]
    base_cc, codec_cc = cfg.cache_configs()
    ref_r, got_r = (task.generate(model, prompt, cc, cfg.seed) for cc in (base_cc, codec_cc))
    ref, got = ref_r.frames.double().numpy(), got_r.frames.double().numpy()
    # PSNR: float64 MSEs of the same frames summed in other orders (sum_rel of the terms, relative), which a PSNR
    # above 10 / ln 10 dB carries over to its dB no larger; then stored
    psnr = peak_signal_noise_ratio(ref, got, data_range=2.0)
    assert psnr > 10 / np.log(10) and row2["psnr"] == pytest.approx(psnr, rel=digits_rel(7) + sum_rel(ref.size, U64))
    changed = [peak_signal_noise_ratio(r, g, data_range=2.0) for r, g in zip(ref, got) if not np.array_equal(r, g)]
    assert len(changed) == 21 - 9  # block 0 (pixel frames 0-8) reads an empty cache: identical
    assert row2["psnr_min"] == pytest.approx(min(changed), rel=digits_rel(7) + sum_rel(ref[0].size, U64))
    assert row2["psnr_max"] == "inf"
    # SSIM: the task computes it in float32 on a CPU, 11x11 window sums of values <= 1 (gamma(121) each); in SSIM's
    # ratios those errors of two nearly equal frames mostly cancel (no clean bound; 6e-10 measured): allowed
    # gamma(121), on 1 - SSIM ~2e-4 here; then the 7 stored digits
    ssim = [1.0 if np.array_equal(r, g) else ssim_by_definition(g, r) for r, g in zip(ref, got)]
    assert 1 - np.mean(ssim) > 10 * gamma(121)  # the codec moved SSIM far beyond what is allowed below
    for stored, want in ((row2["ssim"], np.mean(ssim)), (row2["ssim_min"], min(ssim))):
        assert stored == pytest.approx(want, rel=0, abs=gamma(121) + digits_abs(want, 7))
    assert row2["ssim_max"] == 1.0
    # the latent cosine: float64 dot products and norms of 768 terms on both sides (sum_rel each, three of them,
    # relative to |cos| <= 1), then stored; against 1 - cos ~3e-5 here
    lat = [x.latents.double().transpose(0, 2).flatten(1).numpy() for x in (ref_r, got_r)]  # [F, B*C*h*w]
    cos = (lat[0] * lat[1]).sum(1) / (np.linalg.norm(lat[0], axis=1) * np.linalg.norm(lat[1], axis=1))
    for stored, want in ((row2["latent_cos"], cos.mean()), (row2["latent_cos_min"], cos.min())):
        tol = digits_abs(want, 7) + 3 * sum_rel(lat[0].shape[1], U64)
        assert 1 - want > 100 * tol and stored == pytest.approx(want, rel=0, abs=tol)
    d = model.geometry.head_dim  # OCTOPUS's documented bytes per key vector (tests/helpers/rate_refs.py)
    assert row2["cache_bytes"] < row2["uncompressed_bytes"]
    assert row2["bits_per_coord"] == 8 * key_bytes("octopus", 2, d) / d
    arts = row2["artifacts"]
    mp4, _ = mp4_status()  # imageio-ffmpeg may be missing (a GPU image): then no MP4, and the rest
    for key in ("mp4", "mp4_baseline")[:2 * mp4] + ("contact_sheet", "drift", "drift_plot"):
        assert (out / arts[key]).is_file() and (out / arts[key]).stat().st_size > 0, key
    assert mp4 or "mp4" not in arts
    assert "mp4" not in none["artifacts"]  # 'none' is the baseline: no copy
    drift = json.loads((out / arts["drift"]).read_text())
    assert len(drift["psnr"]) == 21 and len(drift["latent_cos"]) == 6
    assert drift["psnr"][:9] == [None] * 9  # block 0 (latent frames 0-2 -> pixel frames 0-8) is identical
    assert all(isinstance(x, float) for x in drift["psnr"][9:])
    if mp4:
        import imageio.v2 as iio
        video = iio.mimread(str(out / arts["mp4"]))
        assert len(video) == 21 and video[0].shape == (48, 64, 3)
    assert "## video" in (out / "report.md").read_text()
    # each rollout timed: block 0 (into the empty cache) the prefill, block 1's 3 latent frames the decode
    speed = {s["label"]: s for s in read_rows(out / "speed.jsonl")}
    assert set(speed) == {"none", "octopus@2"}
    for s in speed.values():
        assert s["decode_unit"] == "latent frame" and s["decode_units"] == 3 and s["sequences"] == 1
        # both stored to 7 digits (e = digits_rel(7) each: a quotient by 2e / (1 - e)), one float64 quotient here
        e = digits_rel(7)
        assert s["prefill_s"] > 0 and s["decode_per_s"] == pytest.approx(3 / s["decode_s"], rel=2 * e / (1 - e) + U64)

    # resume: drop the codec's row; the rerun reads the stored baseline (latents only, decoded
    # again) and writes the same bytes
    lines = (out / "rows.jsonl").read_text().splitlines(keepends=True)
    (out / "rows.jsonl").write_text("".join(l for l in lines if '"octopus@2"' not in l))
    run(cfg, out=out, model=model, progress=False, log=lambda *a: None)
    assert sorted((out / "rows.jsonl").read_text().splitlines()) == sorted(l.rstrip("\n") for l in lines)


def test_rejects_a_text_model():
    with pytest.raises(TypeError, match="video model"):
        VideoTask().baseline(object(), Prompt("x", "y"), 0)


def _listing(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_hostile_prompt_ids_stay_inside_the_run_folder(model, tmp_path):
    """Prompt ids go into artifact paths: absolute ids, '../' and NUL/slashes must not leave --out."""
    from harness.run.config import RunConfig
    from harness.run.rows import read_rows
    from harness.runner import run

    outside = tmp_path / "outside"
    outside.mkdir()
    ids = [str(outside / "abs"), "../../x", "a\x00b/../../c", ".."]
    prompts = tmp_path / "p.json"
    prompts.write_text(json.dumps([{"id": i, "prompt": f"a cat {n}"} for n, i in enumerate(ids)]))
    before = _listing(tmp_path)
    cfg = RunConfig(model="causvid-tiny", tasks=["video"], codecs=["octopus"], bits=[2], prompts=str(prompts), codec_seeds=[0],
                    baseline=False, task_options={"video": {"save_video": "false", "lpips": "false"}})
    out = run(cfg, out=tmp_path / "a" / "run", model=model, progress=False, log=lambda *a: None)
    after = _listing(tmp_path)
    assert [p for p in after if p not in before and not p.startswith("a/run")] == ["a"]
    assert _listing(outside) == []
    rows = read_rows(out / "rows.jsonl")
    assert [r["prompt"] for r in rows] == ids  # rows keep the ids as given; only paths are sanitised
    for r in rows:
        for rel in r["artifacts"].values():
            assert (out / rel).resolve().is_relative_to((out / "video").resolve()) and (out / rel).is_file()


def test_each_codec_seed_files_its_own_artifacts(model, tmp_path):
    """Two codec seeds of one codec are two rollouts: their drift curves and contact sheets are two
    files, each row naming its own (a label-only name would let the second overwrite the first)."""
    from harness.run.config import RunConfig
    from harness.run.rows import read_rows
    from harness.runner import run

    cfg = RunConfig(model="causvid-tiny", tasks=["video"], codecs=["octopus"], bits=[2], limit=1, codec_seeds=[0, 1],
                    baseline=False, task_options={"video": {"save_video": "false", "lpips": "false"}})
    out = run(cfg, out=tmp_path / "run", model=model, progress=False, log=lambda *a: None)
    rows = {r["codec_seed"]: r for r in read_rows(out / "rows.jsonl")}
    assert set(rows) == {0, 1}
    arts = [rows[s]["artifacts"] for s in (0, 1)]
    assert set(arts[0]) == set(arts[1]) and arts[0]
    for key in arts[0]:
        if arts[0][key] == arts[1][key]:  # shared files: the baseline's, and the plot of every config's drift
            assert "baseline" in arts[0][key] or key == "drift_plot", key
            continue
        a, b = (out / arts[0][key]).read_bytes(), (out / arts[1][key]).read_bytes()
        assert a != b, key  # each seed's rollout, not one file twice
