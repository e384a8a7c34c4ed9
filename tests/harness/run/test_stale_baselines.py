"""Issue #41, case 4: a resumed run whose prompt's content changed under the same id (a video prompt file's text, an
audio clip's samples) reused the baseline stored for the old content (rc 0; PSNR 17 against 59 on a clean run).
Each baseline now holds its prompt's content key (harness/run/baselines.py): such a resume is refused with one
line before the model loads and writes nothing; the unchanged resume still ends with the clean run's bytes."""
from __future__ import annotations

import dataclasses
import functools
import json

import numpy as np
import pytest
import soundfile as sf
from helpers.bad_input import one_line
from helpers.run_folder import run_bytes

from harness.cli.main import main
from harness.run.config import RunConfig, RunError
from harness.run.folder import RunFolder
from harness.runner import run
from harness.scale.shard import Shard
from harness.tasks.audio import AudioTask
from harness.tasks.video import VideoTask

FOX, WHALE = "a red fox running through deep snow at dawn", "a blue whale diving under an iceberg at dusk"


def _video_model():
    from adapters.wan import CAUSVID, build_random, tiny_spec

    return build_random(tiny_spec(CAUSVID, num_frames=6), seed=3)  # causvid-tiny's layers, 2 blocks of frames


def _audio_model():
    from adapters.registry import get_model

    return get_model("aar-tiny").load(None, "cpu", "auto")


def _write_video_prompt(d, text):
    (d / "p.json").write_text(json.dumps([{"id": "p1", "prompt": text}]))


def _write_clip(d, tone):
    t = np.arange(48_000) / 48_000
    y = 0.4 * np.sin(2 * np.pi * 440 * t) if tone else np.random.default_rng(0).standard_normal(48_000) * 0.3
    sf.write(d / "clips" / "c1.wav", y.astype(np.float32), 48_000)


# modality -> (model, its argv, writes the prompt's first (True) or other (False) content, the changed prompt's id)
CASES = {
    "video": ("causvid-tiny", _video_model, ["--prompts", "{d}/p.json", "--task-opt", "video.lpips=false",
                                            "--task-opt", "video.save_video=false"],
              lambda d, first: _write_video_prompt(d, FOX if first else WHALE), "p1"),
    "audio": ("aar-tiny", _audio_model, ["--prompts", "{d}/clips", "--task-opt", "audio.clip_seconds=1",
                                        "--task-opt", "audio.top_k=8", "--task-opt", "audio.save_audio=false"],
              lambda d, first: _write_clip(d, first), "c1"),
}


def _loads(monkeypatch, name, model):
    """Model ``name`` loads as ``model``; None: any load fails the test (the refusal must come first)."""
    from adapters.registry import MODELS, get_model

    spec = get_model(name)

    def load(*a, **k):
        if model is None:
            raise AssertionError("a model loaded")
        return model

    monkeypatch.setitem(MODELS, name, dataclasses.replace(spec, load=functools.wraps(spec.load)(load)))


def _folder(out):
    """Every file of the run folder and its bytes (the lock aside: who holds it, not what the run wrote)."""
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and not p.name.startswith(RunFolder.LOCK)}


def _made(out):
    """What a run makes of its inputs: :func:`_folder` less what is measured (speed and timings; the reports'
    speed sections)."""
    names = [n for n in _folder(out) if n not in (f"{RunFolder.SPEED}.jsonl", f"{RunFolder.TIMINGS}.jsonl")]
    return run_bytes(out, names)


@pytest.mark.parametrize("modality", sorted(CASES))
def test_a_resume_after_the_prompt_changed_is_refused_and_the_unchanged_one_resumes(modality, tmp_path, capsys,
                                                                                   monkeypatch):
    monkeypatch.delenv("HARNESS_DEBUG", raising=False)
    name, make_model, argv, write_prompt, pid = CASES[modality]
    (tmp_path / "clips").mkdir()
    write_prompt(tmp_path, True)
    out = tmp_path / "run"
    command = ["run", "--model", name, "--task", modality, "--codec", "octopus", "--bits", "2", "--codec-seeds", "0",
               "--device", "cpu", *[a.format(d=tmp_path) for a in argv], "--out", str(out), "--quiet"]
    model = make_model()
    _loads(monkeypatch, name, model)
    assert main(command) == 0
    clean = _made(out)
    rows = (out / "rows.jsonl").read_text().splitlines(keepends=True)
    assert [json.loads(r)["label"] for r in rows] == ["none", "octopus@2"]
    (out / "rows.jsonl").write_text(rows[0])  # a resume with a row to compute

    write_prompt(tmp_path, False)  # the same id, other content
    kept = _folder(out)
    _loads(monkeypatch, name, None)
    line = one_line(capsys, command)
    assert line == (f"harness run: error: {out}: prompt '{pid}' of task '{modality}' has changed since its baseline "
                    f"was stored (baselines/{modality}/{pid}.safetensors; the stored rows score the old prompt): put "
                    f"the old prompt back, or start over with --fresh (or pass another --out)")
    config = RunConfig.from_json(json.loads((out / "config.json").read_text()))
    with pytest.raises(RunError, match="has changed since its baseline was stored"):  # a shard: the same check
        run(config, out=out, shard=Shard(0, 2), progress=False, log=lambda *_: None)
    assert _folder(out) == kept  # nothing written

    write_prompt(tmp_path, True)  # put back: the resume computes the missing row, to the clean run's bytes
    _loads(monkeypatch, name, model)
    assert main(command) == 0
    assert _made(out) == clean


def test_a_baseline_keys_its_prompts_content_not_its_id(tmp_path):
    """An automatic video id keeps the first 40 characters of the text and a clip's id its file's stem: the key
    tells apart what the id does not; the same content gives the same key."""
    task = VideoTask()
    for i, tail in enumerate(("slowly", "quickly", "slowly")):
        (tmp_path / f"{i}.txt").write_text(f"{FOX}, {tail}\n")
    a, b, c = (task.prompts(str(tmp_path / f"{i}.txt"))[0] for i in range(3))
    assert a.id == b.id == c.id and task.content_key(a) == task.content_key(c) != task.content_key(b)

    audio = AudioTask()
    (tmp_path / "clips").mkdir()
    keys = []
    for tone in (True, False, True):
        _write_clip(tmp_path, tone)
        keys.append(audio.content_key(audio.prompts(str(tmp_path / "clips"))[0]))
    assert keys[0] == keys[2] != keys[1]
    synthetic = audio.prompts("synthetic")
    assert len({audio.content_key(p) for p in synthetic}) == len(synthetic) == 3


def test_each_kind_of_stored_baseline_is_checked_noted_or_left_to_the_loading(tmp_path):
    """check_stored over one prompt's stored file: of its content (nothing said), of other content (refused), of
    an older harness that stored no key (a format-2 file without one, format 1, a torch.save .pt: used with a
    note), no baseline at all (left to the loading, which names the fix)."""
    import torch
    from safetensors.torch import save_file

    from harness.run.baselines import check_stored
    from harness.tasks.baseline_io import READS, read_key, save_tree

    task = VideoTask()
    _write_video_prompt(tmp_path, FOX)
    work = [("video", task, task.prompts(str(tmp_path / "p.json")))]
    key = task.content_key(work[0][2][0])
    out = tmp_path / "run"
    (out / "baselines" / "video").mkdir(parents=True)
    stored = out / "baselines" / "video" / "p1.safetensors"
    latents = {"latents": torch.ones(2)}
    kinds = {
        "this prompt's": (lambda: save_tree(latents, stored, key), key),
        "another prompt's": (lambda: save_tree(latents, stored, "0" * 64), "0" * 64),
        "keyless format 2": (lambda: save_tree(latents, stored), ""),
        "format 1": (lambda: save_file({"t0": torch.ones(2)}, str(stored), metadata={"format": READS[0], "tree": "{}"}),
                     ""),
        "torch.save": (lambda: torch.save(latents, stored), ""),
        "junk": (lambda: stored.write_bytes(b"junk"), None),
    }
    for kind, (write, want) in kinds.items():
        write()
        notes = []
        assert read_key(stored) == want, kind
        if kind == "another prompt's":
            with pytest.raises(RunError, match=r"prompt 'p1' of task 'video' has changed since its baseline"):
                check_stored(out, work, notes.append)
        else:
            check_stored(out, work, notes.append)
        older = [f"note: 1 stored baseline(s) of {out} were made by an older harness, which kept no key of their "
                 f"prompts' content: they are used without that check (--fresh makes them again)"]
        assert notes == (older if want == "" else []), kind
