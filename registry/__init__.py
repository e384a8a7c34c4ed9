"""One registry for codecs, models, tasks and metrics, and the modalities they share.

A :class:`Registry` maps names to entries (a codec class, a model's spec, a task class, a metric).
The entries register themselves, by decorators in the modules of one package, which
:meth:`Registry.discover` imports once before the first lookup: a new entry is a new module,
never a line in a hand-kept list. A name registers once (the error names both definers); an
unknown name is an error that lists what exists, and the modules that could not be imported for a
missing optional dependency.

This package imports nothing of ours: ``kernels``, ``adapters``, ``harness`` and ``metrics`` all
use it, and it may depend on none of them.
"""
from __future__ import annotations

import importlib
import pkgutil
from typing import Generic, TypeVar

#: what a model generates and a task scores, each declared by its metrics module (``metrics/<modality>.py``
#: calls :func:`declare_modality` before it registers a metric), so a new modality is its three files (model,
#: task, metrics) and no list elsewhere. A task files its media under ``RUN/<its modality>/``
#: (harness.run.folder.run_dirs). :data:`NO_MODEL` is a codec measured alone on synthetic vectors (``harness
#: probe``): it has metrics, but no model has it.
MODALITIES: list[str] = []
NO_MODEL = "probe"

#: our own top-level packages: an ImportError that names one of them is a bug, never a missing
#: optional dependency
OURS = ("kernels", "adapters", "harness", "metrics", "registry")

T = TypeVar("T")


def declare_modality(name: str) -> str:
    """Add ``name`` to :data:`MODALITIES` (once): what a modality's metrics module does first."""
    if name not in MODALITIES:
        MODALITIES.append(name)
    return name


def definer(obj) -> str:
    """``module.QualName`` of a class or function: who registered an entry."""
    return f"{obj.__module__}.{obj.__qualname__}"


def import_modules(package: str, unavailable: dict[str, str], subpackages: bool = True, root: str = "") -> None:
    """Import every module of ``package`` not named ``_*``, and, where ``subpackages``, every module of
    its subpackages, recursively. A module that fails for a missing third-party package is recorded
    in ``unavailable`` (its name below ``package`` -> why) instead of breaking the others; one that
    fails on our own code raises."""
    root = root or package
    own = OURS + (package.split(".")[0],)
    for info in pkgutil.iter_modules(importlib.import_module(package).__path__):
        if info.name.startswith("_") or (info.ispkg and not subpackages):
            continue
        name = f"{package}.{info.name}"
        try:
            importlib.import_module(name)
        except ImportError as e:
            missing = getattr(e, "name", None) or ""
            if missing.split(".")[0] in own:
                raise
            unavailable[name.removeprefix(root + ".")] = f"needs '{missing or e}' ({e})"
            continue
        if info.ispkg:
            import_modules(name, unavailable, subpackages, root)


class Registry(Generic[T]):
    """Entries of one ``kind`` ('codec', 'model', ...) by name.

    ``packages``: the packages whose modules register the entries (none: registered by hand);
    ``subpackages``: whether discovery imports their subpackages' modules too. ``entries`` is a plain dict
    (what ``CODECS``, ``MODELS``, ``TASKS`` and ``METRICS`` are); ``unavailable`` maps the modules
    that could not be imported to why.
    """

    def __init__(self, kind: str, *packages: str, subpackages: bool = True):
        self.kind, self.packages, self.subpackages = kind, packages, subpackages
        self.entries: dict[str, T] = {}
        self.unavailable: dict[str, str] = {}
        self._by: dict[str, str] = {}  # name -> who registered it, for the duplicate error
        self._discovered = False

    def add(self, name: str, entry: T, by: str | None = None) -> T:
        """Register ``entry`` as ``name``; ``by`` names the definer (default: ``entry``'s own
        module and name). A second registration of ``name`` raises and changes nothing."""
        by = by or definer(entry)
        if name in self.entries:
            raise ValueError(f"{self.kind} '{name}' registered twice: by {self._by.get(name, '?')} and by {by}")
        self.entries[name] = entry
        self._by[name] = by
        return entry

    def discover(self) -> None:
        """Import the modules of ``packages``, once (see :func:`import_modules`)."""
        if not self.packages or self._discovered:
            return
        self._discovered = True  # first: a module being imported may look a name up
        try:
            for package in self.packages:
                import_modules(package, self.unavailable, self.subpackages)
        except BaseException:
            self._discovered = False  # a bug in a module: the next lookup raises it again
            raise

    def get(self, name: str) -> T:
        """The entry ``name``; an unknown name raises "Unknown <kind> 'x'. Available: a, b"."""
        self.discover()
        if name not in self.entries:
            extra = "".join(f"; '{m}' is unavailable: {why}" for m, why in sorted(self.unavailable.items()))
            raise ValueError(f"Unknown {self.kind} '{name}'. Available: "
                             f"{', '.join(sorted(self.entries)) or '(none)'}{extra}")
        return self.entries[name]

    def all(self) -> dict[str, T]:
        """Every entry, sorted by name."""
        self.discover()
        return dict(sorted(self.entries.items()))
