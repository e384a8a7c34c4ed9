"""Table-lookup decode attention (kernels/cuda/decode_lut.py) against the PyTorch reference
(kernels.attention.decode_attention_torch), for both key layouts it reads: OCTOPUS's octahedral
triplet codes and TurboQuant-MSE's scalar codes, each with and without a QJL residual (OCTOPUS-QJL,
TurboQuant-prod: the sketch of the query, Sq = M q, against the stored sign bits).

GPU (sm_90 and CuPy; skipped elsewhere): the kernel itself, at 1-5 bits, each lookup form (OCTOPUS fused and
unfused tables, TurboQuant pairs and quads of codes), head dims 64/128, GQA groups 1-8, batches with per-sequence
lengths (an empty one too), windows with per-sequence lengths, fp32/fp16/bf16 queries, many splits and a partial
last tile. Tolerances as tests/kernels/triton/test_decode_attention.py (tests/helpers/decode_checks.py):
fp16 tensor-core operands (keys from fp16 tables, one rounding or two for OCTOPUS's unfused ones, query
features, probabilities, P * scale) and fp16 partial outputs, six roundings of a term to first order;
bf16/fp16 outputs add their own rounding. The CPU side (tables, index, launch
constants, support): test_lut_tables.py; the QJL stage's: test_decode_lut_qjl.py.
"""
from __future__ import annotations

import math

import pytest
import torch

from kernels import make_codec
from kernels.attention import decode_attention_torch
from kernels.cuda.decode_lut import default_config, lookup_for
from helpers.decode_checks import LUT_CODECS, LUT_GPU_FORMS as GPU_FORMS, LUT_QJL_CODECS, lut_gpu as gpu, ref_lse as _ref_lse
from helpers.decode_checks import lut_form_unsupported as _form_unsupported, rel_err as _rel
from helpers.decode_checks import lse_atol, out_rtol, score_keys
from helpers.tolerances import UBF16, U32, sum_rel

# six fp16 roundings of a term (the module docstring) and both outputs' own: 2.9e-3, 3.9e-3, 1.1e-2
OUT_TOL = {dtype: out_rtol(dtype, fp16_roundings=6) for dtype in (torch.float32, torch.float16, torch.bfloat16)}
CODECS, QJL = LUT_CODECS, LUT_QJL_CODECS


# ---------------------------------------------------------------------------------------------
# GPU: the kernel
# ---------------------------------------------------------------------------------------------
def _case(bits, d, B, Hkv, G, T, W, seed=0, dtype=torch.bfloat16, q_scale=2.0, num_heads=None, name="octopus", **kw):
    g = torch.Generator().manual_seed(seed)
    codec = make_codec(name, bits, d, seed=seed, layer=1, num_heads=Hkv if num_heads is None else num_heads,
                       device="cuda", **kw)
    k = torch.randn(B, Hkv, T, d, generator=g) * (1 + torch.rand(B, Hkv, T, 1, generator=g) * 3)
    v = torch.randn(B, Hkv, T, d, generator=g) + torch.rand(B, Hkv, T, 1, generator=g) * 2
    q = (torch.randn(B, Hkv * G, 1, d, generator=g) * q_scale).to(dtype)
    ks, vs = codec.encode(k.cuda()), codec.encode_values(v.cuda())
    wk = torch.randn(B, Hkv, W, d, generator=g).to(dtype).cuda() if W else None
    wv = torch.randn(B, Hkv, W, d, generator=g).to(dtype).cuda() if W else None
    return codec, q.cuda(), ks, vs, wk, wv


def _lut(*a, **kw):
    from kernels.cuda.decode_lut import decode_attention_lut

    return decode_attention_lut(*a, **kw)


@gpu
@pytest.mark.parametrize("bits", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("name,form", GPU_FORMS)
@pytest.mark.parametrize("merge", ["kernel", "launch"])
def test_bits_and_tables(bits, name, form, merge):
    """Qwen-like group of 7, two sequences of different lengths, a window; output and lse; each
    lookup form, with and without a QJL residual; the splits merged in the kernel (last CTA) or by
    the separate combine launch."""
    if _form_unsupported(name, bits, form):
        pytest.skip(_form_unsupported(name, bits, form))
    codec, q, ks, vs, wk, wv = _case(bits, 128, B=2, Hkv=2, G=7, T=1000, W=24, seed=bits, dtype=torch.float32,
                                     name=name, value_bits=min(max(bits, 2), 4))  # (values of 2-4 bits)
    lengths = torch.tensor([1000, 613], dtype=torch.int32, device="cuda")
    lk = lookup_for(codec.fused_layout(), default_config(codec).replace(**form))
    copies = default_config(codec).copies
    while lk.entries * lk.entry_bytes * copies > 32 * 1024 and copies > 1:  # tables that need fewer copies
        copies //= 2
    if lk.entries * lk.entry_bytes > 64 * 1024:
        pytest.skip(f"{lk.entries} entries of {lk.entry_bytes} B do not fit")  # TurboQuant quads at 4 bits
    cfg = form | {"copies": copies, "merge": merge}
    out, lse = _lut(q, ks, vs, codec, wk, wv, lengths, return_lse=True, config=cfg)
    ref = decode_attention_torch(q, ks, vs, codec, wk, wv, lengths)
    assert torch.isfinite(out).all()
    assert _rel(out, ref) < OUT_TOL[torch.float32], _rel(out, ref)
    ref_lse = _ref_lse(q, ks, codec, wk, lengths, 1 / math.sqrt(128))
    # a score's fp16 query feature and table key (two roundings for OCTOPUS's unfused tables): lse_atol
    roundings = 3 if name == "octopus" and form.get("fused") is False else 2
    assert ((lse - ref_lse).abs() <= lse_atol(q, score_keys(codec, ks), 1 / math.sqrt(128), wk, roundings)).all()


@gpu
@pytest.mark.parametrize("name", CODECS)
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("G", [1, 3, 8])
def test_head_dims_dtypes_groups(name, d, dtype, G):
    codec, q, ks, vs, wk, wv = _case(3, d, B=1, Hkv=3, G=G, T=333, W=8, seed=d + G, dtype=dtype, name=name)
    out = _lut(q, ks, vs, codec, wk, wv)
    ref = decode_attention_torch(q, ks, vs, codec, wk, wv)
    assert out.dtype == dtype and out.shape == q.shape
    assert _rel(out, ref) < OUT_TOL[dtype], _rel(out, ref)


@gpu
@pytest.mark.parametrize("name", CODECS)
def test_batch_lengths_and_window_lengths(name):
    """Per-sequence lengths (an empty prefix, one inside the first tile) and window lengths."""
    codec, q, ks, vs, wk, wv = _case(2, 128, B=4, Hkv=2, G=4, T=147, W=6, seed=7, dtype=torch.float32, name=name)
    lengths = torch.tensor([147, 0, 5, 100], dtype=torch.int32, device="cuda")
    wlen = torch.tensor([6, 2, 0, 3], dtype=torch.int32, device="cuda")
    out = _lut(q, ks, vs, codec, wk, wv, lengths, wlen)
    ref = decode_attention_torch(q, ks, vs, codec, wk, wv, lengths, window_lengths=wlen)
    assert _rel(out, ref) < OUT_TOL[torch.float32]
    out2 = _lut(q, ks, vs, codec, None, None, torch.tensor([147, 0, 5, 100], device="cuda"))
    ref2 = decode_attention_torch(q, ks, vs, codec, None, None, lengths)
    assert torch.equal(out2[1], torch.zeros_like(out2[1]))  # nothing to attend -> zeros
    assert _rel(out2, ref2) < OUT_TOL[torch.float32]


@gpu
@pytest.mark.parametrize("name", CODECS)
@pytest.mark.parametrize("splits", [1, 7, 200])
def test_splits_shared_rotation_and_odd_lengths(name, splits):
    """One split, a few, more splits than tiles; a codec with one shared rotation; T not a
    multiple of 16 (a partial last tile whose tail bytes are garbage)."""
    codec, q, ks, vs, wk, wv = _case(4, 128, B=1, Hkv=2, G=2, T=16 * 70 - 5, W=4, seed=11,
                                     dtype=torch.float32, num_heads=1, name=name)
    out = _lut(q, ks, vs, codec, wk, wv, num_splits=splits)
    ref = decode_attention_torch(q, ks, vs, codec, wk, wv)
    assert _rel(out, ref) < OUT_TOL[torch.float32]


@gpu
@pytest.mark.parametrize("name", CODECS)
@pytest.mark.parametrize("cfg", [{"num_warps": 2, "stages": 2}, {"num_warps": 8, "stages": 3, "mt": 2},
                                 {"mt": 2}])
def test_launch_configs(name, cfg):
    codec, q, ks, vs, wk, wv = _case(3, 128, B=2, Hkv=2, G=7, T=2000, W=16, seed=5, name=name)
    out = _lut(q, ks, vs, codec, wk, wv, [2000, 1377], config=cfg)
    ref = decode_attention_torch(q, ks, vs, codec, wk, wv, [2000, 1377])
    assert _rel(out, ref) < OUT_TOL[torch.bfloat16]


@gpu
@pytest.mark.parametrize("name", CODECS)
def test_value_bits_independent_of_key_bits(name):
    for bits, vb in ((3, 2), (2, 4), (4, 3)):
        codec, q, ks, vs, wk, wv = _case(bits, 128, B=1, Hkv=1, G=5, T=500, W=3, seed=vb, dtype=torch.float32,
                                         value_bits=vb, name=name)
        out = _lut(q, ks, vs, codec, wk, wv)
        ref = decode_attention_torch(q, ks, vs, codec, wk, wv)
        assert _rel(out, ref) < OUT_TOL[torch.float32], (bits, vb)


@gpu
@pytest.mark.parametrize("name", CODECS)
def test_unaligned_field_views(name):
    """States sliced out of a larger cache (fields not 16-byte aligned per (batch, head)): the
    kernel reads rows at any byte offset."""
    from kernels.base import Encoded

    codec, q, ks, vs, wk, wv = _case(3, 128, B=2, Hkv=3, G=2, T=301, W=0, seed=3, dtype=torch.float32, name=name)
    T = 299
    ks2 = Encoded({k: t[..., :T, :].contiguous() for k, t in ks.tensors.items()}, (2, 3, T, 128), ks.dtype)
    vs2 = Encoded({k: t[..., :T, :].contiguous() for k, t in vs.tensors.items()}, (2, 3, T, 128), vs.dtype)
    out = _lut(q, ks2, vs2, codec)
    ref = decode_attention_torch(q, ks2, vs2, codec)
    assert _rel(out, ref) < OUT_TOL[torch.float32]


@gpu
@pytest.mark.parametrize("name", CODECS)
@pytest.mark.parametrize("merge", ["kernel", "launch"])
def test_merge_many_splits_long_window_repeated(name, merge):
    """More splits than one merge pass (128) and a window longer than one pass (32 tokens): the
    in-kernel merge's chunked loops; repeated calls give the same output (the arrival counters are
    reset by the kernel)."""
    codec, q, ks, vs, wk, wv = _case(3, 128, B=2, Hkv=2, G=7, T=16 * 300 - 3, W=70, seed=13, name=name)
    lengths = [16 * 300 - 3, 2222]
    wlen = torch.tensor([70, 33], dtype=torch.int32, device="cuda")
    cfg = {"merge": merge}
    out, lse = _lut(q, ks, vs, codec, wk, wv, lengths, wlen, num_splits=300, return_lse=True, config=cfg)
    out2 = _lut(q, ks, vs, codec, wk, wv, lengths, wlen, num_splits=300, config=cfg)
    out3 = _lut(q, ks, vs, codec, wk, wv, lengths, wlen, config=cfg)
    ref = decode_attention_torch(q, ks, vs, codec, wk, wv, lengths, window_lengths=wlen)
    assert torch.equal(out, out2)
    assert _rel(out, ref) < OUT_TOL[torch.bfloat16], _rel(out, ref)
    assert _rel(out3, ref) < OUT_TOL[torch.bfloat16], _rel(out3, ref)


#: every way the step's kernels are launched: plain launches, the combine with programmatic dependent
#: launch, the query prepared once per step by lut_qprep (and lut_split launched with PDL after it)
LAUNCHES = [{"pdl": False, "qprep": "cta"}, {"pdl": True, "qprep": "cta"}, {"pdl": True, "qprep": "auto"},
            {"pdl": False, "qprep": "launch"}, {"pdl": True, "qprep": "launch"},
            {"pdl": True, "qprep": "launch", "merge": "kernel"}]


@gpu
@pytest.mark.parametrize("name", CODECS)
@pytest.mark.parametrize("bits", [2, 3])
def test_launch_paths_agree(name, bits):
    """Every launch path (LAUNCHES) gives the same outputs and lse bit for bit (the in-kernel merge
    runs the same arithmetic as lut_combine only up to summation order: within tolerance), within
    the tolerance of the reference (a long window, per-sequence lengths, many splits, G = 7)."""
    codec, q, ks, vs, wk, wv = _case(bits, 128, B=2, Hkv=2, G=7, T=16 * 200 - 9, W=40, seed=17 + bits, name=name)
    lengths = [16 * 200 - 9, 1234]
    wlen = torch.tensor([40, 9], dtype=torch.int32, device="cuda")
    ref = decode_attention_torch(q, ks, vs, codec, wk, wv, lengths, window_lengths=wlen)
    # a QJL residual needs lut_qprep (it makes the query's sketch): no 'cta' paths
    launches = [cfg for cfg in LAUNCHES if not (name in QJL and cfg["qprep"] == "cta")]
    outs = [_lut(q, ks, vs, codec, wk, wv, lengths, wlen, return_lse=True, config=cfg) for cfg in launches]
    for (o, l), cfg in zip(outs, launches):
        if cfg.get("merge") == "kernel":
            # the same float32 arithmetic up to the order of the merge's sums over the splits (200 tiles at most):
            # the lse within that sum's bound and its log's rounding; the bf16 outputs each rounded once more
            splits = -(-(16 * 200) // 16)
            lse_tol = sum_rel(splits) + 4 * U32 * outs[0][1].abs().max()
            assert _rel(o, outs[0][0]) < 2 * UBF16 + sum_rel(splits) and (l - outs[0][1]).abs().max() <= lse_tol, cfg
        else:
            assert torch.equal(o, outs[0][0]) and torch.equal(l, outs[0][1]), cfg
        assert _rel(o, ref) < OUT_TOL[torch.bfloat16], (cfg, _rel(o, ref))


@gpu
@pytest.mark.parametrize("name,cfg", [("octopus", cfg) for cfg in LAUNCHES[1:]]
                         + [(name, {"pdl": True, "qprep": "launch"}) for name in QJL])
def test_pdl_launches_in_a_cuda_graph(name, cfg):
    """Captured in a CUDA graph (the benchmark's timing, and how decode steps can be replayed), the
    PDL launches become programmatic edges: replays on new queries and windows give the eager outputs,
    with the kernel before the chain writing what it reads (the query scaled in place)."""
    codec, q, ks, vs, wk, wv = _case(3, 128, B=1, Hkv=4, G=7, T=8000, W=32, seed=23, name=name)
    qs, wks = q.clone(), wk.clone()
    _lut(qs, ks, vs, codec, wks, wv, config=cfg)  # compile and allocate outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        qs.mul_(1.5)  # a kernel right before the chain, as the model's projection is
        out = _lut(qs, ks, vs, codec, wks, wv, config=cfg)
    g = torch.Generator(device="cuda").manual_seed(5)
    for _ in range(3):
        q_new = torch.randn(q.shape, generator=g, device="cuda").to(q.dtype)
        w_new = torch.randn(wk.shape, generator=g, device="cuda").to(wk.dtype)
        qs.copy_(q_new)
        wks.copy_(w_new)
        graph.replay()
        eager = _lut(q_new * 1.5, ks, vs, codec, w_new, wv, config=cfg)
        torch.cuda.synchronize()
        assert torch.equal(out, eager)


@gpu
def test_qprep_auto_rotates_in_the_ctas_where_warps_have_one_stage():
    """qprep 'auto': lut_qprep runs where each warp of a CTA has two or more 16-token stages, the CTAs
    rotate the query themselves where a warp has one (config qprep's rule, decode_lut.QPREP_DEFAULT)."""
    from kernels.cuda.decode_lut import LAST_LAUNCH

    codec, q, ks, vs, wk, wv = _case(3, 128, B=1, Hkv=2, G=4, T=300, W=4, seed=3)  # 19 tiles
    ref = decode_attention_torch(q, ks, vs, codec, wk, wv)
    for splits, qprep in ((3, 0), (1, 1)):  # 7 tiles per CTA of 8 warps; 19 tiles
        out = _lut(q, ks, vs, codec, wk, wv, num_splits=splits)
        assert LAST_LAUNCH["defs"]["QUERY_PREP"] == qprep, splits
        assert _rel(out, ref) < OUT_TOL[torch.bfloat16]
    # a QJL residual: lut_qprep always (it makes the query's sketch)
    codec, q, ks, vs, wk, wv = _case(3, 128, B=1, Hkv=2, G=4, T=300, W=4, seed=3, name="turboquant-prod")
    out = _lut(q, ks, vs, codec, wk, wv, num_splits=3)
    assert LAST_LAUNCH["defs"]["QUERY_PREP"] == 1 and LAST_LAUNCH["defs"]["HAS_QJL"] == 1
    assert _rel(out, decode_attention_torch(q, ks, vs, codec, wk, wv)) < OUT_TOL[torch.bfloat16]
