"""Launch configuration of the table-lookup decode kernel (:mod:`kernels.cuda.decode_lut`), pure
Python: whether a codec's declared layout is covered, the default config per layout and bit width,
and the kernel's #define constants of a launch (:func:`launch_defs`). No device, no CuPy: the CPU
tests and the local SASS counts read these; every decode step asks them once per layer, so what
depends on the codec alone is derived once per codec (:class:`_Facts`)."""
from __future__ import annotations

import weakref

import torch

from ..fused_layout import KeyCodes, Sketch
from .lut_tables import Lookup, lookup_for

_QT = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


class _Facts:
    """What :func:`supports` and :func:`default_config` read from a codec, derived once per codec
    (its declared layout and value quantizer are fixed when it is built): a decode step asks for
    every layer, and building the layout each time cost more host time than the launch."""

    def __init__(self, codec):
        self.why = _layout_unsupported(codec)
        self.heads = None if self.why else _heads(codec.fused_layout())
        self.config = None if self.why else _default_config(codec)
        self.launches: dict = {}  # (q dtype, G, config items) -> launch_defs' result


_FACTS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _sketch_heads(res) -> int:
    return res.matrix.shape[0] if res.sketch == Sketch.GAUSSIAN else res.rotation.num_heads


def _heads(layout) -> int:
    """The heads of the layout's per-head parts (rotation signs, sketch): 1 or the cache's KV heads."""
    res = layout.residual
    return max(layout.rotation.num_heads, _sketch_heads(res) if res is not None else 1)


def _facts(codec) -> _Facts:
    f = _FACTS.get(codec)
    if f is None:
        f = _FACTS[codec] = _Facts(codec)
    return f


def layout_unsupported(codec) -> str | None:
    """None when the kernel covers ``codec``'s declared layout and value quantizer, else why not
    (no device needed: the part of :func:`supports` that depends on the codec alone)."""
    return _facts(codec).why


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


def default_config(codec) -> dict:
    """Launch configuration per layout and bit width. Octahedral keys: the table fused with the norm
    code where 16 copies of it fit in 32 KB (16 copies at 2 bits, 4 at 3 bits), else the (u, v)
    table alone (4 copies at 4 bits). Scalar keys: two codes per lookup (4-byte entries; 32 copies,
    one per lane, up to 32 KB at 4 bits)."""
    facts = _facts(codec)
    return dict(facts.config) if facts.config is not None else _default_config(codec)


TABLE_BUDGET = 32 * 1024  #: shared memory for the table copies of the default configs
#: where the query is rotated: "auto" = once per step by lut_qprep, except where a CTA of lut_split has fewer
#: than two stages of tokens per warp (its own rotation then overlaps the first stages' copies, and the
#: extra launch did not pay: docs/decode_lut.md, the H100 comparison)
QPREP_DEFAULT = "auto"


def _default_config(codec) -> dict:
    layout = codec.fused_layout()
    # 8 warps share one table copy per CTA, 2 CTAs per SM (H100 sweep, scripts/gpu_bench_lut.py sweep)
    # merge "launch": the separate lut_combine kernel merges the splits and the window; "kernel":
    # the last CTA per (batch, KV head) does it inside lut_split (compiled in only then: MERGE_IN).
    # "launch" is faster in every row of the H100 benchmark (docs/decode_lut.md), so it is the default.
    # pdl: lut_combine (and lut_split after lut_qprep) launched with programmatic dependent launch, so
    # that it starts while the kernel before it finishes. qprep "launch": the rotated query's
    # fragments made once per step by lut_qprep; "cta": by every CTA of lut_split; "auto": QPREP_DEFAULT's rule
    # (always lut_qprep where the keys carry a QJL residual: it makes the query's sketch too).
    cfg = {"num_warps": 8, "stages": 2, "mt": 1, "minb": 2, "merge": "launch", "pdl": True, "qprep": QPREP_DEFAULT}
    if layout.keys == KeyCodes.OCTAHEDRAL:
        b_u, b_r = layout.bits
        fused_entries = 1 << (2 * b_u + b_r)
        if fused_entries * 8 * 4 <= TABLE_BUDGET:
            return cfg | {"fused": True, "copies": max(1, min(16, TABLE_BUDGET // (fused_entries * 8)))}
        return cfg | {"fused": False, "copies": max(1, min(16, TABLE_BUDGET // ((1 << (2 * b_u)) * 8)))}
    # scalar: 4-byte entries with one copy per lane: no bank conflicts (2^(2b) entries x 4 B x 32)
    return cfg | {"pairs": True, "copies": max(1, min(32, TABLE_BUDGET // ((1 << (2 * layout.bits[0])) * 4)))}


def launch_defs(codec, q_dtype, G: int, config: dict | None = None) -> tuple[dict, Lookup, dict]:
    """(config, lookup, the kernel's #define constants but MERGE_IN) of a launch: the codec's default
    config updated by ``config`` (checked), read from the declared layout alone. No device needed
    (``scripts``/local SASS counts compile ``decode_lut.cu`` with these). Derived once per (codec,
    q_dtype, G, config): every layer of every decode step asks (the returned dicts are copies)."""
    facts = _facts(codec)
    # the values' types are part of the key: True == 1, but {"pdl": 1} is refused where True is taken
    key = (q_dtype, G, tuple(sorted((k, type(v), v) for k, v in (config or {}).items())))
    try:
        hit = facts.launches.get(key) if facts.why is None else None
    except TypeError:  # an unhashable value: derived (and refused) without the cache
        hit, key = None, None
    if hit is None:
        hit = _launch_defs(codec, q_dtype, G, config)
        if facts.why is None and key is not None:
            facts.launches[key] = hit
    cfg, lookup, defs = hit
    return dict(cfg), lookup, dict(defs)


def _launch_defs(codec, q_dtype, G: int, config: dict | None) -> tuple[dict, Lookup, dict]:
    base = default_config(codec)
    if set(config or {}) - set(base):
        raise ValueError(f"config keys {sorted(set(config) - set(base))} do not apply to this codec's layout "
                         f"(it takes {sorted(base)})")
    cfg = base | (config or {})
    layout = codec.fused_layout()
    if layout.keys == KeyCodes.OCTAHEDRAL and layout.bits[1] == 0 and not cfg["fused"]:
        raise ValueError("config fused false needs a triplet-length code (b_r >= 1): with b_r = 0 the "
                         "length is the fused table's one centroid")
    lookup = lookup_for(layout, cfg)
    grp = layout.groups
    ks = -(-grp.count // 4)
    ub = layout.codes.nbytes
    defs = {"D": codec.head_dim, "G": G, "NG": grp.count, "CW": grp.width, "GW": grp.coords,
            "NLK": lookup.lookups, "IB": lookup.index_bits, "SB": lookup.scale_bits,
            "VB": codec.value_quantizer.bits, "UB": ub,
            # rows of whole 16-byte units (the field is 16-byte aligned: _aligned) and runs of whole words
            "UALN": int(ub % 16 == 0 and (ks * grp.width) % 32 == 0),
            "C": cfg["copies"], "NW": cfg["num_warps"],
            "NSTAGE": cfg["stages"], "MT": cfg["mt"], "QT": _QT[q_dtype], "MINB": cfg["minb"]}
    for k in ("num_warps", "stages", "mt", "minb"):
        if type(cfg[k]) is not int or cfg[k] < 1:
            raise ValueError(f"config {k} must be a positive integer, got {cfg[k]!r}")
    if cfg["copies"] not in (1, 2, 4, 8, 16, 32):
        raise ValueError(f"config copies must be a power of two <= 32, got {cfg['copies']!r}")
    if lookup.entries * lookup.entry_bytes * cfg["copies"] > 64 * 1024:
        raise ValueError(f"the table ({lookup.entries} entries x {lookup.entry_bytes} B x {cfg['copies']} copies) "
                         "is over 64 KB of shared memory: fewer copies, or a lookup of fewer codes")
    if cfg["merge"] not in ("kernel", "launch"):
        raise ValueError(f"config merge must be 'kernel' or 'launch', got {cfg['merge']!r}")
    if cfg["qprep"] not in ("auto", "cta", "launch"):
        raise ValueError(f"config qprep must be 'auto', 'cta' or 'launch', got {cfg['qprep']!r}")
    if not isinstance(cfg["pdl"], bool):
        raise ValueError(f"config pdl must be true or false, got {cfg['pdl']!r}")
    defs["QJ"] = int(layout.residual is not None)
    if defs["QJ"] and cfg["qprep"] == "cta":
        raise ValueError("config qprep 'cta' cannot serve a QJL residual: lut_qprep makes the query's sketch "
                         "(use 'auto' or 'launch')")
    defs["QPREP"] = int(cfg["qprep"] != "cta")  # 'auto' may turn it off per call (decode_attention_lut)
    return cfg, lookup, defs
