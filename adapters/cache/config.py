"""How a rollout's KV cache is compressed: :class:`CacheConfig` (round-trips to JSON), and its defaults."""
from __future__ import annotations

from dataclasses import dataclass

from kernels import CodecConfig
from kernels.config import CodecChoice
from registry.versioned import VersionedJSON

#: Default residual window, in tokens (text). KIVI and the OCTOPUS paper keep a small
#: full-precision window of recent tokens; 32 is small next to the contexts we score.
DEFAULT_RESIDUAL = 32
CACHE_CONFIG_VERSION = 2
ATTENDS = ("score", "reconstruct")
RESIDUAL_UNITS = ("token", "append")
#: the named forms of ``protect`` (:func:`parse_protect`); the others are layer indices
PROTECTS = ("none", "boundary-1")
#: config.json's order of the fields (version 2)
_JSON_ORDER = ("codec", "bits", "residual", "residual_unit", "protect", "value_bits", "value_group", "seed", "attend",
               "backend", "options", "memo_decoded")


@dataclass(frozen=True)
class CacheConfig(CodecChoice, VersionedJSON, what="cache config", version=CACHE_CONFIG_VERSION, order=_JSON_ORDER,
                  versionless=True):
    """How a rollout's KV cache is compressed: the codec (its :class:`kernels.config.CodecChoice`: seed, value
    bits and group, backend, options) and the cache around it; round-trips to JSON
    (:class:`registry.versioned.VersionedJSON`; JSON without a version reads as the current one). Checked once,
    when made."""

    codec: str = "none"
    bits: int = 16
    residual: int = DEFAULT_RESIDUAL  # native window size
    residual_unit: str = "token"  # "token": the last `residual` tokens; "append": the last `residual` appends (a frame, a scale)
    #: layers kept native: "none", "boundary-1" (first and last layer), or layer indices; given in any form
    #: :func:`parse_protect` reads, held in its canonical one
    protect: str | list[int] = "none"
    attend: str = "score"  # ATTENDS: "score": codec score path; "reconstruct": decode keys then attend
    #: keep the decoded committed keys/values of non-estimator codecs between reads (speed only:
    #: decoding is deterministic, so results are identical; not counted as cache bytes)
    memo_decoded: bool = True

    def __post_init__(self):
        for name, allowed in (("attend", ATTENDS), ("residual_unit", RESIDUAL_UNITS)):
            value = getattr(self, name)
            if value not in allowed:
                raise ValueError(f"Unknown {name} '{value}'. Available: {', '.join(allowed)}")
        object.__setattr__(self, "protect", parse_protect(self.protect))
        # the options belong to the codec: read into its Options (unknown codec -> its list), once
        self._settle(self.codec, "cache config")

    def codec_config(self, head_dim: int, num_heads: int, layer: int = 0) -> CodecConfig:
        """The config of layer ``layer``'s codec for KV heads ``[B, num_heads, T, head_dim]`` (what a report
        row embeds): this config's codec choice, its options already checked."""
        return CodecConfig(name=self.codec, bits=self.bits, head_dim=head_dim, layer=layer, num_heads=num_heads,
                           seed=self.seed, value_bits=self.value_bits, value_group=self.value_group,
                           backend=self.backend, options=self.options)

    @property
    def label(self) -> str:
        return "none" if self.codec == "none" else f"{self.codec}@{self.bits}"

    def protected_layers(self, num_layers: int) -> set[int]:
        """Layers kept native: ``protect``'s (negative indices from the end), and those the codec's engine
        keeps uncompressed by itself (:meth:`kernels.base.Codec.engine_skipped_layers`)."""
        from kernels import codec_class

        engine = set() if self.codec == "none" else codec_class(self.codec).engine_skipped_layers(num_layers, self.options)
        if self.protect in ("none", []):
            return engine
        if self.protect == "boundary-1":
            return {0, num_layers - 1} | engine
        check_protect(self.protect, num_layers)
        return {int(i) % num_layers for i in self.protect} | engine  # -1: the last layer

def parse_protect(value, name: str = "protect") -> str | list[int]:
    """The layers kept native, as every front end gives them (``--protect``, lm-eval's ``protect=``, Python's
    ``CacheConfig(protect=...)``, JSON), in one canonical form: 'none', 'boundary-1' or [layer index, ...]
    (negative: from the end). Takes those, None ('none': lm-eval's model_args read 'none' as None), one index
    (lm-eval reads '5' as 5), and a string of indices joined by ',' (``--protect 0,29``) or ':' (``protect=0:29``:
    lm-eval's ``model_args`` are themselves split on ',', so there a ',' would end the argument; both
    separators are read everywhere, so each front end takes the other's form too). ``name``: the option as
    the front end names it, for the one-line ValueError."""
    if value is None:
        return "none"
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(value, str):
        if value in PROTECTS:
            return value
        try:
            return [int(i) for i in value.replace(":", ",").split(",")]
        except ValueError:
            pass
    elif isinstance(value, (list, tuple)) and all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        return list(value)
    raise ValueError(f"{name} takes 'none', 'boundary-1' or layer indices like 0,29 (or 0:29); got {value!r}")


def protect_text(protect: str | list[int]) -> str:
    """``protect`` (canonical) as ``--protect`` takes it: the name, or indices joined by ','."""
    return protect if isinstance(protect, str) else ",".join(map(str, protect))


def check_protect(protect, layers: int) -> None:
    """ValueError unless every protected layer index exists in a model of ``layers`` layers (0..layers-1,
    or -1..-layers from the end); 'none' and 'boundary-1' always do."""
    if isinstance(protect, (list, tuple)):
        bad = [i for i in protect if not -layers <= int(i) < layers]
        if bad:
            raise ValueError(f"layer(s) {bad} do not exist in a model of {layers} layers (indices 0..{layers - 1}, "
                             f"or -1..-{layers} from the end)")
