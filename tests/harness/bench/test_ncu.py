"""``harness bench --ncu`` without a GPU: reading Nsight Compute's CSV (samples written in its two
layouts), the per-path sums, the notes when ncu cannot run, and the report's columns."""
import json
import subprocess

import pytest

from harness.bench import ncu as bench_ncu
from harness.bench.decode import build_parser
from harness.bench.report import HEADER, NO_NCU, cells, to_markdown

# `ncu --csv --print-units base --metrics ... --kernel-name regex:... python -c CHILD SPEC`
# ('details' page: one row per launch and metric), with ncu's own lines around it, as ncu 2025.3.1
# prints it on the H100 (figures made up; the layout, units and separators as recorded)
DETAILS = """==WARNING== Note: Running with unmodified GPU clocks. If not controlled otherwise, profiling results may be inconsistent.
==PROF== Connected to process 4242 (/opt/torch/.venv/bin/python3.12)
==PROF== Profiling "lut_split": 0%....50%....100% - 4 passes
==PROF== Profiling "lut_combine": 0%....50%....100% - 4 passes
==PROF== Profiling "_split_kernel": 0%....50%....100% - 4 passes
==PROF== Profiling "_combine_kernel": 0%....50%....100% - 4 passes
==PROF== Disconnected from process 4242
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","4242","python3.12","127.0.0.1","lut_split","1","7","(256, 1, 1)","(33, 4, 1)","0","9.0","Command line profiler metrics","dram__bytes_read.sum","byte","12,288,512"
"0","4242","python3.12","127.0.0.1","lut_split","1","7","(256, 1, 1)","(33, 4, 1)","0","9.0","Command line profiler metrics","dram__bytes_write.sum","byte","245,760"
"0","4242","python3.12","127.0.0.1","lut_split","1","7","(256, 1, 1)","(33, 4, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","ns","21,344"
"0","4242","python3.12","127.0.0.1","lut_split","1","7","(256, 1, 1)","(33, 4, 1)","0","9.0","Command line profiler metrics","smsp__inst_executed.sum","inst","6,815,744"
"1","4242","python3.12","127.0.0.1","lut_combine","1","7","(128, 1, 1)","(28, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_read.sum","byte","262,144"
"1","4242","python3.12","127.0.0.1","lut_combine","1","7","(128, 1, 1)","(28, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_write.sum","byte","7,168"
"1","4242","python3.12","127.0.0.1","lut_combine","1","7","(128, 1, 1)","(28, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","ns","5,856"
"1","4242","python3.12","127.0.0.1","lut_combine","1","7","(128, 1, 1)","(28, 1, 1)","0","9.0","Command line profiler metrics","smsp__inst_executed.sum","inst","131,072"
"2","4242","python3.12","127.0.0.1","_split_kernel","1","7","(128, 1, 1)","(66, 4, 1)","0","9.0","Command line profiler metrics","dram__bytes_read.sum","byte","12,582,912"
"2","4242","python3.12","127.0.0.1","_split_kernel","1","7","(128, 1, 1)","(66, 4, 1)","0","9.0","Command line profiler metrics","dram__bytes_write.sum","byte","1,048,576"
"2","4242","python3.12","127.0.0.1","_split_kernel","1","7","(128, 1, 1)","(66, 4, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","ns","40,128"
"2","4242","python3.12","127.0.0.1","_split_kernel","1","7","(128, 1, 1)","(66, 4, 1)","0","9.0","Command line profiler metrics","smsp__inst_executed.sum","inst","22,282,240"
"3","4242","python3.12","127.0.0.1","_combine_kernel","1","7","(128, 1, 1)","(28, 4, 1)","0","9.0","Command line profiler metrics","smsp__inst_executed.sum","inst","65,536"
"""

# the same launches of the LUT path on the 'raw' page with ncu's scaled units (no --print-units base)
RAW = """==PROF== Connected to process 77
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","dram__bytes_read.sum","dram__bytes_write.sum","gpu__time_duration.sum","smsp__inst_executed.sum"
"","","","","","","","","","","","Mbyte","Kbyte","usecond","inst"
"0","77","python3","localhost","lut_split","1","7","(256, 1, 1)","(33, 4, 1)","0","9.0","12.29","245.76","21.34","6815744"
"1","77","python3","localhost","lut_combine","1","7","(128, 1, 1)","(28, 1, 1)","0","9.0","0.26","7.17","5.86","131072"
==PROF== Disconnected from process 77
"""

TOKEN_HEADS = 1 * 4 * 32768  # batch x KV heads x context


def test_details_page_is_read_per_launch_in_base_units():
    launches = bench_ncu.parse_csv(DETAILS)
    assert [x["kernel"] for x in launches] == ["lut_split", "lut_combine", "_split_kernel", "_combine_kernel"]
    assert launches[0]["smsp__inst_executed.sum"] == 6_815_744  # thousands separators dropped
    assert launches[0]["gpu__time_duration.sum"] == 21_344
    assert "dram__bytes_read.sum" not in launches[3]  # a metric ncu did not print stays absent


def test_raw_page_units_are_scaled_to_base():
    a, b = bench_ncu.parse_csv(RAW)
    assert a["kernel"] == "lut_split" and b["kernel"] == "lut_combine"
    # "12.29" x 1e6 in float64 against the literal 12.29e6: a rounding or two, far below approx's default rel
    assert a["dram__bytes_read.sum"] == pytest.approx(12.29e6)
    assert a["dram__bytes_write.sum"] == pytest.approx(245.76e3)
    assert a["gpu__time_duration.sum"] == pytest.approx(21_340)
    assert a["smsp__inst_executed.sum"] == 6_815_744


def test_no_csv_is_no_launch():
    assert bench_ncu.parse_csv("==PROF== Connected\n==WARNING== No kernels were profiled.\n") == []


def test_paths_sum_their_kernels_per_token_and_head():
    res = bench_ncu.per_path(bench_ncu.parse_csv(DETAILS), TOKEN_HEADS)
    assert set(res) == {"lut", "triton"}
    lut, tri = res["lut"], res["triton"]
    assert lut["kernels"] == ["lut_split", "lut_combine"]
    assert lut["inst"] == 6_815_744 + 131_072
    assert lut["inst_per_token_head"] == pytest.approx((6_815_744 + 131_072) / TOKEN_HEADS)  # one float64 quotient
    assert lut["dram_bytes"] == 12_288_512 + 245_760 + 262_144 + 7_168
    assert lut["kernel_us"] == pytest.approx((21_344 + 5_856) / 1e3)  # a float64 sum and quotient: default rel
    assert tri["inst"] == 22_282_240 + 65_536
    # both layouts give the same LUT figures (up to the raw page's rounding)
    raw = bench_ncu.per_path(bench_ncu.parse_csv(RAW), TOKEN_HEADS)["lut"]
    assert raw["inst"] == lut["inst"]
    # the raw page prints 2 decimals of Mbyte and Kbyte: each of its 4 byte counts is off by at most half of 0.01 unit
    assert raw["dram_bytes"] == pytest.approx(lut["dram_bytes"], rel=0, abs=2 * 0.005e6 + 2 * 0.005e3)


@pytest.mark.parametrize("name, path", [("lut_split", "lut"), ("lut_combine(int, float)", "lut"),
                                        ("_split_kernel", "triton"), ("elementwise_kernel", None)])
def test_kernel_names_map_to_paths(name, path):
    assert bench_ncu.kernel_path(name) == path


def test_failure_notes():
    perm = ("==PROF== Connected to process 1\n==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to "
            "access NVIDIA GPU Performance Counters on the target device 0.")
    assert "ERR_NVGPUCTRPERM" in bench_ncu.failure_note(1, perm)
    assert bench_ncu.failure_note(0, "==WARNING== No kernels were profiled.") == "ncu profiled no decode kernel"
    assert "exit 3" in bench_ncu.failure_note(3, "==ERROR== The application returned an error code (1).")


SPEC = {"shape": (28, 4, 128), "batch": 1, "context": 32768, "window": 32, "codec": "octopus", "bits": 3,
        "paths": ["lut", "triton"], "lut_config": None, "triton_kw": {}}


def test_command_reads_only_the_decode_kernels_and_leaves_clocks(monkeypatch):
    cmd = bench_ncu.command("/x/ncu", SPEC)
    assert cmd[0] == "/x/ncu" and "--csv" in cmd
    assert cmd[cmd.index("--clock-control") + 1] == "none"
    assert cmd[cmd.index("--print-units") + 1] == "base"
    assert cmd[cmd.index("--metrics") + 1] == ",".join(bench_ncu.METRICS)
    regex = cmd[cmd.index("--kernel-name") + 1]
    for names in bench_ncu.PATH_KERNELS.values():
        for n in names:
            assert n in regex
    assert cmd[-3:-1] == ["-c", bench_ncu.CHILD] and json.loads(cmd[-1]) == json.loads(json.dumps(SPEC))


def test_measure_without_ncu_says_why(monkeypatch):
    monkeypatch.setattr(bench_ncu, "find_ncu", lambda: None)
    assert "ncu not found" in bench_ncu.measure(SPEC)["error"]


def test_measure_parses_a_run_and_notes_a_missing_path(monkeypatch):
    monkeypatch.setattr(bench_ncu, "find_ncu", lambda: "/x/ncu")
    lut_only = "\n".join(ln for ln in DETAILS.splitlines() if "_split_kernel\"" not in ln and "_combine_kernel\"" not in ln)
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a[0], 0, lut_only, ""))
    res = bench_ncu.measure(SPEC)
    assert res["lut"]["inst_per_token_head"] == pytest.approx((6_815_744 + 131_072) / TOKEN_HEADS)  # float64 quotient
    assert "triton" not in res and "no figures for triton" in res["error"]
    denied = "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission"
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a[0], 1, "", denied))
    assert "ERR_NVGPUCTRPERM" in bench_ncu.measure(SPEC)["error"]


def test_find_ncu_honours_the_environment(monkeypatch, tmp_path):
    exe = tmp_path / "ncu"
    exe.write_text("")
    monkeypatch.setenv("NCU", str(exe))
    assert bench_ncu.find_ncu() == str(exe)
    monkeypatch.setenv("NCU", str(tmp_path / "missing"))
    assert bench_ncu.find_ncu() is None


def _row(**kw):
    r = {"shape": "qwen2.5-7b", "batch": 1, "context": 32768, "codec": "octopus", "bits": 3, "sdpa_us": 42.0,
         "fused_us": 46.0, "ratio_vs_sdpa": 46 / 42, "lut_us": 28.0, "lut_ratio_vs_sdpa": 28 / 42,
         "dequant_sdpa_us": None, "ratio_vs_dequant": None, "bytes_per_step": 16.1e6, "floor_us": 6.6,
         "achieved_Bps": 16.1e6 / 28e-6, "frac_of_copy_bw": 0.24, "extra_alloc_bytes": 0, "fp_key_tensor_bytes": 3.3e7,
         "auto_path": "lut", "best_ratio_vs_sdpa": 28 / 42, "lut_kernel": {}, "tune_us": {}}
    r.update(kw)
    return r


def _res(rows, ncu):
    return {"device": "NVIDIA H100 80GB HBM3", "command": "harness bench --ncu", "torch": "2", "triton": "3",
            "copy_bandwidth_Bps": 2.4e12, "rows": rows, "encode": [], "correctness": {}, "lut_refused": {},
            "config": {}, "ncu": ncu}


def test_report_columns_show_ncu_figures_or_a_dash_with_a_note():
    figs = bench_ncu.per_path(bench_ncu.parse_csv(DETAILS), TOKEN_HEADS)
    measured = _row(ncu=figs)
    by_col = dict(zip(HEADER, cells(measured)))
    assert by_col["inst/tok"] == f"{figs['lut']['inst_per_token_head']:.1f}"
    assert by_col["tri inst/tok"] == f"{figs['triton']['inst_per_token_head']:.1f}"
    assert by_col["ncu MB"] == f"{figs['lut']['dram_bytes'] / 1e6:.2f}"
    assert by_col["floor us"] == "6.6" and by_col["of copy"] == "0.24"  # beside the bytes floor
    failed = _row(bits=2, ncu={"error": "ncu may not read the GPU's performance counters here (ERR_NVGPUCTRPERM)"})
    assert {dict(zip(HEADER, cells(failed)))[k] for k in ("inst/tok", "tri inst/tok", "ncu MB")} == {NO_NCU}
    md = to_markdown(_res([measured, failed], {"tool": "/usr/local/cuda/bin/ncu"}))
    assert "ERR_NVGPUCTRPERM" in md and "octopus@2" in md
    plain = to_markdown(_res([_row()], None))  # no --ncu: a dash and the note saying so
    assert "not measured (run with --ncu" in plain
    assert dict(zip(HEADER, cells(_row())))["inst/tok"] == NO_NCU


def test_bench_has_the_ncu_flag():
    assert build_parser().parse_args(["--ncu"]).ncu is True
    assert build_parser().parse_args([]).ncu is False
