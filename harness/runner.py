"""The shared run loop: model x tasks x prompts x cache configurations -> rows, summary, report.

A run lives in one folder (``reports/<model>-<hash of the configuration>`` unless ``out`` says
otherwise):

- ``config.json``   the exact :class:`RunConfig` (JSON round trip; a resumed run must match it)
- ``model.json``    what was loaded (architecture, dtype, device) and the environment (packages,
                    device name, CUDA, git commit: :mod:`harness.environment`)
- ``rows.jsonl``    one line per (task, prompt, cache configuration, codec seed), appended and
                    fsync'ed as each finishes; a rerun skips the keys already there, so an
                    interrupted run resumes without losing or repeating a row
- ``baselines/``    each prompt's uncompressed rollout, computed once (with its batch) and reused
                    by every codec and codec seed and by a resumed run
- ``summary.json``  per task and cache configuration: n, mean, min, max and 95% interval of every
                    metric, its paired difference from the baseline, the ranking per bit width
                    and the rate-matched front (see :mod:`harness.summary`, :mod:`harness.stats`)
- ``report.md``     tables and plots (see :mod:`harness.report`); ``report.html`` the same as
                    one page with interactive plots and the rollouts' media side by side
- ``timings.jsonl`` wall seconds per batch and configuration (the only file that differs between
                    identical runs)

Rows and summary hold no timestamps, and floats are written with 7 significant digits, so the
same command gives byte-identical rows.jsonl and summary.json. The configuration is in
:mod:`harness.config`, row I/O in :mod:`harness.rows`, the summary in :mod:`harness.summary`.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Callable

from adapters.kv_cache import CacheConfig
from adapters.protocol import ModelAdapter

from .config import DEFAULT_TASKS, RunConfig, RunError, seeded
from .report import write_report
from .environment import environment, environment_diff
from .lock import LOCK_NAME, RunLock
from .rows import append_line, atomic_write, dumps, inside, read_rows, row_key, safe_name
from .summary import summarize


# --- the loop -----------------------------------------------------------------------------------
def resolve(config: RunConfig, log=print) -> tuple[RunConfig, object]:
    """Validate everything that needs no model and fill the model's default tasks: field values
    (``RunConfig.validate``: repeats dropped with a note), model, task, codec names, task and codec
    options, each codec against the bit widths. Returns (config, model spec)."""
    from adapters.registry import get_model
    from harness.tasks import get_task
    from kernels import codec_class

    for note in config.validate():
        log(note)
    spec = get_model(config.model)
    if not config.tasks:
        config.tasks = list(DEFAULT_TASKS.get(spec.modality, (spec.default_task,) if spec.default_task else ()))
        if not config.tasks:
            raise RunError(f"model '{config.model}' names no default task; pass --task")
    for t in config.tasks:
        cls = get_task(t)
        if cls.modality and cls.modality != spec.modality:
            raise RunError(f"task '{t}' is a {cls.modality} task; model '{config.model}' is a {spec.modality} model")
    unknown = set(config.task_options) - set(config.tasks)
    if unknown:
        raise RunError(f"options given for task(s) {sorted(unknown)} that this run does not have ({config.tasks})")
    config.task_options = {t: task_options(get_task(t), config.task_options.get(t, {})) for t in config.tasks}
    for c in config.codecs:
        codec_class(c)  # unknown codec -> "Unknown codec 'x'. Available: ..."
    if not config.bits:
        raise RunError("no bit widths given")
    # options for a codec the run does not have, or that its Options reject -> RunError; no codec
    # supporting any given bit width -> RunError (head-dim checks need the model: check_pairs again)
    check_pairs(config.cache_configs(), None)
    return config, spec


def task_options(cls, given: dict) -> dict:
    """Every option of a task that declares ``option_defaults``, given values parsed by type, so
    config.json names each value the run used (a task without declared options gets ``given``)."""
    from harness.tasks.base import parse_option

    defaults = getattr(cls, "option_defaults", {})
    if not defaults:
        return dict(given)
    bad = set(given) - set(defaults)
    if bad:
        raise RunError(f"unknown option(s) {sorted(bad)} for task '{cls.name}'. Available: {', '.join(defaults)}")
    out = {}
    for name, (default, _) in defaults.items():
        try:
            value = parse_option(given[name], default) if name in given else default
        except ValueError as e:
            raise RunError(f"task option {cls.name}.{name}={given[name]!r}: {e}") from None
        out[name] = list(value) if isinstance(value, tuple) else value
    return out


def check_pairs(cache_configs: list[CacheConfig], geometry: tuple[int, int, int] | None) -> tuple[list[CacheConfig], list[dict]]:
    """Split into (runnable, skipped with reasons) by building each codec once for the model's head dim."""
    from kernels import make_codec

    ok, skipped = [], []
    for cc in cache_configs:
        if cc.codec == "none":
            ok.append(cc)
            continue
        try:
            if geometry is not None:
                _, n_kv, head_dim = geometry
                make_codec(cc.codec_config(head_dim, n_kv))
            else:
                from kernels import codec_class

                if cc.bits not in codec_class(cc.codec).bits_supported:
                    raise ValueError(f"codec '{cc.codec}' does not support bits={cc.bits}; supported: "
                                     f"{list(codec_class(cc.codec).bits_supported)}")
            ok.append(cc)
        except (ValueError, TypeError) as e:
            skipped.append({"codec": cc.codec, "bits": cc.bits, "label": cc.label, "reason": str(e)})
    if not any(cc.codec != "none" for cc in ok) and skipped:
        reasons = "; ".join(f"{s['label']}: {s['reason']}" for s in skipped)
        raise RunError(f"no requested codec/bit width can run on this model: {reasons}")
    return ok, skipped


RUN_FILES = ("rows.jsonl", "summary.json", "report.md", "report.html", "plotly.min.js", "timings.jsonl", "model.json",
             "config.json")
RUN_DIRS = ("baselines", "video", "audio")


def check_out(out: Path) -> None:
    """``out`` is a folder, or can be created as one, and can be written."""
    if out.exists() and not out.is_dir():
        raise RunError(f"--out {out} is a file, not a folder; pass a folder path")
    parent = out
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise RunError(f"--out {out}: {parent} is a file, not a folder; pass another --out")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise RunError(f"--out {out}: {parent} is not writable; pass a folder you can write")


def _run_config(path: Path) -> dict | None:
    """The RunConfig JSON of a harness run folder's config.json; None where it is not one."""
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
        RunConfig.from_json(d)
    except (OSError, UnicodeDecodeError, ValueError, TypeError):
        return None
    return d if isinstance(d, dict) and "version" in d else None


def claim_out(config: RunConfig, out: Path, fresh: bool) -> None:
    """Under the lock, before anything is written: ``out`` must be empty or a harness run folder
    (by its config.json) of this configuration, or of any configuration with ``fresh``."""
    entries = sorted(p.name for p in out.iterdir() if p.name != LOCK_NAME)
    if not entries:
        return
    old = _run_config(out / "config.json")
    if old is None:
        shown = ", ".join(entries[:5]) + (", ..." if len(entries) > 5 else "")
        raise RunError(f"--out {out} holds files that are not a harness run ({shown}); pass a new or "
                       f"empty folder (--fresh only starts over a harness run folder)")
    try:  # a folder written before a field was added: that field takes its default
        old = json.loads(dumps(RunConfig.from_json(old).to_json()))
    except (TypeError, ValueError):
        pass  # an unreadable config is reported as differing below
    new = json.loads(dumps(config.to_json()))
    if old != new and not fresh:
        diff = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
        raise RunError(f"{out} holds a run with another configuration (differs in: {', '.join(diff)}); "
                       f"pass another --out, or --fresh to start it over")


def start_out(config: RunConfig, out: Path, fresh: bool) -> None:
    """Once the model has loaded: with ``fresh`` delete the run files of ``out`` (claimed by
    ``claim_out``), then write config.json."""
    if fresh:
        for name in RUN_FILES:
            (out / name).unlink(missing_ok=True)
        for name in RUN_DIRS:
            shutil.rmtree(out / name, ignore_errors=True)
        for f in [*out.glob("*.png"), *out.glob("*.tmp")]:
            f.unlink(missing_ok=True)
    atomic_write(out / "config.json", dumps(config.to_json(), indent=2) + "\n")


def run(config: RunConfig, out: Path | None = None, fresh: bool = False, model=None,
        on_row: Callable[[dict], None] | None = None, progress: bool = True, log=print) -> Path:
    """Run (or resume) ``config``; returns the run folder. ``model``: an already loaded model
    (tests); ``on_row(row)`` is called after each row is stored.

    Every argument is checked before the folder is touched or the model loads; the folder is
    locked (:class:`harness.lock.RunLock`) and claimed (``claim_out``); nothing in it changes
    until the model has loaded and passed its checks. A folder this call created is removed
    again if it fails before then."""
    config, spec = resolve(config, log)
    work = plan(config, log)
    out = Path(out) if out else config.default_out()
    check_out(out)
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RunError(f"--out {out}: cannot create it ({e.strerror}); pass another --out") from None
    with RunLock(out):
        started = False
        try:
            claim_out(config, out, fresh)
            model, cache_configs, skipped = _load(config, spec, model, log)
            start_out(config, out, fresh)
            started = True
        finally:
            if created and not started:  # ours, and still empty but for the lock: leave nothing behind
                shutil.rmtree(out, ignore_errors=True)
        _loop(config, out, model, cache_configs, skipped, work, on_row, progress, log)
    return out


def _load(config: RunConfig, spec, model, log) -> tuple[ModelAdapter, list[CacheConfig], list[dict]]:
    """The model (loaded unless given) and the cache configurations it can run, with the skipped."""
    if model is None:
        log(f"loading {config.model}" + (f" from {config.model_path}" if config.model_path else ""))
        model = spec.load(config.model_path, config.device, config.dtype)
    if not isinstance(model, ModelAdapter) or model.modality != spec.modality:
        raise RunError(f"model '{config.model}' must be a {spec.modality} adapters.protocol.ModelAdapter, "
                       f"got {type(model).__name__} ({getattr(model, 'modality', '?')})")
    cache_configs, skipped = check_pairs(config.cache_configs(), model.geometry)
    return model, cache_configs, skipped


def plan(config: RunConfig, log=print) -> list[tuple[str, object, list]]:
    """(task name, task, its prompts) per task: prompt sources are read before the model loads."""
    from harness.tasks import get_task

    out = []
    for name in config.tasks:
        task = get_task(name)(**config.task_options.get(name, {}))
        task.batch_size = config.batch_size
        out.append((name, task, unique_prompts(name, task.prompts(config.prompts, config.limit), log)))
    return out


def _loop(config: RunConfig, out: Path, model, cache_configs, skipped, work, on_row, progress: bool, log) -> None:
    from tqdm.auto import tqdm

    for s in skipped:
        log(f"skipping {s['label']}: {s['reason']}")
    # every cache configuration once per codec seed where its codec draws at random
    runs = [c for cc in cache_configs for c in seeded(cc, config.codec_seeds)]
    geometry = model.geometry
    # the exact codec config each row ran (every layer's codec is this one with its own layer index)
    codec_json = {(c.label, c.seed): {k: v for k, v in c.codec_config(geometry.head_dim, geometry.kv_heads)
                                      .to_json().items() if k != "layer"} for c in runs}
    env = environment(model.describe().get("device"))
    _note_other_environment(out / "model.json", env, log)
    atomic_write(out / "model.json", dumps({"model": model.describe(), "skipped": skipped, "environment": env},
                                           indent=2) + "\n")

    rows_path = out / "rows.jsonl"
    done = {row_key(r) for r in read_rows(rows_path, repair=True)}
    total = sum(len(p) for _, _, p in work) * len(runs)
    bar = tqdm(total=total, initial=len(done), desc="rows", disable=not progress, unit="row", dynamic_ncols=True)
    try:
        for name, task, prompts in work:
            for batch in task.batches(model, prompts):
                keys = [[(name, p.id, c.label, c.seed) for p in batch] for c in runs]
                todo = [(c, k) for c, k in zip(runs, keys) if any(key not in done for key in k)]
                if not todo:
                    continue
                shown = batch[0].id + (f" +{len(batch) - 1}" if len(batch) > 1 else "")
                bar.set_postfix_str(f"{name}/{shown} baseline")
                baselines = _baselines(task, name, model, batch, config.seed, out)
                for c, batch_keys in todo:
                    bar.set_postfix_str(f"{name}/{shown} {c.label} seed {c.seed}")
                    t0 = time.perf_counter()
                    results = task.evaluate_batch(model, batch, c, config.seed, baselines, out)
                    append_line(out / "timings.jsonl", json.dumps(
                        {"task": name, "prompts": [p.id for p in batch], "label": c.label, "codec_seed": c.seed,
                         "seconds": round(time.perf_counter() - t0, 3)}))
                    for prompt, key, result in zip(batch, batch_keys, results):
                        if key in done:  # a resumed batch: the rows already stored stay as they are
                            continue
                        row = {"task": name, "prompt": prompt.id, "codec": c.codec, "bits": c.bits,
                               "label": c.label, "codec_seed": c.seed}
                        row.update({k: result[k] for k in sorted(result) if k not in row})
                        if prompt.meta:
                            row.setdefault("prompt_meta", prompt.meta)
                        row["codec_config"] = codec_json[(c.label, c.seed)]
                        append_line(rows_path, dumps(row))
                        done.add(key)
                        bar.update(1)
                        if on_row is not None:
                            on_row(row)
    finally:
        bar.close()
    finish(out)


def _note_other_environment(path: Path, env: dict, log) -> None:
    """A resumed run whose stored rows came from another environment says which fields differ
    (model.json keeps the latest environment; the rows themselves are not recomputed)."""
    try:
        old = json.loads(path.read_text(encoding="utf-8")).get("environment")
    except (OSError, ValueError, AttributeError):
        return
    if isinstance(old, dict):
        diff = environment_diff(old, json.loads(dumps(env)))
        if diff:
            log(f"note: resuming rows made in another environment ({', '.join(diff)}); "
                f"model.json now records this one")


def unique_prompts(task: str, prompts: list, log=print) -> list:
    """``prompts`` with repeats (same id, same data) dropped with a note; one id naming two
    different prompts is an error (rows are keyed by the id)."""
    seen, files, out = {}, {}, []
    for p in prompts:
        other = files.setdefault(safe_name(p.id), p.id)
        if other != p.id:  # baselines and artifacts are named by safe_name(id)
            raise RunError(f"task '{task}': prompt ids '{other}' and '{p.id}' map to one file name "
                           f"'{safe_name(p.id)}'; give them ids that differ in letters, digits, '.', '_' or '-'")
        if p.id in seen:
            if dumps(seen[p.id].data) != dumps(p.data):
                raise RunError(f"task '{task}': prompt id '{p.id}' names two different prompts; "
                               f"give each prompt its own id")
            log(f"{task}: prompt '{p.id}' is repeated; it is run once")
            continue
        seen[p.id] = p
        out.append(p)
    return out


def _baselines(task, name: str, model, batch: list, seed: int, out: Path) -> list:
    """The uncompressed rollouts of a batch of prompts: read back where a run stored them all, else
    computed together (as the codecs' rollouts of this batch are) and stored, one file per prompt."""
    paths = [inside(out, "baselines", safe_name(name), f"{safe_name(p.id)}.pt") for p in batch]
    if all(p.exists() for p in paths):
        return [task.load_baseline(p) for p in paths]
    baselines = task.baseline_batch(model, batch, seed)
    paths[0].parent.mkdir(parents=True, exist_ok=True)
    for path, baseline in zip(paths, baselines):
        tmp = path.with_name(path.name + ".tmp")
        task.save_baseline(baseline, tmp)
        os.replace(tmp, path)
    return baselines


def finish(out: Path) -> None:
    """Write summary.json and report.md from the rows on disk."""
    out = Path(out)
    atomic_write(out / "summary.json", dumps(summarize(out), indent=2) + "\n")
    write_report(out)
