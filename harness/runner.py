"""The shared run loop: model x tasks x prompts x cache configurations -> rows, summary, report.

A run lives in one folder (``reports/<model>-<hash of the configuration>`` unless ``out`` says
otherwise):

- ``config.json``   the exact :class:`RunConfig` (JSON round trip; a resumed run must match it)
- ``model.json``    what was loaded (architecture, dtype, device)
- ``rows.jsonl``    one line per (task, prompt, cache configuration), appended and fsync'ed as
                    each finishes; a rerun skips the keys already there, so an interrupted run
                    resumes without losing or repeating a row
- ``baselines/``    each prompt's uncompressed rollout, computed once and reused by every codec
                    and by a resumed run
- ``summary.json``  per task and cache configuration: mean / min / max of every metric and its
                    mean difference from the baseline on the same prompts
- ``report.md``     tables and plots (see :mod:`harness.report`)
- ``timings.jsonl`` wall seconds per row (the only file that differs between identical runs)

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

from .config import DEFAULT_TASKS, RunConfig, RunError
from .report import write_report
from .rows import ID_FIELDS, append_line, atomic_write, dumps, read_rows, row_key, safe_name
from .summary import summarize


# --- the loop -----------------------------------------------------------------------------------
def resolve(config: RunConfig) -> tuple[RunConfig, object]:
    """Fill the model's default tasks; check model, codecs and tasks exist. Returns (config, model spec)."""
    from adapters.registry import get_model
    from harness.tasks import get_task
    from kernels import codec_class

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
    config.cache_configs()  # options for a codec the run does not have -> RunError
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


def prepare_out(config: RunConfig, out: Path | None, fresh: bool) -> Path:
    out = Path(out) if out else config.default_out()
    cfg_path = out / "config.json"
    if fresh and out.exists():
        for name in ("rows.jsonl", "summary.json", "report.md", "timings.jsonl", "model.json", "config.json"):
            (out / name).unlink(missing_ok=True)
        shutil.rmtree(out / "baselines", ignore_errors=True)
    if cfg_path.exists():
        old = json.loads(cfg_path.read_text())
        new = json.loads(dumps(config.to_json()))
        if old != new:
            diff = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
            raise RunError(f"{out} holds a run with another configuration (differs in: {', '.join(diff)}); "
                           f"pass another --out, or --fresh to start it over")
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(cfg_path, dumps(config.to_json(), indent=2) + "\n")
    return out


def run(config: RunConfig, out: Path | None = None, fresh: bool = False, model=None,
        on_row: Callable[[dict], None] | None = None, progress: bool = True, log=print) -> Path:
    """Run (or resume) ``config``; returns the run folder. ``model``: an already loaded model
    (tests); ``on_row(row)`` is called after each row is stored."""
    from harness.tasks import get_task
    from tqdm.auto import tqdm

    config, spec = resolve(config)
    out = prepare_out(config, out, fresh)
    if model is None:
        log(f"loading {config.model}" + (f" from {config.model_path}" if config.model_path else ""))
        model = spec.load(config.model_path, config.device, config.dtype)
    if not isinstance(model, ModelAdapter) or model.modality != spec.modality:
        raise RunError(f"model '{config.model}' must be a {spec.modality} adapters.protocol.ModelAdapter, "
                       f"got {type(model).__name__} ({getattr(model, 'modality', '?')})")
    cache_configs, skipped = check_pairs(config.cache_configs(), model.geometry)
    for s in skipped:
        log(f"skipping {s['label']}: {s['reason']}")
    # the exact codec config each row ran (every layer's codec is this one with its own layer index)
    codec_json = {cc.label: {k: v for k, v in cc.codec_config(model.geometry.head_dim, model.geometry.kv_heads)
                             .to_json().items() if k != "layer"} for cc in cache_configs}
    atomic_write(out / "model.json", dumps({"model": model.describe(), "skipped": skipped}, indent=2) + "\n")

    rows_path = out / "rows.jsonl"
    done = {row_key(r) for r in read_rows(rows_path, repair=True)}
    tasks = [(name, get_task(name)(**config.task_options.get(name, {}))) for name in config.tasks]
    plan = []
    for name, task in tasks:
        prompts = task.prompts(config.prompts, config.limit)
        ids = [p.id for p in prompts]
        if len(set(ids)) != len(ids):
            raise RunError(f"task '{name}' produced duplicate prompt ids: rows are keyed by them")
        plan.append((name, task, prompts))
    total = sum(len(p) for _, _, p in plan) * len(cache_configs)
    bar = tqdm(total=total, initial=len(done), desc="rows", disable=not progress, unit="row", dynamic_ncols=True)
    try:
        for name, task, prompts in plan:
            for prompt in prompts:
                todo = [cc for cc in cache_configs if (name, prompt.id, cc.label) not in done]
                if not todo:
                    continue
                bar.set_postfix_str(f"{name}/{prompt.id} baseline")
                baseline = _baseline(task, name, model, prompt, config.seed, out)
                for cc in todo:
                    bar.set_postfix_str(f"{name}/{prompt.id} {cc.label}")
                    t0 = time.perf_counter()
                    result = task.evaluate(model, prompt, cc, config.seed, baseline, out)
                    row = {"task": name, "prompt": prompt.id, "codec": cc.codec, "bits": cc.bits, "label": cc.label}
                    row.update({k: result[k] for k in sorted(result) if k not in ID_FIELDS})
                    if prompt.meta:
                        row.setdefault("prompt_meta", prompt.meta)
                    row["codec_config"] = codec_json[cc.label]
                    append_line(rows_path, dumps(row))
                    append_line(out / "timings.jsonl", json.dumps(
                        {"task": name, "prompt": prompt.id, "label": cc.label,
                         "seconds": round(time.perf_counter() - t0, 3)}))
                    done.add(row_key(row))
                    bar.update(1)
                    if on_row is not None:
                        on_row(row)
    finally:
        bar.close()
    finish(out)
    return out


def _baseline(task, name: str, model, prompt, seed: int, out: Path):
    path = out / "baselines" / safe_name(name) / f"{safe_name(prompt.id)}.pt"
    if path.exists():
        return task.load_baseline(path)
    baseline = task.baseline(model, prompt, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    task.save_baseline(baseline, tmp)
    os.replace(tmp, path)
    return baseline


def finish(out: Path) -> None:
    """Write summary.json and report.md from the rows on disk."""
    out = Path(out)
    atomic_write(out / "summary.json", dumps(summarize(out), indent=2) + "\n")
    write_report(out)
