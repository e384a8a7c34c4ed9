"""The shared run loop: model x tasks x prompts x cache configurations -> rows, summary, report.

A run lives in one folder (``reports/<model>-<hash of the configuration>`` unless ``out`` says
otherwise):

- ``config.json``   the exact :class:`RunConfig` (JSON round trip; a resumed run must match it)
- ``model.json``    what was loaded (architecture, dtype, device) and the environment (packages,
                    device name, CUDA, git commit: :mod:`harness.run.environment`)
- ``registry.json`` what the registries declare of the run's tasks, metrics and codecs, for the
                    summary and reports (:mod:`harness.report.run_data`)
- ``rows.jsonl``    one line per (task, prompt, cache configuration, codec seed), appended and
                    fsync'ed as each finishes; a rerun skips the keys already there, so an
                    interrupted run resumes without losing or repeating a row
- ``baselines/``    each prompt's uncompressed rollout, computed once (with its batch) and reused
                    by every codec and codec seed and by a resumed run, which refuses one made from
                    another content of its prompt (:mod:`harness.run.baselines`)
- ``summary.json``  per task and cache configuration: n, mean, min, max and 95% interval of every
                    metric, its paired difference from the baseline, the ranking per bit width
                    and the rate-matched front (see :mod:`harness.report.summary`, :mod:`harness.stats.intervals`)
- ``report.md``     tables and plots (see :mod:`harness.report.markdown`); ``report.html`` the same as
                    one page with interactive plots and the rollouts' media side by side
- ``speed.jsonl``   per row, its rollout's prefill seconds, decode rate and peak device memory
                    (:mod:`harness.report.speed`); measured, so it differs between identical runs
- ``timings.jsonl`` wall seconds per batch and configuration (measured, as speed.jsonl is)
- ``plan.json``     the batches and cache configurations in the order one process runs them

A run may be split over processes (``shard``; :mod:`harness.scale.shard`): shard I of N runs its share of
the batches and appends to ``rows.shard-I-of-N.jsonl``, ``speed.shard-I-of-N.jsonl`` and
``timings.shard-I-of-N.jsonl``; the last
to end merges the rows into rows.jsonl in plan order (:mod:`harness.scale.merge`), byte-identical to one
process's.

Rows and summary hold no timestamps, and floats are written with 7 significant digits, so the
same command gives byte-identical rows.jsonl and summary.json. The configuration is in
:mod:`harness.run.config`, row I/O in :mod:`harness.run.rows`, the summary in :mod:`harness.report.summary`.
"""
from __future__ import annotations

import inspect
import json
import shutil
import time
from pathlib import Path
from typing import Callable

from adapters.cache.config import CacheConfig
from adapters.protocol import ModelAdapter

from harness.report.build import finish
from harness.report.run_data import plot_names, write_registry
from harness.run.baselines import check_stored, stored_baselines
from harness.run.checks import check_limits, check_modality, check_pairs
from harness.run.claim import claim_out, make_out, refuse_live_shards, start_out, write_config
from harness.run.config import RunConfig, RunError, seeded
from harness.run.environment import environment, environment_diff
from harness.run.folder import RunFolder
from harness.run.lines import speed_line, stored_rows
from harness.run.lock import RunLock, RunLocked, describe
from harness.run.memory_check import run_memory
from harness.run.plan import Plan, adopt_plan, write_plan
from harness.run.rows import append_line, atomic_write, cut_torn_line, dumps, row_key, safe_name
from harness.run.safe_text import printable
from harness.scale.merge import MERGE_WAIT_S, complete
from harness.scale.shard import Shard
from harness.tasks import get_task, task_options
from harness.run.input_files import read_text
from metrics import modalities


# --- the loop -----------------------------------------------------------------------------------
def resolve(config: RunConfig, log=print) -> tuple[RunConfig, object]:
    """Validate everything that needs no model and fill the model's default tasks: field values
    (``RunConfig.validate``: repeats dropped with a note), model, task, codec names, task and codec
    options, each codec's bit widths. Returns (config, model spec)."""
    from adapters.registry import get_model

    for note in config.validate():
        log(note)
    spec = get_model(config.model)
    check_modality(spec)
    if config.device_map and "device_map" not in inspect.signature(spec.load).parameters:
        raise RunError(f"--device-map {config.device_map}: model '{config.model}' ({spec.modality}) loads on one "
                       f"device; leave --device-map out")
    if not config.tasks:
        config.tasks = [spec.default_task] if spec.default_task else []  # the model's own
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
    # unknown codec -> "Unknown codec 'x'. Available: ..."; NAME@B at a width it lacks -> RunError; a note for
    # each bare name that runs at other widths than --bits
    config.codec_entries(log)
    if not config.bits:
        raise RunError("no bit widths given")
    config.cache_configs()  # options for a codec the run does not have, or that its Options reject -> RunError
    return config, spec


def check_declared(config: RunConfig, spec) -> None:
    """Before the weights load: the run's options against the shape the model declares (``spec.declared``: its
    config file, GGUF header or architecture; a path its loader would refuse is refused here): protected layers
    and task contexts against its layers and positions, and every codec against its heads and head dim (RunError
    where none can run or an option given cannot; the skipped are logged once the model has loaded)."""
    shape = spec.declared(config.model_path) if spec.declared is not None else None
    if shape is None:  # a model that declares nothing (a Hub name): the loaded model is checked
        return
    check_limits(config, _options(config), shape.layers, shape.positions, shape.source)
    if shape.geometry is not None:
        check_pairs(config, shape.geometry, shape.source)


def run(config: RunConfig, out: Path | None = None, fresh: bool = False, model=None,
        on_row: Callable[[dict], None] | None = None, progress: bool = True, log=print,
        shard: Shard | None = None) -> Path:
    """Run (or resume) ``config``; returns the run folder. ``model``: an already loaded model
    (tests); ``on_row(row)`` is called after each row is stored; ``shard``: run only that shard's
    batches (:mod:`harness.scale.shard`; None or a count of 1: the whole run in this process).

    Every argument is checked before the folder is touched or the model loads; the folder is
    locked (:class:`harness.run.lock.RunLock`) and claimed (``claim_out``); nothing in it changes
    until the model has loaded and passed its checks (a shard writes config.json as it claims the
    folder, so that shards of another configuration cannot start beside it). A folder this call
    created is removed again if it fails before then (not by a shard: others may be using it)."""
    config, spec = resolve(config, log)
    work = plan(config, log)
    if model is None:  # the shape it declares, before its weights load
        check_declared(config, spec)
    planned = run_memory(config, spec.modality, work, model, log)  # before the folder is touched
    out = Path(out) if out else config.default_out()
    if shard is not None and shard.count == 1:
        shard = None
    if shard is not None:
        if fresh:
            raise RunError(f"--fresh with {shard.source} would discard the other shards' rows: start over "
                           f"with `harness launch ... -- ... --fresh`, or once with `harness run --fresh` without shards")
        return _run_shard(config, spec, work, out, model, on_row, progress, log, shard, planned)
    created = make_out(out)
    with RunLock(out, wait=MERGE_WAIT_S):
        started = False
        try:
            refuse_live_shards(out)
            claim_out(config, out, fresh)
            if not fresh:  # --fresh deletes the stored baselines
                check_stored(out, work, log)
            model, cache_configs, skipped = _load(config, spec, model, log, work, planned)
            start_out(config, out, fresh, plot_names(out), modalities())
            started = True
        finally:
            if created and not started:  # ours, and still empty but for the lock: leave nothing behind
                shutil.rmtree(out, ignore_errors=True)
        _loop(config, out, model, cache_configs, skipped, work, on_row, progress, log, None)
        finish(out)
    return out


def _run_shard(config, spec, work, out: Path, model, on_row, progress, log, shard: Shard, planned) -> Path:
    """``run`` for one shard: claim the folder under its lock for a moment, hold the shard's own
    lock while it runs, then merge if every planned row is stored (the last shard to end does)."""
    make_out(out)
    lock = RunLock(out, shard.lock_name, role="shard")
    with RunLock(out, role="start", wait=MERGE_WAIT_S):
        refuse_live_shards(out, allowed_count=shard.count)
        claim_out(config, out, fresh=False)
        check_stored(out, work, log)
        who = lock.try_acquire()
        if who is not None:
            raise RunLocked(f"{shard} of {out} is already running ({describe(who)}); wait for it, or run "
                            f"another shard (lock {lock.path})")
        try:  # claimed: shards of another configuration now find this one's config.json
            write_config(config, out)
        except BaseException:
            lock.release()
            raise
    try:
        log(f"{shard}" + (f" (from {shard.source})" if shard.source != "--shard" else ""))
        model, cache_configs, skipped = _load(config, spec, model, log, work, planned)
        _loop(config, out, model, cache_configs, skipped, work, on_row, progress, log, shard)
    finally:
        lock.release()
    with RunLock(out, role="merge", wait=MERGE_WAIT_S):
        if complete(out):  # the last shard to end merges; `harness report` shows a run still going
            finish(out)
            return out
    log(f"{shard} is done; the last shard to end merges the rows and writes the report (harness report "
        f"{out} shows the run so far)")
    return out


def _options(config: RunConfig) -> dict[str, type]:
    """Each of the run's tasks' ``Options`` class."""
    return {t: get_task(t).Options for t in config.tasks}


def _load(config: RunConfig, spec, model, log, work=(), planned=...
          ) -> tuple[ModelAdapter, list[CacheConfig], list[dict]]:
    """The model (loaded unless given) and the cache configurations it can run, with the skipped; a text
    model prefills in the chunk its memory plan came to (planned now where it could not be before)."""
    if model is None:
        log(f"loading {config.model}" + (f" from {config.model_path}" if config.model_path else ""))
        placed = {"device_map": config.device_map} if config.device_map else {}
        if "graphs" in inspect.signature(spec.load).parameters:  # the models with graphed decode steps
            placed["graphs"] = config.graphs
        model = spec.load(config.model_path, config.device, config.dtype, **placed)
    if not isinstance(model, ModelAdapter) or model.modality != spec.modality:
        raise RunError(f"model '{config.model}' must be a {spec.modality} adapters.protocol.ModelAdapter, "
                       f"got {type(model).__name__} ({getattr(model, 'modality', '?')})")
    from adapters.hf.models import max_positions

    check_limits(config, _options(config), model.geometry.layers, max_positions(model), f"model '{config.model}'")
    if planned is ... and spec.modality == "text":
        planned = run_memory(config, spec.modality, work, model, log)
    if hasattr(model, "prefill_chunk") and planned is not ...:
        model.prefill_chunk = planned
    cache_configs, skipped = check_pairs(config, model.geometry, f"model '{config.model}'")
    return model, cache_configs, skipped


def plan(config: RunConfig, log=print) -> list[tuple[str, object, list]]:
    """(task name, task, its prompts) per task: prompt sources are read before the model loads."""
    out = []
    for name in config.tasks:
        task = get_task(name)(**config.task_options.get(name, {}))
        task.batch_size = config.batch_size
        prompts = unique_prompts(name, task.prompts(config.prompts, config.limit), log)
        if not prompts:
            source = config.prompts or "its default prompts"
            raise RunError(f"task '{name}': no prompts in {source}; pass a --prompts source that holds some")
        out.append((name, task, prompts))
    return out


def _loop(config: RunConfig, out: Path, model, cache_configs, skipped, work, on_row, progress: bool, log,
          shard: Shard | None) -> None:
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
    folder = RunFolder(out)
    _note_other_environment(folder.model, env, log)
    described = {"model": model.describe(), "skipped": skipped, "environment": env}
    atomic_write(folder.model, dumps(described, indent=2) + "\n")
    write_registry(out, config.to_json(), described)  # what the reports need of the registries, as they are now
    # the batches one process runs, in its order; a shard runs those the plan assigns it
    batched = [(name, task, task.batches(model, prompts)) for name, task, prompts in work]
    the_plan = adopt_plan(out, Plan([(name, [[p.id for p in b] for b in batches]) for name, _, batches in batched],
                                    [(c.label, c.seed) for c in runs]), log)
    by_id = {name: {p.id: p for p in prompts} for name, _, prompts in work}
    batched = [(name, task, [[by_id[name][i] for i in b] for b in batches])
               for (name, task, _), (_, batches) in zip(batched, the_plan.tasks)]
    write_plan(out, the_plan, log)
    for name, _, batches in batched if shard else ():
        if len(batches) < shard.count < sum(map(len, batches)):
            log(f"note: {name} runs as {len(batches)} batch(es) for {shard.count} shards, so some shards have none "
                f"of it; a smaller batch option (e.g. --task-opt {name}.batch=1) spreads it (rows then differ by "
                f"float rounding: it is another run)")
    mine = batched if shard is None else [
        (name, task, [b for b, o in zip(batches, owner) if o == shard.index])
        for (name, task, batches), owner in zip(batched, the_plan.owners(shard.count))]

    tag = shard.tag if shard else None
    rows_path, timings_path, speed_path = (folder.lines(stem, tag) for stem in (folder.ROWS, folder.TIMINGS, folder.SPEED))
    cut_torn_line(speed_path)  # before this process appends; a damaged speed file never stops a run
    device = env.get("device_name") or env.get("device")
    done = {row_key(r) for r in stored_rows(out, repair=rows_path)}
    planned = [(name, p.id, c.label, c.seed) for name, _, batches in mine for b in batches for c in runs for p in b]
    bar = tqdm(total=len(planned), initial=sum(k in done for k in planned), desc=str(shard or "rows"),
               disable=not progress, unit="row", dynamic_ncols=True)
    try:
        for name, task, batches in mine:
            for batch in batches:
                keys = [[(name, p.id, c.label, c.seed) for p in batch] for c in runs]
                todo = [(c, k) for c, k in zip(runs, keys) if any(key not in done for key in k)]
                if not todo:
                    continue
                shown = printable(batch[0].id) + (f" +{len(batch) - 1}" if len(batch) > 1 else "")
                bar.set_postfix_str(f"{name}/{shown} baseline")
                baselines = stored_baselines(task, name, model, batch, config.seed, out)
                for c, batch_keys in todo:
                    bar.set_postfix_str(f"{name}/{shown} {c.label} seed {c.seed}")
                    t0 = time.perf_counter()
                    results = task.evaluate_batch(model, batch, c, config.seed, baselines, out)
                    append_line(timings_path, json.dumps(
                        {"task": name, "prompts": [p.id for p in batch], "label": c.label, "codec_seed": c.seed,
                         "seconds": round(time.perf_counter() - t0, 3)}))
                    rollouts: dict[int, str] = {}  # a speed record's id -> the first prompt of its rollout
                    for prompt, key, result in zip(batch, batch_keys, results):
                        speed = result.get("speed")  # one record per rollout, shared by the rows it scored
                        rollout = rollouts.setdefault(id(speed), prompt.id)
                        if key in done:  # a resumed batch: the rows already stored stay as they are
                            continue
                        row = {"task": name, "prompt": prompt.id, "codec": c.codec, "bits": c.bits,
                               "label": c.label, "codec_seed": c.seed}
                        row.update({k: result[k] for k in sorted(result) if k not in row and k != "speed"})
                        if prompt.meta:
                            row.setdefault("prompt_meta", prompt.meta)
                        row["codec_config"] = codec_json[(c.label, c.seed)]
                        append_line(rows_path, dumps(row))
                        if speed is not None:  # after its row: a crash between them loses a line, never repeats one
                            append_line(speed_path, speed_line(key, rollout, speed, device))
                        done.add(key)
                        bar.update(1)
                        if on_row is not None:
                            on_row(row)
    finally:
        bar.close()


def _note_other_environment(path: Path, env: dict, log) -> None:
    """A resumed run whose stored rows came from another environment says which fields differ
    (model.json keeps the latest environment; the rows themselves are not recomputed)."""
    try:
        old = json.loads(read_text(path, "model.json")).get("environment")
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
