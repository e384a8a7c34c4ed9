"""``harness bench``'s row builders and the public API of :mod:`harness.bench`, without a GPU: the
bench.json columns of a row (their order is the file's), the targets, the encode line, the parsers of
the comma-list options, random states of a codec's exact layout and the launcher scripts take."""
from __future__ import annotations

import pytest
import torch

import harness.bench as bench
from harness.bench.decode import L2_FLUSH_BYTES, Context, Timings, copies, latency_row
from harness.bench.report import TARGET_BW, add_targets
from harness.bench.encode import encode_line
from harness.bench.report import HEADER, cells, row_line

#: bench.json's columns of a row, in the order the file holds them (before ncu, lut_compare and targets)
COLUMNS = ["shape", "batch", "context", "codec", "bits", "fused_us", "lut_us", "sdpa_us", "sdpa_backend", "auto_path",
           "ratio_vs_sdpa", "lut_ratio_vs_sdpa", "best_ratio_vs_sdpa", "dequant_sdpa_us", "ratio_vs_dequant",
           "bytes_per_step", "sdpa_bytes_per_step", "floor_us", "achieved_Bps", "frac_of_copy_bw",
           "fused_frac_of_copy_bw", "sdpa_frac_of_copy_bw", "extra_alloc_bytes", "fp_key_tensor_bytes", "tune_us",
           "lut_kernel"]


def context(B=2, Hq=28, Hkv=4, d=128, ctx=32768, W=32) -> Context:
    q = torch.zeros(B, Hq, 1, d, dtype=torch.bfloat16)
    w = torch.zeros(B, Hkv, W, d, dtype=torch.bfloat16)
    kv_bytes = 2 * B * Hkv * ctx * d * 2
    return Context("qwen2.5-7b", Hq, Hkv, d, B, ctx, ctx - W, q, w, w.clone(), 40e-6, "flash", kv_bytes)


def timings(fused=50e-6, lut=20e-6, dequant=None) -> Timings:
    return Timings(state_bytes=10_000_000, fused=fused, lut=lut, lut_alt=None, dequant=dequant, extra_alloc=4096,
                   variants={"default": 50e-6}, lut_kernel={"regs": 96})


def test_latency_row_columns_and_figures():
    c, bw = context(), 2.0e12
    row = latency_row(c, "octopus", 3, timings(dequant=400e-6), bw)
    assert list(row) == COLUMNS
    step = 10_000_000 + 2 * c.wk.numel() * 2 + c.q.numel() * 2 * 2  # states + window (K and V) + query, bf16
    assert row["bytes_per_step"] == step and row["sdpa_bytes_per_step"] == c.kv_bytes
    # below: float64 products and quotients of the timings given (a few roundings): approx's default rel is far above
    assert row["auto_path"] == "lut" and row["lut_us"] == pytest.approx(20) and row["fused_us"] == pytest.approx(50)
    assert row["best_ratio_vs_sdpa"] == pytest.approx(0.5) and row["ratio_vs_sdpa"] == pytest.approx(1.25)
    assert row["ratio_vs_dequant"] == pytest.approx(20 / 400)
    assert row["achieved_Bps"] == pytest.approx(step / 20e-6)
    assert row["frac_of_copy_bw"] == pytest.approx(step / 20e-6 / bw)
    assert row["floor_us"] == pytest.approx(step / bw * 1e6)
    assert row["fp_key_tensor_bytes"] == 2 * 4 * (32768 - 32) * 128 * 2
    assert row["tune_us"] == {"default": pytest.approx(50)} and row["lut_kernel"] == {"regs": 96}
    assert len(cells(row)) == len(HEADER) and row_line(row).startswith("qwen2.5-7b")


def test_latency_row_without_the_lut_kernel_takes_triton():
    row = latency_row(context(), "kivi", 2, timings(lut=None), 2.0e12)
    assert row["auto_path"] == "triton" and row["lut_us"] is None and row["lut_ratio_vs_sdpa"] is None
    assert row["best_ratio_vs_sdpa"] == pytest.approx(1.25) and row["dequant_sdpa_us"] is None  # float64 quotient
    assert row["ratio_vs_dequant"] is None


@pytest.mark.parametrize("codec, bits, ctx, expect", [
    ("octopus", 2, 32768, {"target_ratio": 0.5, "meets_ratio": True, "meets_bw": False}),
    ("octopus", 4, 65536, {"target_ratio": 0.7, "meets_ratio": True}),  # no bandwidth target at 4 bits
    ("octopus", 2, 16384, {}),  # below 32k: no target
    ("kivi", 2, 32768, {}),  # not in TARGETS
])
def test_targets(codec, bits, ctx, expect):
    row = {"codec": codec, "bits": bits, "context": ctx, "best_ratio_vs_sdpa": 0.45,
           "frac_of_copy_bw": TARGET_BW - 0.01}
    add_targets(row)
    assert {k: row[k] for k in row if k in ("target_ratio", "meets_ratio", "meets_bw")} == expect


def test_copies_cycle_until_l2_is_flushed():
    assert copies(1) == 32 and copies(L2_FLUSH_BYTES) == 1 and copies(L2_FLUSH_BYTES // 4) == 4
    assert copies(L2_FLUSH_BYTES // 4 - 1) == 5 and copies(10 * L2_FLUSH_BYTES) == 1


def test_encode_line():
    r = {"codec": "octopus", "bits": 3, "fused_vec_per_s": 1.234e9, "torch_vec_per_s": 5.678e6, "speedup": 217.3,
         "bytes_equal_frac": {"codes": 1.0}}
    assert encode_line(r) == ("encode octopus@3: fused 1234.0 M vec/s, torch 5.68 M vec/s (217x), "
                              "bytes equal {'codes': 1.0}")


def test_option_parsers():
    assert [bench.parse_ctx(s) for s in ("32k", "1.5K", " 1000 ")] == [32768, 1536, 1000]
    assert bench.parse_list("1,,8", int) == [1, 8] and bench.parse_list("a, b") == ["a", " b"]
    assert bench.parse_list("1k,4k", bench.parse_ctx) == [1024, 4096]


def test_random_state_has_the_codec_layout():
    from kernels import make_codec

    codec = make_codec("octopus", 3, 64, seed=0)
    g = torch.Generator().manual_seed(0)
    ks, vs = bench.random_state(codec, 2, 3, 5, torch.device("cpu"), g)
    real_k, real_v = codec.encode(torch.randn(2, 3, 5, 64)), codec.encode_values(torch.randn(2, 3, 5, 64))
    for fake, real in ((ks, real_k), (vs, real_v)):
        assert {k: (t.shape, t.dtype) for k, t in fake.tensors.items()} == \
               {k: (t.shape, t.dtype) for k, t in real.tensors.items()}
        assert fake.nbytes() == real.nbytes()


def test_triton_path_is_the_kernel_dispatch_picks():
    from kernels import make_codec
    from kernels.attention import triton_kernel

    codec = make_codec("octopus", 3, 128, seed=0)
    supports, launch = bench.triton_path(codec)
    assert supports is triton_kernel(codec).supports and callable(launch)
    assert supports(codec, torch.bfloat16) is None


def test_public_api_and_launchers(capsys):
    from harness.cli.main import main

    missing = [n for n in bench.__all__ if not hasattr(bench, n)]
    assert not missing
    with pytest.raises(SystemExit) as e:
        main(["bench", "--help"])
    assert e.value.code == 0 and capsys.readouterr().out.startswith("usage: harness bench")
    with pytest.raises(SystemExit) as e:
        bench.probe_main(["--help"])
    assert e.value.code == 0 and capsys.readouterr().out.startswith("usage: harness probe")
    if not torch.cuda.is_available():
        assert main(["bench", "--contexts", "1k"]) == 2
        assert "needs a CUDA device" in capsys.readouterr().err


def test_codecs_name_engine_formats_at_their_own_bits():
    from harness.bench.inputs import bench_codecs
    from harness.run.config import DEPLOYED

    assert bench_codecs("octopus,llamacpp-q5_0@5,mlx-g64@8", [2, 4]) == [
        ("octopus", 2), ("octopus", 4), ("llamacpp-q5_0", 5), ("mlx-g64", 8)]
    assert bench_codecs("llamacpp-q8_0", [2, 8]) == [("llamacpp-q8_0", 8)]  # a plain name: the --bits it has
    mlx = bench_codecs("deployed:mlx", [2])
    assert mlx == [("mlx-g64", b) for b in (2, 3, 4, 8)]  # DEPLOYED's mlx-g64@2,3,4,8, whatever --bits says
    every = bench_codecs("deployed", [2])
    assert len(every) == sum(len(c.partition("@")[2].split(",")) for cs in DEPLOYED.values() for c in cs)
    for bad, says in (("nosuch", "unknown codec 'nosuch'"), ("llamacpp-q4_0@8", "runs at 4 bits"),
                      ("deployed:nosuch", "no engine 'nosuch'")):
        with pytest.raises(SystemExit, match=says):
            bench_codecs(bad, [2])


def test_plan_lists_the_rows_and_kernels_without_a_gpu(capsys):
    """--plan on the CPU: every block format the token kernel reads (llama.cpp's q5 included) is timed there,
    the rest say why they are skipped, and the count is the timed codecs times batches times contexts."""
    from harness.cli.main import main

    assert main(["bench", "--plan", "--codecs", "octopus@3,deployed:llamacpp,deployed:mlx,hf-quanto@4",
                 "--contexts", "32k,128k", "--batch", "1,8", "--shapes", "qwen2.5-7b"]) == 0
    lines = capsys.readouterr().out.splitlines()
    kernel = dict(line.split(": ", 1) for line in lines[:-1])
    assert kernel["qwen2.5-7b octopus@3"] == "decode_attention"
    assert all(kernel[f"qwen2.5-7b llamacpp-{t}"] == "token_attention"
               for t in ("q8_0@8", "q5_1@5", "q5_0@5", "q4_1@4", "q4_0@4", "iq4_nl@4"))
    assert kernel["qwen2.5-7b mlx-g64@3"].startswith("skip: block scales of 64 coordinates at 3 bits")
    assert kernel["qwen2.5-7b hf-quanto@4"].startswith("skip:")
    timed = sum(not k.startswith("skip") for k in kernel.values())
    assert timed == 1 + 6 + 3 and lines[-1].startswith(f"{timed * 2 * 2} rows timed")
