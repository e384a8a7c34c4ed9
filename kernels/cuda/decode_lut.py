"""Decode attention with table lookups for the rotated keys (CUDA, compiled at run time).

Same call as :func:`kernels.triton.decode_attention.decode_attention_fused` and the same stored
state: ``decode_attention_lut(q, key_state, value_state, codec, window_k, window_v, lengths,
window_lengths, scale)``. :func:`kernels.attention.decode_attention` runs it under backend 'auto'
(first choice on CUDA) or 'lut', through :func:`kernels.backend.decide`. The CUDA source and its
design are in ``decode_lut.cu`` and the ``lut_*.cuh`` parts beside it (:data:`SOURCE_FILES`), read
and compiled (NVRTC through CuPy) at the first launch of each configuration (:class:`KernelConstants`);
each kernel takes one parameter struct (:mod:`kernels.cuda.lut_params`).

Like the Triton kernel, it reads what the codec declares in ``codec.fused_layout()``
(:class:`kernels.fused_layout.FusedLayout`: key kind, bits, codebooks, field names, rotation signs)
and the codec's value quantizer, never its name or internals. The key codes are read as the
layout's stream of group codes (:attr:`FusedLayout.groups`: OCTOPUS triplets, or groups of 4
TurboQuant scalar codes), and a group code becomes the 4 tensor-core fragment slots it feeds by
table lookups (:class:`Lookup`), the tables derived once per (codec, device) from the declared
codebooks (:mod:`kernels.cuda.lut_tables`: OCTOPUS's fused triplet code -> rho * direction, or
(u, v) -> direction and a rho table; two adjacent TurboQuant codes -> their two centroids, or four).
No octahedral arithmetic or centroid gather runs per token beyond these lookups.

Needs CUDA, a Hopper GPU (``cp.async.bulk``, mbarriers; sm_90) and CuPy (NVRTC; the optional
extra ``cuda``), imported only when a launch is asked for. :func:`supports` says why a call
cannot run; tests compare every path with :func:`kernels.attention.decode_attention_torch`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import weakref
from pathlib import Path

import torch

from kernels._lengths import as_lengths
from kernels.split_k import choose_splits, num_sms
from kernels.cuda.launch import driver_missing, launch
from kernels.cuda.lut_config import (QPREP_DEFAULT, QUERY_DTYPES, TABLE_BUDGET, KernelConstants, LutConfig, LutLaunch,
                         codec_facts, default_config, launch_plan, layout_unsupported)
from kernels.cuda.lut_params import MAX_FIELDS, combine_params, output_params, qprep_params, split_params, window_params
from kernels.cuda.lut_tables import TSCALE, Lookup, lookup_for, lut_tables, table_keys

__all__ = ["SOURCE_FILES", "LAST_LAUNCH", "source", "supports", "cupy_missing", "sketch_matrices",
           "decode_attention_lut",
           # the configuration (kernels.cuda.lut_config) and the tables (kernels.cuda.lut_tables)
           "QPREP_DEFAULT", "QUERY_DTYPES", "TABLE_BUDGET", "KernelConstants", "LutConfig", "LutLaunch",
           "default_config", "launch_plan", "layout_unsupported", "TSCALE", "Lookup", "lookup_for", "lut_tables",
           "table_keys"]

_LOG2E = 1.4426950408889634
#: the CUDA source, in the order it is compiled (one translation unit; lut_common.cuh documents the parts)
SOURCE_FILES = tuple(Path(__file__).with_name(n) for n in ("lut_common.cuh", "lut_prep.cuh", "lut_merge.cuh",
                                                          "lut_tile.cuh", "decode_lut.cu"))
#: the latest launch's compiled functions and layout (for the benchmark's register report)
LAST_LAUNCH: dict = {}


@functools.lru_cache(maxsize=None)
def source() -> str:
    """The kernel's CUDA C++ source (:data:`SOURCE_FILES` joined, each after a ``#line`` directive so that
    the compiler's messages name its file and line), read once."""
    return "".join(f'#line 1 "{f.name}"\n' + f.read_text() for f in SOURCE_FILES)


# ------------------------------------------------------------------------------------------------
# support and configuration
# ------------------------------------------------------------------------------------------------
def supports(codec, q_dtype=torch.bfloat16, G: int | None = None, device=None, Hkv: int | None = None) -> str | None:
    """None when :func:`decode_attention_lut` runs this call, else the reason it does not: the
    codec's layout (:func:`layout_unsupported`), the query dtype, G query heads per KV head, the
    heads of the rotation and sketch against Hkv, then (with ``device``) a CUDA device, CuPy, sm_90."""
    facts = codec_facts(codec)
    if facts.why is not None:
        return facts.why
    if q_dtype not in QUERY_DTYPES:
        return f"query dtype {q_dtype} not supported"
    if G is not None and G > 8:
        return f"{G} query heads per KV head (at most 8)"
    heads = facts.heads
    if Hkv is not None and heads not in (1, Hkv):
        return f"the codec's rotation or sketch has {heads} heads, the cache {Hkv}"
    if device is not None:
        dev = torch.device(device)
        if dev.type != "cuda":
            return f"the CUDA kernel needs a CUDA device, got {dev}"
        why = cupy_missing() or driver_missing()
        if why is not None:
            return why
        if not torch.cuda.is_available():
            return "CUDA is not available"
        if torch.cuda.get_device_capability(dev) < (9, 0):
            return "the CUDA kernel needs sm_90 (Hopper: cp.async.bulk)"
    return None


def cupy_missing() -> str | None:
    """None when CuPy imports, else 'cupy missing (...)' (install the optional extra 'cuda')."""
    try:
        import cupy  # noqa: F401
    except ImportError as e:
        return f"cupy missing ({e}; pip install '.[cuda]')"
    return None


class _Plan:
    """What the kernel needs from the codec's declared layout, on the device, per (codec, device, lookup)."""

    def __init__(self, codec, device, lookup: Lookup):
        layout = codec.fused_layout()
        self.layout = layout
        self.fields = (layout.norm_field, layout.codes_field)
        self.n = layout.padded
        tab, scale = lut_tables(layout, lookup)
        self.tab = tab.contiguous().to(device)
        self.rho = scale.contiguous().view(torch.int32).reshape(-1).contiguous().to(device)
        signs = layout.rotation.signs[:, 0, :].float()  # [heads, n]
        self.signs = signs.contiguous().to(device)
        self.sign_stride = 0 if signs.shape[0] == 1 else signs.shape[1]
        self.heads = signs.shape[0]
        res = layout.residual
        self.qjl_fields = (res.bits_field, res.norm_field) if res is not None else None
        self.qjl_coef = res.coef if res is not None else 0.0
        skm = sketch_matrices(layout) if res is not None else torch.zeros(1, 1, 1)  # (not read)
        self.skm = skm.transpose(-1, -2).contiguous().to(device)  # M^T [heads, d, m], lut_qprep reads rows d
        self.skm_stride = 0 if skm.shape[0] == 1 else skm[0].numel()


def sketch_matrices(layout) -> torch.Tensor:
    """:meth:`FusedLayout.sketch_matrices` as lut_qprep reads them: float32 [heads, m, d]."""
    return layout.sketch_matrices().float()


_PLANS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_MODULES: dict = {}
_COUNTERS: dict = {}


def _counters(device, n: int) -> torch.Tensor:
    """int32 arrival counters, one per (batch, KV head), zero between launches (the last CTA of
    each (batch, KV head) resets its own). One per device, grown (never shrunk) as needed; allocated
    on the first launch of a size, so capture a CUDA graph after a warm-up call."""
    key = str(torch.device(device))
    t = _COUNTERS.get(key)
    if t is None or t.numel() < n:
        t = _COUNTERS[key] = torch.zeros(max(n, 4096), dtype=torch.int32, device=device)
    return t


def _plan(codec, device, lookup: Lookup) -> _Plan:
    per = _PLANS.setdefault(codec, {})
    key = (str(torch.device(device)), lookup)
    if key not in per:
        per[key] = _Plan(codec, device, lookup)
    return per[key]


def _module(constants: KernelConstants, device: int):
    """The compiled kernels of ``constants`` loaded on CUDA device ``device`` (a module's functions belong
    to one device's context: a model spread over GPUs runs layers on several)."""
    key = (device, constants.header)
    if key not in _MODULES:
        import cupy

        with cupy.cuda.Device(device):
            mod = cupy.RawModule(code=constants.header + source(), options=("-std=c++17",))
            split = mod.get_function("lut_split")
            comb = mod.get_function("lut_combine")
            qprep = mod.get_function("lut_qprep")
            lay = cupy.ndarray((4,), cupy.int32, mod.get_global("lut_smem_bytes")).get()
        smem = int(lay[0])
        if smem > 48 * 1024:
            split.max_dynamic_shared_size_bytes = smem
        _MODULES[key] = (split, comb, qprep, {"smem": smem, "st_off": int(lay[1]), "stage_bytes": int(lay[2]),
                                       "tab_bytes": int(lay[3])})
    return _MODULES[key]


def _aligned(t: torch.Tensor) -> torch.Tensor:
    if not t.is_contiguous():
        t = t.contiguous()
    if t.data_ptr() % 16:
        t = t.clone()
    return t


def decode_attention_lut(q, key_state, value_state, codec, window_k=None, window_v=None, lengths=None,
                         window_lengths=None, scale=None, num_splits: int | None = None, return_lse: bool = False,
                         config: LutConfig | dict | None = None, _parts: str = "both"):
    """Decode attention over a table-lookup-coded prefix (OCTOPUS, TurboQuant-MSE, with or without a QJL
    residual) plus a native window (see the module doc).
    q [B, Hq, 1, D] (fp32/fp16/bf16); states [B, Hkv, T, ...]; window [B, Hkv, W, D]. ``config``: a
    :class:`LutConfig`, or overrides of the codec's :func:`default_config` by key (``{"merge": "kernel"}``).
    Returns out [B, Hq, 1, D] in q's dtype (and lse [B, Hq], natural log, with ``return_lse``)."""
    B, Hq, Tq, D = q.shape
    assert Tq == 1, "decode attention takes one query token"
    dev = q.device
    tt = key_state.tensors
    Hkv, T = key_state.shape[-3], key_state.num_tokens
    G = Hq // Hkv
    why = supports(codec, q.dtype, G, dev, Hkv)
    if why:
        raise RuntimeError(f"decode_attention_lut cannot run: {why}")
    run = launch_plan(codec, q.dtype, G, config)
    cfg, constants = run.config, run.constants
    plan = _plan(codec, dev, run.lookup)
    if constants.merge_in_kernel and _parts != "both":  # profiling one part: the splits merged by lut_combine
        constants = dataclasses.replace(constants, merge_in_kernel=False)
    merge_in = constants.merge_in_kernel
    nw = cfg.num_warps  # (the CTA's merge buffer reuses the stage area, grown to fit where needed)
    tiles = max(1, -(-T // (16 * cfg.mt)))

    def tiles_per_cta(lay) -> int:  # in units of NW stages (one per warp)
        if num_splits is not None:
            return -(-tiles // num_splits)
        per_sm = max(1, min(cfg.minb, (227 * 1024) // max(lay["smem"], 1)))
        nb = -(-tiles // nw)
        return -(-nb // choose_splits(nb, B * Hkv, per_sm * num_sms(dev))) * nw

    dev_idx = dev.index if dev.index is not None else torch.cuda.current_device()
    split_fn, comb_fn, qprep_fn, lay = _module(constants, dev_idx)
    per = tiles_per_cta(lay)
    if cfg.qprep == "auto" and per < 2 * nw and not constants.has_qjl:  # one stage per warp: CTAs rotate the query
        constants = (run.cta_constants if constants is run.constants
                     else dataclasses.replace(constants, query_prep=False))
        split_fn, comb_fn, qprep_fn, lay = _module(constants, dev_idx)
        per = tiles_per_cta(lay)
    pdl = cfg.pdl
    LAST_LAUNCH.update(split=split_fn, combine=comb_fn, qprep=qprep_fn, layout=lay, defs=constants.macros,
                       constants=constants, pdl=pdl)

    # the per-token fields, in the kernel's order (kernels.cuda.lut_params.FIELDS)
    norm_f, codes_f = plan.fields
    fields = [_aligned(tt[norm_f]), _aligned(tt[codes_f]), _aligned(value_state.tensors["codes"]),
              _aligned(value_state.tensors["scale"]), _aligned(value_state.tensors["zero"])]
    if plan.qjl_fields is not None:  # the QJL residual: sign bits (uint8, D / 8 per token) and norms (fp16)
        qb, qn = tt[plan.qjl_fields[0]], tt[plan.qjl_fields[1]]
        if qb.dtype != torch.uint8 or qb.shape[-1] != D // 8 or qn.dtype != torch.float16 or qn.shape[-1] != 1:
            raise ValueError(f"QJL fields: want uint8 [..., {D // 8}] and float16 [..., 1], got {qb.dtype} "
                             f"{list(qb.shape)} and {qn.dtype} {list(qn.shape)}")
        fields += [_aligned(qb), _aligned(qn)]
    ptrs = [f.data_ptr() for f in fields]
    ends = [(f.data_ptr() + f.numel() * f.element_size() + 15) // 16 * 16 for f in fields]
    ptrs, ends = ptrs + [0] * (MAX_FIELDS - len(ptrs)), ends + [0] * (MAX_FIELDS - len(ends))
    qc = q.reshape(B, Hq, D).contiguous()
    lens = None if lengths is None else as_lengths(lengths, B, dev)
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    S = max(1, -(-tiles // per))
    o_part = torch.empty(B * Hkv * S * 8 * D, dtype=torch.float32, device=dev)
    ml_part = torch.empty(B * Hkv * S * 16, dtype=torch.float32, device=dev)
    out = torch.empty(B, Hq, 1, D, dtype=q.dtype, device=dev)
    lse = torch.empty(B, Hq, dtype=torch.float32, device=dev) if return_lse else o_part
    window, window_tensors = _window(window_k, window_v, window_lengths, q.dtype, B, dev)  # (kept until launched)
    output = output_params(out=out.data_ptr(), lse=lse.data_ptr(), sm_log2=scale * _LOG2E, write_lse=int(return_lse))

    qscale = scale * _LOG2E / (math.sqrt(plan.n) * TSCALE)
    cnt = _counters(dev, B * Hkv) if merge_in else None
    qprep = constants.query_prep
    # lut_qprep's output: [B * Hkv][KEY_KSTEPS + QJL_KSTEPS k-steps][32 lanes] pairs of fp16x2 B-fragment registers
    ksteps = constants.key_ksteps + constants.qjl_ksteps
    qfrag = torch.empty(B * Hkv * ksteps * 64, dtype=torch.int32, device=dev) if qprep else None
    split = split_params(
        q=qc.data_ptr(), signs=plan.signs.data_ptr(), qfrag=qfrag.data_ptr() if qprep else 0,
        table=plan.tab.data_ptr(), rho=plan.rho.data_ptr(), field=ptrs, field_end=ends,
        lengths=lens.data_ptr() if lens is not None else 0, o_part=o_part.data_ptr(), ml_part=ml_part.data_ptr(),
        counters=cnt.data_ptr() if merge_in else 0, qscale=qscale, sign_stride=plan.sign_stride,
        has_lengths=int(lens is not None), T=T, Hkv=Hkv, tiles_per_cta=per, S=S, merge_in=int(merge_in),
        vmagic=0x64006400, window=window, output=output)
    stream = torch.cuda.current_stream(dev).cuda_stream
    # every launch goes through the driver (kernels.cuda.launch; the PDL ones need its launch
    # attribute), which launches in the calling thread's current context: the device's, here
    with contextlib.nullcontext() if dev_idx == torch.cuda.current_device() else torch.cuda.device(dev_idx):
        if _parts != "combine":  # profiling only: "split" (with lut_qprep) / "combine" launch one part
            if qprep:  # a plain launch: it starts after everything before it (the chain's head)
                prep = qprep_params(q=qc.data_ptr(), signs=plan.signs.data_ptr(), sketch=plan.skm.data_ptr(),
                                    qfrag=qfrag.data_ptr(), qscale=qscale, sign_stride=plan.sign_stride, Hkv=Hkv,
                                    sketch_stride=plan.skm_stride, qjl_scale=scale * _LOG2E * plan.qjl_coef)
                launch(qprep_fn, (B * Hkv, 5 if constants.has_qjl else 1), (32 * nw,), prep, stream, pdl=False)
            launch(split_fn, (S, B * Hkv), (32 * nw,), split, stream, lay["smem"], pdl=pdl and qprep)
        if _parts != "split" and not merge_in:
            comb = combine_params(q=qc.data_ptr(), o_part=o_part.data_ptr(), ml_part=ml_part.data_ptr(), S=S, Hq=Hq,
                                  Hkv=Hkv, window=window, output=output)
            launch(comb_fn, (B * Hq,), (D,), comb, stream, pdl=pdl)
    return (out, lse) if return_lse else out


_NO_WINDOW = window_params(k=0, v=0, lengths=0, k_stride=(0, 0, 0), v_stride=(0, 0, 0), has_lengths=0, tokens=0)


def _window(window_k, window_v, window_lengths, dtype, B: int, dev):
    """The native window's :class:`kernels.cuda.lut_params.LutWindow` (keys and values in the query's
    dtype, last stride 1), or an empty one; and the tensors it points to, which the caller keeps until the
    kernels are launched (copies made here would otherwise go back to the allocator first)."""
    if window_k is None or window_k.shape[-2] == 0:
        return _NO_WINDOW, ()
    wk, wv = window_k, window_v
    if wk.dtype != dtype:
        wk = wk.to(dtype)
    if wv.dtype != dtype:
        wv = wv.to(dtype)
    if wk.stride(-1) != 1:
        wk = wk.contiguous()
    if wv.stride(-1) != 1:
        wv = wv.contiguous()
    wl = None if window_lengths is None else as_lengths(window_lengths, B, dev)
    params = window_params(k=wk.data_ptr(), v=wv.data_ptr(), lengths=wl.data_ptr() if wl is not None else 0,
                           k_stride=(wk.stride(0), wk.stride(1), wk.stride(2)),
                           v_stride=(wv.stride(0), wv.stride(1), wv.stride(2)),
                           has_lengths=int(wl is not None), tokens=wk.shape[-2])
    return params, (wk, wv, wl)
