"""A run folder's ``baselines/``: each prompt's uncompressed rollout, one safetensors file per prompt
(``baselines/<task>/<prompt id>.safetensors``), computed once and reused by every codec, codec seed and
resumed run.

Each file holds its prompt's content key (:meth:`harness.tasks.base.Task.content_key`). The run folder's
configuration names the prompts' source, not their content: a prompt file or clip edited between two
runs keeps its id, so a resumed run would score the new prompt against the old baseline (and its rows
beside the rows stored for the old prompt). :func:`check_stored` refuses that, before the model loads.
"""
from __future__ import annotations

import os
from pathlib import Path

from harness.run.config import RunError
from harness.run.folder import RunFolder
from harness.run.rows import inside, safe_name, write_via


def _paths(out: Path, name: str, batch: list) -> tuple[list[Path], list[Path]]:
    """(where each prompt's baseline is written, where it is read: the same, or the ``.pt`` of a run folder
    from before the files were named ``.safetensors``, which holds the same format or an older torch.save)."""
    stem = [inside(out, RunFolder.BASELINES, safe_name(name), safe_name(p.id)) for p in batch]
    paths = [s.with_name(s.name + ".safetensors") for s in stem]
    return paths, [p if p.exists() else s.with_name(s.name + ".pt") for p, s in zip(paths, stem)]


def check_stored(out: Path, work: list[tuple[str, object, list]], log=print) -> None:
    """Before the model loads (the folder claimed for this configuration): RunError where a stored baseline
    of a prompt of ``work`` ((task name, task, prompts) per task) was made from other content than the
    prompt has now. A baseline stored before keys were is used unchecked, with a note; one that is not a
    readable baseline is left to the loading, which names the fix."""
    unkeyed = 0
    for name, task, prompts in work:
        for p, path in zip(prompts, _paths(out, name, prompts)[1]):
            key = task.stored_key(path) if path.is_file() else None
            if key == "":
                unkeyed += 1
            elif key is not None and key != task.content_key(p):
                raise RunError(f"{out}: prompt '{p.id}' of task '{name}' has changed since its baseline was stored "
                               f"({path.relative_to(out)}; the stored rows score the old prompt): put the old prompt "
                               f"back, or start over with --fresh (or pass another --out)")
    if unkeyed:
        log(f"note: {unkeyed} stored baseline(s) of {out} were made by an older harness, which kept no key of "
            f"their prompts' content: they are used without that check (--fresh makes them again)")


def stored_baselines(task, name: str, model, batch: list, seed: int, out: Path) -> list:
    """The uncompressed rollouts of a batch of prompts: read back where a run stored them all (checked
    by :func:`check_stored`), else computed together (as the codecs' rollouts of this batch are) and
    stored, each with its prompt's content key."""
    paths, stored = _paths(out, name, batch)
    if all(p.exists() for p in stored):
        return [task.load_baseline(p) for p in stored]
    baselines = task.baseline_batch(model, batch, seed)
    paths[0].parent.mkdir(parents=True, exist_ok=True)
    for path, prompt, baseline in zip(paths, batch, baselines):
        write_via(path, lambda p, b=baseline, k=task.content_key(prompt): task.save_baseline(b, p, k),
                  path.with_name(f"{path.name}.{os.getpid()}.tmp"))
    return baselines
