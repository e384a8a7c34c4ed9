"""Baselines on disk without pickles: a task's baseline (nested dicts, lists, tuples, tensors,
plain values and the task's own dataclasses) is written as ONE safetensors file whose tensors are
the baseline's tensors and whose header metadata holds the rest as JSON.

Reading it back runs no code from the file: dataclasses are rebuilt only from the types the task
names (:attr:`harness.tasks.base.Task.baseline_types`). A file written by an older harness with
``torch.save`` is read with ``torch.load(weights_only=True)`` when it holds only tensors and plain
containers; otherwise it is refused (:class:`BaselineFormatError`), never unpickled.

The header also holds the key of the prompt content the baseline was made from
(:meth:`harness.tasks.base.Task.content_key`), which :func:`read_key` reads without the tensors.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import torch

FORMAT = "kvcodec-harness baseline 2"
#: format 1 held the format and the tree under two metadata keys, which safetensors writes in its hash map's
#: order, different in every process: format 2 holds both under one key, so a baseline's bytes are the same
#: every time it is written (read: both)
READS = ("kvcodec-harness baseline 1", FORMAT)
META_KEY = "kvcodec-harness baseline"


class BaselineFormatError(ValueError):
    """A stored baseline the harness will not read; the message names the file and the fix."""


def save_tree(obj: Any, path: str | Path, key: str | None = None) -> None:
    """Write ``obj`` to ``path`` (safetensors: tensors, plus the structure and ``key``, the content key of the
    prompt it was made from, as JSON metadata)."""
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}

    def enc(x):
        if isinstance(x, torch.Tensor):
            name = f"t{len(tensors)}"
            # a copy: safetensors refuses tensors that share storage (views of one rollout buffer)
            tensors[name] = x.detach().to("cpu", copy=True).contiguous()
            return {"$tensor": name, "device": str(x.device)}
        if x is None or isinstance(x, (bool, int, float, str)):
            return x
        if isinstance(x, list):
            return [enc(v) for v in x]
        if isinstance(x, tuple):
            return {"$tuple": [enc(v) for v in x]}
        if isinstance(x, dict):
            return {"$dict": [[enc(k), enc(v)] for k, v in x.items()]}
        if dataclasses.is_dataclass(x) and not isinstance(x, type):
            return {"$dataclass": type(x).__qualname__,
                    "fields": {f.name: enc(getattr(x, f.name)) for f in dataclasses.fields(x) if f.init}}
        raise TypeError(f"a baseline cannot hold a {type(x).__name__}: store tensors, numbers, strings, "
                        f"lists, tuples, dicts or dataclasses")

    meta = {"format": FORMAT, "tree": enc(obj)}
    if key is not None:  # a field the readers before it ignore
        meta["key"] = key
    save_file(tensors, str(path), metadata={META_KEY: json.dumps(meta)})


def read_key(path: str | Path) -> str | None:
    """The prompt content key ``path`` was stored with (header only; nothing unpickled); '' where it holds none (a
    format-1 file or a torch.save of an older harness, or a format-2 file written before keys were), None where
    it is no baseline :func:`load_tree` reads (loading it says why)."""
    import zipfile

    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
    except (SafetensorError, OSError):
        return "" if zipfile.is_zipfile(path) else None
    if meta.get("format") == READS[0]:
        return ""
    try:
        meta = json.loads(meta[META_KEY])
        return meta.get("key", "") if meta.get("format") == FORMAT else None
    except (KeyError, ValueError, AttributeError):
        return None


def load_tree(path: str | Path, types: tuple[type, ...] = ()) -> Any:
    """Read what :func:`save_tree` wrote; dataclasses only of ``types``."""
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    _check_file(path)
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except (SafetensorError, OSError) as e:
        return _legacy(path, e)
    damaged = f"baseline {path} is damaged or from another version ({{}}); delete it and it is computed again"
    want = READS[:1]  # format 1: two keys, the tree as text
    if META_KEY in meta:
        try:
            meta = json.loads(meta[META_KEY])
        except ValueError as e:
            raise BaselineFormatError(damaged.format(f"ValueError: {e}")) from None
        want = READS[1:]  # format 2: one key, the tree as JSON
    if not isinstance(meta, dict) or meta.get("format") not in want:
        meta = meta if isinstance(meta, dict) else {}
        raise BaselineFormatError(f"baseline {path} is not a harness baseline (format {meta.get('format')!r}); "
                                  f"delete it and it is computed again, or start over with --fresh")
    by_name = {t.__qualname__: t for t in types}

    def dec(x):
        if isinstance(x, list):
            return [dec(v) for v in x]
        if not isinstance(x, dict):
            return x
        if "$tensor" in x:
            t = tensors[x["$tensor"]]
            dev = torch.device(x.get("device", "cpu"))
            return t.to(dev) if dev.type == "cpu" or _available(dev) else t
        if "$tuple" in x:
            return tuple(dec(v) for v in x["$tuple"])
        if "$dict" in x:
            return {dec(k): dec(v) for k, v in x["$dict"]}
        if "$dataclass" in x:
            cls = by_name.get(x["$dataclass"])
            if cls is None:
                raise BaselineFormatError(f"baseline {path} holds a '{x['$dataclass']}', which this task does not "
                                          f"store; delete it and it is computed again")
            return cls(**{k: dec(v) for k, v in x["fields"].items()})
        raise BaselineFormatError(f"baseline {path} is damaged (unknown entry {sorted(x)[:3]}); delete it and it "
                                  f"is computed again")

    try:
        tree = meta["tree"]
        return dec(json.loads(tree) if meta["format"] == READS[0] else tree)  # format 1 holds it as text
    except BaselineFormatError:
        raise
    except (KeyError, TypeError, ValueError) as e:  # a damaged body, or a dataclass whose fields changed
        raise BaselineFormatError(damaged.format(f"{type(e).__name__}: {e}")) from None


def _check_file(path: Path) -> None:
    """A baseline is read only from a regular file of its own name (the runner writes each by a rename, so a
    link in its place was planted: a pipe would block the read, ``/dev/zero`` never end it) that fits in the
    memory it is read into."""
    import stat

    from harness.run.memory_check import free_bytes
    from harness.run.rows import NOT_A_BASELINE

    st = path.lstat()
    fix = "delete it and it is computed again, or start over with --fresh"
    if not stat.S_ISREG(st.st_mode):
        raise BaselineFormatError(NOT_A_BASELINE.format(path=path))
    free, _ = free_bytes("cpu", False)
    if free is not None and st.st_size > free:
        raise BaselineFormatError(f"baseline {path} holds {st.st_size / 2**30:.1f} GiB, more than this machine's "
                                  f"available memory ({free / 2**30:.1f} GiB): it is no baseline the harness wrote "
                                  f"here; {fix}")


def _available(dev: torch.device) -> bool:
    return dev.type == "cuda" and torch.cuda.is_available() and (dev.index or 0) < torch.cuda.device_count()


def _legacy(path: Path, why: Exception) -> Any:
    """A baseline from before safetensors: plain tensors and containers only (weights_only)."""
    import pickle
    import zipfile

    fix = "delete it and it is computed again, or start over with --fresh"
    if not zipfile.is_zipfile(path):
        raise BaselineFormatError(f"baseline {path} is neither a safetensors file nor a PyTorch file ({why}); {fix}")
    try:
        # a file object, not the path: torch.load dispatches a path ending in .safetensors to safetensors
        with open(path, "rb") as f:
            return torch.load(f, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError) as e:
        reason = "it pickles more than tensors" if isinstance(e, pickle.UnpicklingError) else "it is damaged"
        raise BaselineFormatError(f"baseline {path} is an old pickle baseline that is not read ({reason}; the "
                                  f"harness never runs code from a data file); {fix}") from None
