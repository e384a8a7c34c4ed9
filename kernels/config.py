"""What builds a codec: :class:`CodecConfig` (one layer's codec), on :class:`CodecChoice` (what a user
chooses of a codec, shared with the rollout's cache config), and :func:`codec_options`, where a codec's
options enter: a codec declares them as a frozen dataclass ``Options`` (:mod:`registry.options`), and
every config holds an instance of it, read once from strings or JSON and trusted after that. The
instance's class names its codec: :func:`kernels.base.make_codec` dispatches on it (as torchao's configs do).

    cfg = CodecConfig("octopus", 3, 128, options={"split": (4, 2)})
    cfg.options == Octopus.Options(split=(4, 2))           # every option present, typed
    CodecConfig.from_json(cfg.to_json()) == cfg
    codec_options("octopus", {"split": "4,2"}) == Octopus.Options(split=(4, 2))
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kernels.backend import BACKENDS
from registry.options import check_fields, check_ranges, read_options
from registry.versioned import VersionedJSON
from kernels.registry import codec_class

CODEC_CONFIG_VERSION = 1
#: rows.jsonl's order of a codec config's fields (its base's fields come first in the dataclass)
_JSON_ORDER = ("name", "bits", "head_dim", "seed", "layer", "num_heads", "value_bits", "value_group", "backend",
               "options")


def codec_options(name: str, given: Any = None, strings: bool = False):
    """Codec ``name``'s ``Options`` instance: ``given`` as it is where it already is one, else read from a
    dict (None: every default) of typed values (JSON, Python), or with ``strings`` of a command line's
    strings read by the field types. The one place a codec's options are checked."""
    cls = codec_class(name).Options  # unknown name -> "Unknown codec 'x'. Available: ..."
    if type(given) is cls:  # exactly the codec's own class: a subclass configures another codec
        check_ranges("codec", name, given)  # made in Python: its types trusted, its ranges not (codecs rely on them)
        return given
    if given is None or isinstance(given, dict):
        return read_options("codec", name, cls, given or {}, strings=strings)
    raise ValueError(f"codec '{name}' takes its options as a dict or a {cls.__qualname__}, got {given!r}")


def check_bits(name: str, bits: int) -> None:
    """ValueError unless codec ``name`` takes the key bit width ``bits`` (its ``bits_supported``)."""
    supported = codec_class(name).bits_supported
    if bits not in supported:
        raise ValueError(f"codec '{name}' does not support bits={bits}; supported: {list(supported)}")


@dataclass(frozen=True, kw_only=True)
class CodecChoice:
    """What a user chooses of a codec besides its name and key bit width: declared once, shared by a
    rollout's cache (:class:`adapters.cache.config.CacheConfig`) and each layer's codec (:class:`CodecConfig`).

    ``value_bits`` None means the key bit width; ``options`` is the codec's ``Options`` instance (a dict
    given here is read into one).
    """

    seed: int = 0
    value_bits: int | None = None
    value_group: int = 32
    backend: str = "auto"  # one of BACKENDS
    options: Any = None

    def _settle(self, codec: str, where: str, names: tuple[str, ...] = ()) -> None:
        """Check the fields once, where the config is made (these and ``names``' types), and make ``options``
        the codec's instance."""
        check_fields(self, where, ("seed", "value_bits", "value_group", "backend") + names)
        if self.backend not in BACKENDS:
            raise ValueError(f"Unknown backend '{self.backend}'. Available: {', '.join(BACKENDS)}")
        object.__setattr__(self, "options", codec_options(codec, self.options))


@dataclass(frozen=True)
class CodecConfig(CodecChoice, VersionedJSON, what="codec config", version=CODEC_CONFIG_VERSION, order=_JSON_ORDER):
    """Everything that builds a codec (the device aside): a :class:`CodecChoice` for one layer of
    ``num_heads`` KV heads of ``head_dim``; round-trips to JSON (:class:`registry.versioned.VersionedJSON`: every
    field in the order rows.jsonl has always carried it, every option named; the version required)."""

    name: str
    bits: int
    head_dim: int
    layer: int = 0
    num_heads: int = 1

    def __post_init__(self):
        self._settle(self.name, "codec config", ("bits", "head_dim", "layer", "num_heads"))
        check_bits(self.name, self.bits)
        if self.head_dim < 2:
            raise ValueError(f"head_dim must be >= 2, got {self.head_dim}")
        if self.num_heads < 1:
            raise ValueError(f"num_heads must be >= 1, got {self.num_heads}")

