"""What every model adapter exposes to the harness: :class:`ModelAdapter` and its :class:`CachePolicy`.

A loader registered with ``@register_model`` returns a :class:`ModelAdapter`: the runner reads
its ``geometry`` (to check codecs), its ``describe()`` (model.json, the report's header) and
its ``modality``; the tasks of that modality drive the rest. Where the native window of the
cache is counted, and how large it is, is the model's :class:`CachePolicy`, applied to the
run's :class:`~adapters.cache.config.CacheConfig` in one place, :meth:`ModelAdapter.cache_config`.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, replace
from typing import NamedTuple

from registry import NO_MODEL

from adapters.cache.config import CacheConfig

WINDOW_UNITS = ("token", "append")


class Geometry(NamedTuple):
    """The cached self-attention: every layer holds keys/values ``[B, kv_heads, T, head_dim]``."""

    layers: int
    kv_heads: int
    head_dim: int


class DeclaredShape(NamedTuple):
    """What a model declares of its shape before its weights load (its config file, a GGUF header, its
    architecture's constants); None for what it does not say. ``source`` names where it was read. The runner
    checks a run's options against it before loading (and against the loaded model after)."""

    layers: int | None
    kv_heads: int | None
    head_dim: int | None
    positions: int | None  # the longest sequence its positions cover (None: no such limit, or unsaid)
    source: str

    @property
    def geometry(self) -> Geometry | None:
        """The cached self-attention's :class:`Geometry`, where every part of it is declared."""
        parts = (self.layers, self.kv_heads, self.head_dim)
        return Geometry(*parts) if all(isinstance(n, int) and n > 0 for n in parts) else None


@dataclass(frozen=True)
class CachePolicy:
    """How a model's rollouts hold their native window; round-trips to JSON.

    ``size`` None: the run's ``--residual`` (and its unit) is used as given; otherwise the window
    is ``size`` units of ``unit`` ('token': the last tokens; 'append': the last appends, a scale
    or a block), whatever the run says. ``protect`` None: the run's ``--protect``; otherwise these
    layers stay native. ``note`` says it in words for the report.
    """

    unit: str = "token"
    size: int | None = None
    protect: str | list[int] | None = None
    note: str = ""

    def __post_init__(self):
        if self.unit not in WINDOW_UNITS:
            raise ValueError(f"unknown window unit '{self.unit}'. Available: {', '.join(WINDOW_UNITS)}")
        if self.size is not None and self.size < 0:
            raise ValueError(f"window size must be >= 0, got {self.size}")

    def apply(self, config: CacheConfig) -> CacheConfig:
        """``config`` with this policy's window and protected layers (idempotent)."""
        if self.size is not None:
            config = replace(config, residual=self.size, residual_unit=self.unit)
        if self.protect is not None:
            config = replace(config, protect=self.protect)
        return config

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "CachePolicy":
        return cls(**d)


class ModelAdapter(ABC):
    """The contract of a loaded model. Subclasses set ``modality`` (one its metrics module declares:
    :data:`registry.MODALITIES`, checked when a run resolves) and
    ``name`` (the registered name, an attribute or a property) and implement ``geometry``,
    ``describe`` and ``cache_policy``."""

    modality: str = ""
    name: str

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if cls.modality == NO_MODEL:
            raise ValueError(f"{cls.__name__}: '{NO_MODEL}' measures a codec alone; a model generates something")

    @property
    @abstractmethod
    def geometry(self) -> Geometry: ...

    @abstractmethod
    def describe(self) -> dict:
        """model.json's entry: at least name, model_type, layers, q_heads, kv_heads, head_dim, dtype,
        device, source (the report's header line reads them)."""

    @abstractmethod
    def cache_policy(self, window: int | None = None) -> CachePolicy:
        """This model's policy; ``window``: a task's override of the window size in the model's own
        unit (tokens for text, latent frames for video, scales for audio), None for the default."""

    def cache_config(self, config: CacheConfig, window: int | None = None) -> CacheConfig:
        """The cache configuration a rollout of this model uses for the run's ``config``."""
        return self.cache_policy(window).apply(config)
