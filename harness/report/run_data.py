"""A run folder read once (:func:`read_run`), for the summary and the reports: config.json, model.json,
rows.jsonl, speed.jsonl and registry.json, what the registries declared for the run when it was made.

registry.json (deterministic JSON, :func:`harness.run.rows.dumps` with indent 2)::

    {"version": 1,
     "metrics": {name: {"display", "higher_is_better", "scale", "description"}},
     "tasks": {task: {"metrics": [name, ...] (report order), "headline": name | null (null: the first metric),
                      "score_metric": name | null, "breakdown": [prompt_meta key, ...],
                      "media": {kind: {role: artifact key}}} | null (a task this checkout does not know)},
     "codecs": {codec: {"engine_preset": bool, "engine": its engine's name | null (not a preset; absent in
                        older folders), "native_layers": [layer, ...] (kept native by its engine)}}}

The runner writes it before the first row (:func:`write_registry`), so a run's summary and reports do not
change when a registry does. A run folder made before registry.json has none: :func:`read_run` builds it
from the registries as they are now (:func:`declared`). Outside the runner, that is the only place the
summary and the reports consult a registry.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from harness.report.formatting import plot_file
from harness.run.config import RunConfig
from harness.run.folder import RunFolder
from harness.run.input_files import InputError, field, read_run_json, read_text
from harness.run.lines import read_speed
from harness.run.rows import atomic_write, dumps, read_rows

REGISTRY_VERSION = 1


@dataclass(frozen=True)
class RunData:
    """One run folder as the summary and the renderers take it."""
    path: Path
    config: dict  # config.json
    model: dict  # model.json ({} where absent)
    rows: list[dict]  # rows.jsonl
    speed: list[dict]  # speed.jsonl's lines (and its shard files'), one per row key: harness.run.lines.read_speed
    speed_problem: str | None  # why speed.jsonl could not be read (None: it could, or there is none)
    registry: dict  # registry.json

    @property
    def name(self) -> str:
        return self.path.name


def read_run(out: Path, rows: list[dict] | None = None) -> RunData:
    """Run folder ``out``; ``rows``: its rows where the caller holds them already (a merge that just wrote
    them to rows.jsonl), else rows.jsonl's."""
    folder = RunFolder(out)
    config = read_run_json(folder.config)
    try:  # a folder of an older version: its missing fields at their defaults; of a newer one: refused
        config = RunConfig.from_json(config).to_json()
    except (ValueError, TypeError) as e:
        raise InputError(f"{folder.config}: {e}: the folder was made by another version of the harness; read it "
                         f"with that version (or run it again with --fresh)") from None
    model = read_run_json(folder.model, {})
    try:  # what the reports and compare read of it
        for key in ("model", "environment"):
            field(model, key, dict, str(folder.model), default=None)
    except InputError as e:
        raise InputError(f"{e}; the harness writes this file: restore it, or run again with --fresh") from None
    rows = read_rows(folder.rows) if rows is None else rows
    speed, problem = read_speed(out)
    registry = read_run_json(folder.registry, None)
    if registry is None:  # a run made before registry.json: the registries as they are now
        registry = declared(config, model, rows)
    else:
        check_registry(registry, folder.registry)
    return RunData(folder.path, config, model, rows, speed, problem, registry)


#: registry.json's entries as :func:`declared` writes them: {field: its kind (None: may be null)}
_SHAPES = {"metrics": {"display": str, "higher_is_better": (bool, None), "scale": str, "description": str},
           "tasks": {"metrics": list, "headline": (str, None), "score_metric": (str, None), "breakdown": list,
                     "media": dict},
           "codecs": {"engine_preset": bool, "engine": (str, None), "native_layers": list}}


def check_registry(registry: dict, path: Path) -> None:
    """registry.json (``registry``, read from ``path``) of the version and shape :func:`declared` writes; an
    :class:`InputError` naming the first entry that is not (a task entry may be null: a task unknown here)."""
    fix = "delete it to rebuild it from the registries"
    if registry.get("version") != REGISTRY_VERSION:
        raise InputError(f"{path}: version {registry.get('version')!r}, this harness reads version "
                         f"{REGISTRY_VERSION}; {fix}")
    for section, shape in _SHAPES.items():
        entries = registry.get(section)
        try:
            if not isinstance(entries, dict):
                raise InputError(f"'{section}' must be a JSON object, found {json.dumps(entries)[:40]}")
            for name, entry in entries.items():
                if entry is None and section == "tasks":
                    continue
                if not isinstance(entry, dict):
                    raise InputError(f"{section} '{name}' must be a JSON object, found {json.dumps(entry)[:40]}")
                for key, kind in shape.items():
                    nullable = isinstance(kind, tuple) and None in kind
                    kinds = tuple(k for k in kind if k is not None) if isinstance(kind, tuple) else kind
                    field(entry, key, kinds, f"{section} '{name}'", **({"default": None} if nullable else {}))
        except InputError as e:
            raise InputError(f"{path}: {e}; {fix}") from None


def write_registry(out: Path, config: dict, model: dict) -> None:
    """registry.json of run folder ``out`` (``config``: config.json's; ``model``: model.json's)."""
    atomic_write(RunFolder(out).registry, dumps(declared(config, model), indent=2) + "\n")


# --- what the registries declare ------------------------------------------------------------------
def describe_metric(name: str) -> dict:
    """{display, higher_is_better, scale, description} of metric ``name`` from the metrics registry; a
    name it does not know is shown as is, with no direction."""
    from metrics import list_metrics

    m = list_metrics().get(name)
    if m is None:
        return {"display": name, "higher_is_better": None, "scale": "linear", "description": ""}
    return {"display": m.display, "higher_is_better": m.higher_is_better, "scale": m.scale,
            "description": m.description}


def describe_task(cls) -> dict:
    """What the summary and the reports need of :class:`harness.tasks.base.Task` subclass ``cls``."""
    return {"metrics": list(cls.metrics), "headline": cls.headline, "score_metric": cls.score_metric,
            "breakdown": list(cls.breakdown), "media": {k: dict(v) for k, v in cls.media.items()}}


def declared(config: dict, model: dict, rows: list[dict] = ()) -> dict:
    """registry.json's content for a run of ``config`` on ``model`` (model.json's content). ``rows``: an
    older run's, whose tasks may be ones this checkout does not know: the summary then takes every numeric
    column of their rows as a metric, so each column the metrics registry knows is described here."""
    from kernels import CODECS, codec_options
    from metrics import list_metrics

    from harness.tasks import get_task

    tasks = {}
    for name in dict.fromkeys([*config.get("tasks", []), *(r["task"] for r in rows)]):
        try:
            tasks[name] = describe_task(get_task(name))
        except ValueError:  # not in this checkout (an older run)
            tasks[name] = None
    named = [m for t in tasks.values() if t for m in t["metrics"]]
    known = list_metrics()
    named += sorted({k for r in rows for k in r if k in known})
    codecs, layers = {}, (model.get("model") or {}).get("layers")
    for n in dict.fromkeys(str(c).partition("@")[0] for c in config.get("codecs", [])):
        if n not in CODECS:
            continue
        native = ()
        if isinstance(layers, int):
            options = codec_options(n, config.get("codec_options", {}).get(n, {}), strings=True)
            native = CODECS[n].engine_skipped_layers(layers, options)
        preset = bool(CODECS[n].engine_preset)
        codecs[n] = {"engine_preset": preset, "engine": CODECS[n].engine if preset else None,
                     "native_layers": sorted(native)}
    return {"version": REGISTRY_VERSION, "metrics": {m: describe_metric(m) for m in dict.fromkeys(named)},
            "tasks": tasks, "codecs": codecs}


def plot_names(out: Path | None = None) -> set[str]:
    """Every name a report's plot can have (``<task>_<metric>.png``, :mod:`harness.report.markdown`), over
    the registered tasks and metrics and the metrics ``out``'s summary.json names (a task's own): the PNG
    files of a run folder that are the harness's (``--fresh`` removes them)."""
    from metrics import list_metrics

    from harness.tasks import list_tasks

    pairs = {(t, m) for t in list_tasks() for m in list_metrics()}
    try:
        tasks = json.loads(read_text(RunFolder(out).summary, "summary.json"))["tasks"] if out else {}
        pairs |= {(t, m["name"]) for t, v in tasks.items() for m in v["metrics"]}
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError):
        pass  # no summary, or not ours: the registered names only
    return {plot_file(str(t), str(m)) for t, m in pairs}
