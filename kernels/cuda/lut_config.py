"""Launch configuration of the table-lookup decode kernel (:mod:`kernels.cuda.decode_lut`), pure
Python: whether a codec's declared layout is covered, the default :class:`LutConfig` per layout and bit
width, and what a launch compiles (:class:`KernelConstants`, the #define lines of ``lut_common.cuh``'s
table) and looks up (:class:`Lookup`), together a :class:`LutLaunch` (:func:`launch_plan`). Each is a
frozen dataclass checked once, where it is built. No device, no CuPy: the CPU tests and the local SASS
counts read these; every decode step asks them once per layer, so what depends on the codec alone is
derived once per codec (:class:`CodecFacts`)."""
from __future__ import annotations

import dataclasses
import functools
import types
import weakref
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from kernels.fused_layout import KeyCodes, Sketch
from kernels.cuda.lut_tables import Lookup, lookup_for
from registry.versioned import VersionedJSON

#: the kernel's QUERY_DTYPE per query dtype
QUERY_DTYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
TABLE_BUDGET = 32 * 1024  #: shared memory for the table copies of the default configs
#: where the query is rotated: "auto" = once per step by lut_qprep, except where a CTA of lut_split has fewer
#: than two stages of tokens per warp (its own rotation then overlaps the first stages' copies, and the
#: extra launch did not pay: docs/decode_lut.md, the H100 comparison)
QPREP_DEFAULT = "auto"
LUT_CONFIG_VERSION = 1  #: of :meth:`LutConfig.to_json`


@dataclass(frozen=True)
class LutConfig(VersionedJSON, what="lut config", version=LUT_CONFIG_VERSION):
    """How the kernel is launched for one codec (its defaults: :func:`default_config`; a call's
    overrides: :meth:`replace`). ``fused`` applies to octahedral keys only and ``pairs`` to scalar keys
    only (the other is None): the lookup form (:func:`kernels.cuda.lut_tables.lookup_for`)."""

    copies: int                 #: table copies in shared memory, a power of two <= 32 (TABLE_COPIES)
    fused: bool | None = None   #: octahedral keys: the table indexed by the whole triplet code (else (u, v) and rho)
    pairs: bool | None = None   #: scalar keys: two codes per 4-byte lookup (else four per 8-byte lookup)
    # 8 warps share one table copy per CTA, 2 CTAs per SM (H100 sweep, scripts/gpu_bench_lut.py sweep)
    num_warps: int = 8          #: warps per CTA (NUM_WARPS)
    stages: int = 2             #: pipeline stages per warp (NUM_STAGES)
    mt: int = 1                 #: 16-token tiles per stage (TILES_PER_STAGE)
    minb: int = 2               #: CTAs per SM asked of the compiler (MIN_BLOCKS)
    #: "launch": the separate lut_combine kernel merges the splits and the window; "kernel": the last CTA
    #: per (batch, KV head) does it inside lut_split (MERGE_IN_KERNEL). "launch" is faster in every row of
    #: the H100 benchmark (docs/decode_lut.md), so it is the default.
    merge: str = "launch"
    #: lut_combine (and lut_split after lut_qprep) launched with programmatic dependent launch, so that
    #: it starts while the kernel before it finishes
    pdl: bool = True
    #: "launch": the rotated query's fragments made once per step by lut_qprep; "cta": by every CTA of
    #: lut_split; "auto": QPREP_DEFAULT's rule (always lut_qprep where the keys carry a QJL residual: it
    #: makes the query's sketch too)
    qprep: str = QPREP_DEFAULT

    def __post_init__(self):
        if (self.fused is None) == (self.pairs is None):
            raise ValueError("a config takes exactly one lookup form: fused (octahedral keys) or pairs (scalar keys)")
        for k in ("fused", "pairs", "pdl"):
            v = getattr(self, k)
            if not isinstance(v, bool) and (k == "pdl" or v is not None):
                raise ValueError(f"config {k} must be true or false, got {v!r}")
        for k in ("num_warps", "stages", "mt", "minb"):
            v = getattr(self, k)
            if type(v) is not int or v < 1:
                raise ValueError(f"config {k} must be a positive integer, got {v!r}")
        if type(self.copies) is not int or self.copies not in (1, 2, 4, 8, 16, 32):
            raise ValueError(f"config copies must be a power of two <= 32, got {self.copies!r}")
        if self.merge not in ("kernel", "launch"):
            raise ValueError(f"config merge must be 'kernel' or 'launch', got {self.merge!r}")
        if self.qprep not in ("auto", "cta", "launch"):
            raise ValueError(f"config qprep must be 'auto', 'cta' or 'launch', got {self.qprep!r}")

    @property
    def keys(self) -> list[str]:
        """The config keys that apply to this layout (the lookup form that is not None and the rest)."""
        return sorted(f.name for f in dataclasses.fields(self) if getattr(self, f.name) is not None)

    def json_fields(self) -> list[str]:
        """Its JSON (:class:`registry.versioned.VersionedJSON`, the version required) holds :attr:`keys` only."""
        return self.keys

    def replace(self, **overrides) -> "LutConfig":
        """This config with ``overrides`` (checked: keys of this layout only, values as above)."""
        wrong = set(overrides) - set(self.keys)
        if wrong:
            raise ValueError(f"config keys {sorted(wrong)} do not apply to this codec's layout (it takes {self.keys})")
        return dataclasses.replace(self, **overrides)


@dataclass(frozen=True)
class KernelConstants:
    """The #define constants one compiled module of the kernel is built with: one field per macro of
    ``lut_common.cuh``'s table, the macro's name in capitals (:attr:`macros`)."""

    head_dim: int
    heads_per_kv: int
    code_groups: int
    group_code_bits: int
    group_coords: int
    lookups: int
    index_bits: int
    scale_bits: int
    value_bits: int
    key_row_bytes: int
    key_rows_aligned: bool
    table_copies: int
    num_warps: int
    num_stages: int
    tiles_per_stage: int
    query_dtype: int
    min_blocks: int
    has_qjl: bool
    query_prep: bool
    merge_in_kernel: bool

    @functools.cached_property
    def macros(self) -> Mapping[str, int]:
        """{macro: value}, as the #define lines give them (flags as 0 / 1), read-only."""
        return types.MappingProxyType({f.name.upper(): int(getattr(self, f.name)) for f in dataclasses.fields(self)})

    @functools.cached_property
    def header(self) -> str:
        """The #define lines put in front of the source (also the compiled modules' cache key)."""
        return "".join(f"#define {k} {v}\n" for k, v in self.macros.items())

    @property
    def key_ksteps(self) -> int:
        """k-steps of the key product (KEY_KSTEPS)."""
        return -(-self.code_groups // 4)

    @property
    def qjl_ksteps(self) -> int:
        """k-steps of the QJL product (QJL_KSTEPS)."""
        return self.head_dim // 16 if self.has_qjl else 0


@dataclass(frozen=True)
class LutLaunch:
    """Everything a launch derives from (codec, query dtype, G, config), checked once where it is
    built (:func:`launch_plan`): the config, the lookup, and the kernel's constants. ``cta_constants``:
    the same with the query rotated by every CTA (config qprep 'auto' picks per call)."""

    config: LutConfig
    lookup: Lookup
    constants: KernelConstants
    cta_constants: KernelConstants = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self):
        cfg, lk, k = self.config, self.lookup, self.constants
        if cfg.fused is False and lk.scale_bits == 0:
            raise ValueError("config fused false needs a triplet-length code (b_r >= 1): with b_r = 0 the "
                             "length is the fused table's one centroid")
        if lk.entries * lk.entry_bytes * cfg.copies > 64 * 1024:
            raise ValueError(f"the table ({lk.entries} entries x {lk.entry_bytes} B x {cfg.copies} copies) "
                             "is over 64 KB of shared memory: fewer copies, or a lookup of fewer codes")
        if k.has_qjl and cfg.qprep == "cta":
            raise ValueError("config qprep 'cta' cannot serve a QJL residual: lut_qprep makes the query's sketch "
                             "(use 'auto' or 'launch')")
        object.__setattr__(self, "cta_constants", dataclasses.replace(k, query_prep=False))


class CodecFacts:
    """What :func:`supports` and :func:`default_config` read from a codec, derived once per codec
    (its declared layout and value quantizer are fixed when it is built): a decode step asks for
    every layer, and building the layout each time cost more host time than the launch."""

    def __init__(self, codec):
        self.why = _layout_unsupported(codec)
        self.heads = None if self.why else _heads(codec.fused_layout())
        self.config = None if self.why else _default_config(codec)
        self.launches: dict = {}  # (q dtype, G, config) -> launch_plan's result


_FACTS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _sketch_heads(res) -> int:
    return res.matrix.shape[0] if res.sketch == Sketch.GAUSSIAN else res.rotation.num_heads


def _heads(layout) -> int:
    """The heads of the layout's per-head parts (rotation signs, sketch): 1 or the cache's KV heads."""
    res = layout.residual
    return max(layout.rotation.num_heads, _sketch_heads(res) if res is not None else 1)


def codec_facts(codec) -> CodecFacts:
    """:class:`CodecFacts` of ``codec``, derived at the first call and kept while the codec lives."""
    f = _FACTS.get(codec)
    if f is None:
        f = _FACTS[codec] = CodecFacts(codec)
    return f


def layout_unsupported(codec) -> str | None:
    """None when the kernel covers ``codec``'s declared layout and value quantizer, else why not
    (no device needed: the part of :func:`supports` that depends on the codec alone)."""
    return codec_facts(codec).why


def _layout_unsupported(codec) -> str | None:
    layout = codec.fused_layout()
    if layout is None:
        return f"codec '{codec.name}' declares no fused layout"
    D = codec.head_dim
    if D not in (64, 128) or layout.padded != D:
        return f"head_dim {D} not in (64, 128)"
    res = layout.residual
    if res is not None:
        if res.m != D:
            return f"QJL sketch of {res.m} rows, not head_dim {D}"
        rh, sh = layout.rotation.num_heads, _sketch_heads(res)
        if 1 not in (rh, sh) and rh != sh:
            return f"the QJL sketch has {sh} heads, the rotation {rh}"
    if layout.keys == KeyCodes.OCTAHEDRAL:
        b_u, b_r = layout.bits
        if not (1 <= b_u <= 5 and 0 <= b_r <= 3):
            return f"OCTOPUS split (b_u={b_u}, b_r={b_r}) outside b_u <= 5, b_r <= 3"
    elif not 1 <= layout.bits[0] <= 4:
        return f"scalar key codes of {layout.bits[0]} bits (the kernel's pair table takes 1-4 bits)"
    vq = codec.value_quantizer
    if vq.bits not in (2, 3, 4) or vq.group != 32 or vq.padded != D:
        return f"value quantizer (bits={vq.bits}, group={vq.group}) not supported (bits 2-4, group 32)"
    return None


def default_config(codec) -> LutConfig:
    """Launch configuration per layout and bit width. Octahedral keys: the table fused with the norm
    code where 16 copies of it fit in 32 KB (16 copies at 2 bits, 4 at 3 bits), else the (u, v)
    table alone (4 copies at 4 bits). Scalar keys: two codes per lookup (4-byte entries; 32 copies,
    one per lane, up to 32 KB at 4 bits)."""
    facts = codec_facts(codec)
    return facts.config if facts.config is not None else _default_config(codec)


def _default_config(codec) -> LutConfig:
    layout = codec.fused_layout()
    if layout.keys == KeyCodes.OCTAHEDRAL:
        b_u, b_r = layout.bits
        fused_entries = 1 << (2 * b_u + b_r)
        if fused_entries * 8 * 4 <= TABLE_BUDGET:
            return LutConfig(fused=True, copies=max(1, min(16, TABLE_BUDGET // (fused_entries * 8))))
        return LutConfig(fused=False, copies=max(1, min(16, TABLE_BUDGET // ((1 << (2 * b_u)) * 8))))
    # scalar: 4-byte entries with one copy per lane: no bank conflicts (2^(2b) entries x 4 B x 32)
    return LutConfig(pairs=True, copies=max(1, min(32, TABLE_BUDGET // ((1 << (2 * layout.bits[0])) * 4))))


def launch_plan(codec, q_dtype, G: int, config: LutConfig | Mapping | None = None) -> LutLaunch:
    """The :class:`LutLaunch` of a call: ``config`` (a :class:`LutConfig`, or overrides of the codec's
    default config by key), read from the declared layout alone. No device needed (``scripts``/local
    SASS counts compile the kernel with its constants). Derived once per (codec, q_dtype, G, config):
    every layer of every decode step asks."""
    facts = codec_facts(codec)
    if isinstance(config, LutConfig):
        key = (q_dtype, G, config)
    else:  # the values' types are part of the key: True == 1, but {"pdl": 1} is refused where True is taken
        key = (q_dtype, G, tuple(sorted((k, type(v), v) for k, v in (config or {}).items())))
    try:
        hit = facts.launches.get(key) if facts.why is None else None
    except TypeError:  # an unhashable value: derived (and refused) without the cache
        hit, key = None, None
    if hit is None:
        cfg = config if isinstance(config, LutConfig) else default_config(codec).replace(**(config or {}))
        hit = _launch_plan(codec, q_dtype, G, cfg)
        if facts.why is None and key is not None:
            facts.launches[key] = hit
    return hit


def _launch_plan(codec, q_dtype, G: int, cfg: LutConfig) -> LutLaunch:
    layout = codec.fused_layout()
    lookup = lookup_for(layout, cfg)
    grp = layout.groups
    ksteps = -(-grp.count // 4)
    row_bytes = layout.codes.nbytes
    constants = KernelConstants(
        head_dim=codec.head_dim, heads_per_kv=G, code_groups=grp.count, group_code_bits=grp.width,
        group_coords=grp.coords, lookups=lookup.lookups, index_bits=lookup.index_bits,
        scale_bits=lookup.scale_bits, value_bits=codec.value_quantizer.bits, key_row_bytes=row_bytes,
        # rows of whole 16-byte units (the field is 16-byte aligned: decode_lut._aligned) and runs of whole words
        key_rows_aligned=row_bytes % 16 == 0 and (ksteps * grp.width) % 32 == 0,
        table_copies=cfg.copies, num_warps=cfg.num_warps, num_stages=cfg.stages, tiles_per_stage=cfg.mt,
        query_dtype=QUERY_DTYPES[q_dtype], min_blocks=cfg.minb, has_qjl=layout.residual is not None,
        query_prep=cfg.qprep != "cta",  # 'auto' may turn it off per call (LutLaunch.cta_constants)
        merge_in_kernel=cfg.merge == "kernel")
    return LutLaunch(cfg, lookup, constants)
