"""How a rollout's KV cache is compressed: :class:`CacheConfig` (round-trips to JSON), and its defaults."""
from __future__ import annotations

from dataclasses import dataclass, fields

from kernels import CodecConfig
from kernels.config import CodecChoice
from registry.options import options_json

#: Default residual window, in tokens (text). KIVI and the OCTOPUS paper keep a small
#: full-precision window of recent tokens; 32 is small next to the contexts we score.
DEFAULT_RESIDUAL = 32
CACHE_CONFIG_VERSION = 2
ATTENDS = ("score", "reconstruct")
RESIDUAL_UNITS = ("token", "append")
PROTECTS = ("none", "boundary-1")
#: config.json's order of the fields (version 2)
_JSON_ORDER = ("codec", "bits", "residual", "residual_unit", "protect", "value_bits", "value_group", "seed", "attend",
               "backend", "options", "memo_decoded")


@dataclass(frozen=True)
class CacheConfig(CodecChoice):
    """How a rollout's KV cache is compressed: the codec (its :class:`kernels.config.CodecChoice`: seed, value
    bits and group, backend, options) and the cache around it; round-trips to JSON. Checked once, when made."""

    codec: str = "none"
    bits: int = 16
    residual: int = DEFAULT_RESIDUAL  # native window size
    residual_unit: str = "token"  # "token": the last `residual` tokens; "append": the last `residual` appends (a frame, a scale)
    protect: str | list[int] = "none"  # PROTECTS: "none", "boundary-1" (first and last layer native), or layer indices
    attend: str = "score"  # ATTENDS: "score": codec score path; "reconstruct": decode keys then attend
    #: keep the decoded committed keys/values of non-estimator codecs between reads (speed only:
    #: decoding is deterministic, so results are identical; not counted as cache bytes)
    memo_decoded: bool = True

    def __post_init__(self):
        for name, allowed in (("attend", ATTENDS), ("residual_unit", RESIDUAL_UNITS)):
            value = getattr(self, name)
            if value not in allowed:
                raise ValueError(f"Unknown {name} '{value}'. Available: {', '.join(allowed)}")
        if isinstance(self.protect, str) or self.protect is None:
            if self.protect not in (*PROTECTS, None):
                raise ValueError(f"Unknown protect '{self.protect}'. Available: {', '.join(PROTECTS)} "
                                 f"or a list of layer indices")
        elif not all(isinstance(i, int) and not isinstance(i, bool) for i in self.protect):
            raise ValueError(f"protect must be {', '.join(PROTECTS)} or a list of layer indices, got {self.protect!r}")
        # the options belong to the codec: read into its Options (unknown codec -> its list), once
        self._settle(self.codec, "cache config")

    def codec_config(self, head_dim: int, num_heads: int, layer: int = 0) -> CodecConfig:
        """The config of layer ``layer``'s codec for KV heads ``[B, num_heads, T, head_dim]`` (what a report
        row embeds): this config's codec choice, its options already checked."""
        return CodecConfig(name=self.codec, bits=self.bits, head_dim=head_dim, layer=layer, num_heads=num_heads,
                           seed=self.seed, value_bits=self.value_bits, value_group=self.value_group,
                           backend=self.backend, options=self.options)

    def to_json(self) -> dict:
        d = {k: getattr(self, k) for k in _JSON_ORDER}
        return {"version": CACHE_CONFIG_VERSION, **d, "options": options_json(self.options)}

    @classmethod
    def from_json(cls, d: dict) -> "CacheConfig":
        if d.get("version", CACHE_CONFIG_VERSION) != CACHE_CONFIG_VERSION:
            raise ValueError(f"cache config version {d['version']!r} is not the supported {CACHE_CONFIG_VERSION}")
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known - {"version"}
        if unknown:
            raise ValueError(f"unknown CacheConfig field(s) {sorted(unknown)}; known: {sorted(known)}")
        return cls(**{k: v for k, v in d.items() if k in known})

    @property
    def label(self) -> str:
        return "none" if self.codec == "none" else f"{self.codec}@{self.bits}"

    def protected_layers(self, num_layers: int) -> set[int]:
        """Layers kept native: ``protect``'s (negative indices from the end), and those the codec's engine
        keeps uncompressed by itself (:meth:`kernels.base.Codec.engine_skipped_layers`)."""
        from kernels import codec_class

        engine = set() if self.codec == "none" else codec_class(self.codec).engine_skipped_layers(num_layers, self.options)
        if self.protect in ("none", None, []):
            return engine
        if self.protect == "boundary-1":
            return {0, num_layers - 1} | engine
        check_protect(self.protect, num_layers)
        return {int(i) % num_layers for i in self.protect} | engine  # -1: the last layer

def check_protect(protect, layers: int) -> None:
    """ValueError unless every protected layer index exists in a model of ``layers`` layers (0..layers-1,
    or -1..-layers from the end); 'none' and 'boundary-1' always do."""
    if isinstance(protect, (list, tuple)):
        bad = [i for i in protect if not -layers <= int(i) < layers]
        if bad:
            raise ValueError(f"layer(s) {bad} do not exist in a model of {layers} layers (indices 0..{layers - 1}, "
                             f"or -1..-{layers} from the end)")
