"""The versioned JSON of a configuration dataclass, written once: :class:`VersionedJSON`, a mixin whose class
keywords declare the form (what the file calls the configuration, its version, the order of its fields,
whether a file without a version is read as the current one). ``run config``, ``slurm config``, ``cache
config``, ``codec config`` and ``lut config`` all round-trip through it.

    @dataclass
    class RunConfig(VersionedJSON, what="run config", version=1, versionless=True):
        model: str = "smollm2-135m"
        bits: list[int] = field(default_factory=lambda: [2, 3])

    RunConfig().to_json()                 -> {"version": 1, "model": "smollm2-135m", "bits": [2, 3]}
    RunConfig.from_json({"model": "hf"})  -> RunConfig(model="hf", bits=[2, 3])  (no version: the current one)
    RunConfig.from_json({"version": 2})   -> ValueError: run config version 2 is not the supported 1
    RunConfig.from_json({"modle": "hf"})  -> ValueError: unknown RunConfig field(s) ['modle']; known: ['bits', 'model']

A field missing from a file (one written before the field existed) takes its default; one with no default is
a one-line error. The values are checked by the class itself, where it is made (its ``__post_init__``).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Self

from registry.options import jsonable


@dataclass(frozen=True)
class JSONForm:
    """How a configuration is written: ``what`` it is called in errors ('run config'); its ``version``, written
    first and checked on read; ``order``: its fields in the order written (empty: declaration order);
    ``versionless``: a file without a version is read as this version (files from before versions were
    written), else it is refused."""

    what: str
    version: int
    order: tuple[str, ...] = ()
    versionless: bool = False


class VersionedJSON:
    """A mixin of dataclasses: :meth:`to_json` and :meth:`from_json` in the form its class keywords declare
    (:class:`JSONForm`'s fields: ``class C(VersionedJSON, what=..., version=..., order=..., versionless=...)``)."""

    json_form: ClassVar[JSONForm]

    def __init_subclass__(cls, *, what: str | None = None, version: int | None = None, order: Sequence[str] = (),
                          versionless: bool = False, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if version is not None:  # a subclass without keywords keeps its base's form
            cls.json_form = JSONForm(what or cls.__name__, version, tuple(order), versionless)

    def json_fields(self) -> Sequence[str]:
        """The fields written, in order: the declared ``order``, else every field in declaration order (the
        hook for a configuration that writes only some)."""
        return self.json_form.order or [f.name for f in dataclasses.fields(self)]

    def to_json(self) -> dict:
        """``{"version": V, field: value, ...}``, each value as JSON holds it (tuples as lists, an ``Options``
        instance as every one of its options)."""
        return {"version": self.json_form.version, **{k: jsonable(getattr(self, k)) for k in self.json_fields()}}

    @classmethod
    def from_json(cls, data: Mapping) -> Self:
        """The configuration ``data`` holds (a dict from :meth:`to_json`, or read from a file): its version
        checked, unknown fields refused, missing ones at their defaults; ValueError in one line."""
        form = cls.json_form
        data = dict(data)
        version = data.pop("version", form.version if form.versionless else None)
        if type(version) is not int or version != form.version:  # True == 1, but it is no version
            raise ValueError(f"{form.what} version {version!r} is not the supported {form.version}")
        declared = [f for f in dataclasses.fields(cls) if f.init]
        known = sorted(f.name for f in declared)
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise ValueError(f"unknown {cls.__name__} field(s) {unknown}; known: {known}")
        missing = [f.name for f in declared if f.name not in data and f.default is dataclasses.MISSING
                   and f.default_factory is dataclasses.MISSING]
        if missing:
            raise ValueError(f"{form.what} lacks the field(s) {missing}, which have no default; known: {known}")
        return cls(**data)
