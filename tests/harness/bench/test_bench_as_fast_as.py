"""``harness bench``'s relative target (issue #16: TurboQuant-MSE at least as fast as OCTOPUS at the
same bits): rows are paired by (shape, batch, context, bits) and compared in the 'auto' path's time."""
import pytest
from helpers.tolerances import U64, gamma

from harness.bench.report import AS_FAST_AS, as_fast_as, to_markdown


def _row(codec, bits, ratio, ctx=32768, sdpa=40.0, path="lut"):
    return {"shape": "qwen2.5-7b", "batch": 1, "context": ctx, "codec": codec, "bits": bits, "sdpa_us": sdpa,
            "fused_us": 50.0, "ratio_vs_sdpa": 50 / sdpa, "lut_us": ratio * sdpa, "lut_ratio_vs_sdpa": ratio,
            "dequant_sdpa_us": None, "ratio_vs_dequant": None, "bytes_per_step": 1e7, "floor_us": 4.0,
            "achieved_Bps": 1e12, "frac_of_copy_bw": 0.4, "extra_alloc_bytes": 0, "fp_key_tensor_bytes": 1e7,
            "auto_path": path, "best_ratio_vs_sdpa": ratio, "lut_kernel": {}, "tune_us": {}}


def test_pairs_rows_by_bits_and_compares_times():
    assert AS_FAST_AS["turboquant-mse"] == "octopus"
    rows = [_row("octopus", 2, 0.5), _row("octopus", 3, 0.6), _row("turboquant-mse", 2, 0.4),
            _row("turboquant-mse", 3, 0.66), _row("turboquant-mse", 4, 0.3),  # no OCTOPUS@4 row: not paired
            _row("turboquant-mse", 2, 0.1, ctx=4096)]  # no OCTOPUS row at 4k: not paired
    got = {x["bits"]: x for x in as_fast_as(rows)}
    assert sorted(got) == [2, 3]
    # (r x 40) / (r' x 40) against the literal r / r': the five literals, two products and a quotient each round once
    assert got[2]["ratio"] == pytest.approx(0.8, rel=gamma(8, U64), abs=0)
    assert got[3]["ratio"] == pytest.approx(1.1, rel=gamma(8, U64), abs=0)
    assert got[2]["us"] == 0.4 * 40 and got[2]["ref_us"] == 0.5 * 40
    md = to_markdown({"device": "d", "command": "c", "torch": "2", "triton": "3", "copy_bandwidth_Bps": 2e12,
                      "rows": rows, "encode": [], "correctness": {}, "lut_refused": {}, "config": {}, "ncu": None})
    assert "## At least as fast as" in md
    assert "| qwen2.5-7b | 1 | 32k | 2 | turboquant-mse (lut) | 16.0 | 0.400 | octopus (lut) | 20.0 | 0.500 | 0.800 | yes |" in md
    assert "| 1.100 | no |" in md


def test_variant_table_names_each_rows_codec():
    """The --lut-compare table has one row per (shape, batch, context, codec, bits): the codec is named,
    so two codecs at the same bits are told apart, and the ratio is this kernel's time over the variant's."""
    rows = [_row("octopus", 3, 0.5) | {"lut_compare_us": 25.0, "lut_compare_ratio_vs_sdpa": 25.0 / 40},
            _row("turboquant-mse", 3, 0.4) | {"lut_compare_us": 20.0, "lut_compare_ratio_vs_sdpa": 0.5}]
    md = to_markdown({"device": "d", "command": "c", "torch": "2", "triton": "3", "copy_bandwidth_Bps": 2e12,
                      "rows": rows, "encode": [], "correctness": {}, "lut_refused": {},
                      "config": {"lut_compare": '{"pdl": false}'}, "ncu": None})
    assert "| qwen2.5-7b | 1 | 32k | octopus | 3 | 40.0 | 20.0 | 25.0 | 0.500 | 0.625 | 0.800 |" in md
    assert "| qwen2.5-7b | 1 | 32k | turboquant-mse | 3 | 40.0 | 16.0 | 20.0 | 0.400 | 0.500 | 0.800 |" in md
