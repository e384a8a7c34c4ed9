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
same command gives byte-identical rows.jsonl and summary.json.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Callable

from adapters.kv_cache import DEFAULT_RESIDUAL, CacheConfig
from adapters.protocol import ModelAdapter

RUN_CONFIG_VERSION = 1
DEFAULT_MODEL = "smollm2-135m"
DEFAULT_CODECS = ("octopus", "turboquant-mse", "turboquant-prod", "qjl", "polarquant", "polarquant-2d", "quarot", "kivi")
DEFAULT_BITS = (2, 3, 4)
DEFAULT_TASKS = {"text": ("perplexity", "needle")}
REPORTS_DIR = Path("reports")
BASELINE_LABEL = "none"
ID_FIELDS = ("task", "prompt", "codec", "bits", "label")


@dataclass
class RunConfig:
    """Everything that decides a run's numbers; round-trips to JSON."""

    model: str = DEFAULT_MODEL
    model_path: str | None = None
    tasks: list[str] = field(default_factory=list)  # empty: the model modality's default tasks
    codecs: list[str] = field(default_factory=lambda: list(DEFAULT_CODECS))
    bits: list[int] = field(default_factory=lambda: list(DEFAULT_BITS))
    prompts: str | None = None  # a task's prompt source (None: the task's default)
    limit: int | None = None  # prompts per task
    seed: int = 0
    residual: int = DEFAULT_RESIDUAL
    protect: str | list[int] = "none"
    value_bits: int | None = None
    value_group: int = 32
    attend: str = "score"
    backend: str = "auto"
    device: str = "auto"
    dtype: str = "auto"
    task_options: dict[str, dict] = field(default_factory=dict)
    baseline: bool = True  # also run codec 'none' through the cache path (a row per prompt; KL must be 0)

    def to_json(self) -> dict:
        return {"version": RUN_CONFIG_VERSION, **asdict(self)}

    @classmethod
    def from_json(cls, d: dict) -> "RunConfig":
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known - {"version"}
        if unknown:
            raise ValueError(f"unknown RunConfig field(s) {sorted(unknown)}; known: {sorted(known)}")
        return cls(**{k: v for k, v in d.items() if k in known})

    def digest(self) -> str:
        return hashlib.sha256(dumps(self.to_json()).encode()).hexdigest()[:8]

    def default_out(self) -> Path:
        return REPORTS_DIR / f"{self.model}-{self.digest()}"

    def cache_configs(self) -> list[CacheConfig]:
        """The baseline ('none') first, then every (codec, bits) in the order given."""
        common = dict(residual=self.residual, protect=self.protect, value_bits=self.value_bits,
                      value_group=self.value_group, seed=self.seed, attend=self.attend, backend=self.backend)
        out = [CacheConfig(codec="none", bits=16, **common)] if self.baseline else []
        for codec in self.codecs:
            if codec == "none":
                continue
            out += [CacheConfig(codec=codec, bits=b, **common) for b in self.bits]
        return out


# --- deterministic JSON ------------------------------------------------------------------------
def _clean(x):
    """Floats to 7 significant digits; non-finite floats to strings (strict JSON); tensors to lists."""
    if isinstance(x, bool) or x is None or isinstance(x, (int, str)):
        return x
    if isinstance(x, float):
        if math.isnan(x):
            return "nan"
        if math.isinf(x):
            return "inf" if x > 0 else "-inf"
        return float(f"{x:.7g}")
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if hasattr(x, "tolist"):  # numpy / torch scalars and arrays
        return _clean(x.tolist())
    return str(x)


def dumps(obj, indent: int | None = None) -> str:
    return json.dumps(_clean(obj), indent=indent, sort_keys=indent is not None, ensure_ascii=False)


def num(x) -> float | None:
    """A row value as a float ('inf' strings included), None where it is not a number."""
    if isinstance(x, bool):
        return float(x)
    if isinstance(x, (int, float)):
        return float(x)
    if isinstance(x, str) and x in ("inf", "-inf", "nan"):
        return float(x)
    return None


# --- rows -----------------------------------------------------------------------------------------
def row_key(row: dict) -> tuple[str, str, str]:
    return row["task"], row["prompt"], row["label"]


def read_rows(path: Path, repair: bool = False) -> list[dict]:
    """Complete rows of ``path``; with ``repair`` a torn last line (a crash mid-write) is cut off."""
    if not path.exists():
        return []
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if repair and end != len(data):
        with open(path, "r+b") as f:
            f.truncate(end)
    return [json.loads(line) for line in data[:end].decode().splitlines() if line.strip()]


def append_line(path: Path, line: str) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def _safe_name(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", s)


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


# --- the loop -----------------------------------------------------------------------------------
class RunError(ValueError):
    pass


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
    _atomic_write(cfg_path, dumps(config.to_json(), indent=2) + "\n")
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
    _atomic_write(out / "model.json", dumps({"model": model.describe(), "skipped": skipped}, indent=2) + "\n")

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
    path = out / "baselines" / _safe_name(name) / f"{_safe_name(prompt.id)}.pt"
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
    from harness.report import write_report

    out = Path(out)
    _atomic_write(out / "summary.json", dumps(summarize(out), indent=2) + "\n")
    write_report(out)


# --- summary ------------------------------------------------------------------------------------
RATE_FIELDS = ("bits_per_coord", "value_bits_per_coord", "cache_bits_per_coord", "cache_bytes", "uncompressed_bytes")


def _direction(metric: str) -> bool | None:
    from metrics import list_metrics

    m = list_metrics().get(metric)
    return None if m is None else m.higher_is_better


def _task_metrics(task_name: str, rows: list[dict]) -> list[str]:
    try:
        from harness.tasks import get_task

        names = list(get_task(task_name).metrics)
    except ValueError:
        names = []
    if not names:  # a task we cannot import here: every numeric column that is not a rate or id
        skip = set(RATE_FIELDS) | set(ID_FIELDS)
        names = sorted({k for r in rows for k, v in r.items() if k not in skip and num(v) is not None})
    return names


def _stats(values: list[float]) -> dict:
    finite = [v for v in values if not math.isnan(v)]
    if not finite:
        return {"mean": float("nan"), "min": float("nan"), "max": float("nan")}
    return {"mean": sum(finite) / len(finite), "min": min(finite), "max": max(finite)}


def summarize(out: Path) -> dict:
    out = Path(out)
    config = json.loads((out / "config.json").read_text())
    model = json.loads((out / "model.json").read_text()) if (out / "model.json").exists() else {}
    rows = read_rows(out / "rows.jsonl")
    summary = {"version": 1, "model": config.get("model"), "skipped": model.get("skipped", []), "tasks": {}}
    for task in dict.fromkeys(r["task"] for r in rows):
        trows = [r for r in rows if r["task"] == task]
        metric_names = _task_metrics(task, trows)
        base = {r["prompt"]: r for r in trows if r["label"] == BASELINE_LABEL}
        groups = []
        for label in dict.fromkeys(r["label"] for r in trows):
            grows = [r for r in trows if r["label"] == label]
            g = {"label": label, "codec": grows[0]["codec"], "bits": grows[0]["bits"], "n": len(grows)}
            for f in RATE_FIELDS:
                vals = [num(r.get(f)) for r in grows if num(r.get(f)) is not None]
                if vals:
                    g[f] = sum(vals) / len(vals)
            g["metrics"] = {}
            for m in metric_names:
                vals = [num(r.get(m)) for r in grows]
                vals = [v for v in vals if v is not None]
                if not vals:
                    continue
                s = _stats(vals)
                deltas = [num(r.get(m)) - num(base[r["prompt"]].get(m)) for r in grows
                          if r["prompt"] in base and num(r.get(m)) is not None and num(base[r["prompt"]].get(m)) is not None]
                deltas = [d for d in deltas if not math.isnan(d)]
                s["delta"] = sum(deltas) / len(deltas) if deltas else None
                g["metrics"][m] = s
            groups.append(g)
        summary["tasks"][task] = {
            "metrics": [{"name": m, "higher_is_better": _direction(m)} for m in metric_names],
            "prompts": list(dict.fromkeys(r["prompt"] for r in trows)),
            "groups": groups,
        }
    return summary
