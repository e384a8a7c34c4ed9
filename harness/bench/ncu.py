"""``harness bench --ncu``: warp instructions and DRAM bytes of the decode kernels, from Nsight Compute.

Per benchmark row, one child process (:data:`CHILD`: :func:`child` of the row's SPEC) builds the
row's inputs (random states of the codec's exact layout, as the benchmark times them) and launches
each decode path once ('lut': ``lut_qprep`` where it runs, ``lut_split``, ``lut_combine``; 'triton':
``_split_kernel`` + ``_combine_kernel``, the launcher :func:`harness.bench.inputs.triton_path` gives)
under ``ncu --csv``, which reads :data:`METRICS` of those kernels only (``--kernel-name``; clocks
left as they are: ``--clock-control none``). The parent parses ncu's CSV (:func:`parse_csv`) and
sums the kernels of each path (:func:`per_path`):

- ``inst_per_token_head`` = warp instructions executed (``smsp__inst_executed.sum``) over
  batch x KV heads x context tokens;
- ``dram_bytes`` = bytes read + written in device memory (against the compulsory bytes per step);
- ``kernel_us`` = the kernels' duration under the profiler (replayed one at a time: not the
  benchmark's latency).

Where ncu is missing, not permitted to read the counters, or fails, :func:`measure` returns
``{"error": why}`` and the report prints "—" with that note. ncu replays every kernel once per
metric pass: several seconds per row, hence opt-in.
"""
from __future__ import annotations

import csv
import glob
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from harness.bench.inputs import random_state, triton_path

METRICS = ("smsp__inst_executed.sum", "dram__bytes_read.sum", "dram__bytes_write.sum", "gpu__time_duration.sum")
#: the kernels of each decode path (names as ncu prints them); a kernel not named here is not read
PATH_KERNELS = {"lut": ("lut_qprep", "lut_split", "lut_combine"), "triton": ("_split_kernel", "_combine_kernel")}
NOT_PERMITTED = "ERR_NVGPUCTRPERM"
_SCALE = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
_TIME_NS = {"ns": 1.0, "nsecond": 1.0, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6, "s": 1e9, "second": 1e9}
_ROOT = Path(__file__).resolve().parents[2]
#: the program ncu runs, with the row's SPEC (JSON) as its one argument
CHILD = "import json, sys; from harness.bench.ncu import child; sys.exit(child(json.loads(sys.argv[1])))"


def find_ncu() -> str | None:
    """The ncu executable: $NCU, else ncu on PATH, else the usual CUDA / Nsight Compute folders."""
    env = os.environ.get("NCU")
    if env:
        return env if Path(env).exists() or shutil.which(env) else None
    found = shutil.which("ncu")
    if found:
        return found
    for pat in ("/usr/local/cuda/bin/ncu", "/opt/nvidia/nsight-compute/*/ncu", "/usr/local/cuda-*/bin/ncu"):
        hits = sorted(glob.glob(pat))
        if hits:
            return hits[-1]
    return None


def _number(text: str) -> float | None:
    s = text.strip().replace(",", "")
    if s in ("", "n/a", "N/A"):
        return None
    try:
        return float(s)
    except ValueError:
        return None


def to_base(value: float, unit: str) -> float:
    """A metric value in ncu's display unit -> base units (instructions, bytes, nanoseconds).
    ncu scales units unless told ``--print-units base`` (e.g. 'Mbyte', 'usecond', 'Kinst'); with it,
    times are 'ns' (ncu 2025.3)."""
    u = unit.strip()
    if u in _TIME_NS:
        return value * _TIME_NS[u]
    for base in ("byte", "inst"):
        if u.endswith(base) and u[: -len(base)] in _SCALE:
            return value * _SCALE[u[: -len(base)]]
    return value


def parse_csv(text: str) -> list[dict]:
    """ncu ``--csv`` output (its own '==PROF==' lines and the program's output may surround it) ->
    one dict per profiled kernel launch: {"id", "kernel", metric: value in base units, ...}, in
    launch order. Reads both layouts: one row per (launch, metric) ('details' page, columns
    'Metric Name' / 'Metric Unit' / 'Metric Value') and one row per launch ('raw' page, a column per
    metric, the units in the row under the header)."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith('"ID"') and '"Kernel Name"' in ln), None)
    if start is None:
        return []
    body = [ln for ln in lines[start:] if ln.startswith('"')]
    rows = list(csv.reader(io.StringIO("\n".join(body))))
    head, data = rows[0], rows[1:]
    col = {name: i for i, name in enumerate(head)}
    launches: dict[str, dict] = {}
    if "Metric Name" in col:
        for r in data:
            if len(r) < len(head):
                continue
            rec = launches.setdefault(r[col["ID"]], {"id": r[col["ID"]], "kernel": r[col["Kernel Name"]]})
            v = _number(r[col["Metric Value"]])
            if v is not None:
                rec[r[col["Metric Name"]]] = to_base(v, r[col["Metric Unit"]])
        return list(launches.values())
    units = {}
    if data and data[0][col["ID"]] == "":  # the units row of the raw page
        units = {head[i]: u for i, u in enumerate(data[0])}
        data = data[1:]
    out = []
    for r in data:
        if len(r) < len(head):
            continue
        rec = {"id": r[col["ID"]], "kernel": r[col["Kernel Name"]]}
        for m in METRICS:
            if m in col:
                v = _number(r[col[m]])
                if v is not None:
                    rec[m] = to_base(v, units.get(m, ""))
        out.append(rec)
    return out


def kernel_path(name: str) -> str | None:
    """Which decode path a kernel belongs to ('lut', 'triton'), by its name; None: neither."""
    base = name.split("(")[0].strip()
    for path, names in PATH_KERNELS.items():
        if base in names:
            return path
    return None


def per_path(launches: list[dict], token_heads: int) -> dict:
    """Sum the launches of each path -> {path: {"inst", "inst_per_token_head", "dram_bytes",
    "kernel_us", "kernels"}}; ``token_heads`` = batch x KV heads x context."""
    out: dict[str, dict] = {}
    for rec in launches:
        path = kernel_path(rec["kernel"])
        if path is None:
            continue
        p = out.setdefault(path, {"inst": 0.0, "dram_bytes": 0.0, "kernel_us": 0.0, "kernels": []})
        p["inst"] += rec.get("smsp__inst_executed.sum", 0.0)
        p["dram_bytes"] += rec.get("dram__bytes_read.sum", 0.0) + rec.get("dram__bytes_write.sum", 0.0)
        p["kernel_us"] += rec.get("gpu__time_duration.sum", 0.0) / 1e3
        p["kernels"].append(rec["kernel"].split("(")[0].strip())
    for p in out.values():
        p["inst_per_token_head"] = p["inst"] / max(token_heads, 1)
    return out


def failure_note(returncode: int, text: str) -> str:
    """One line saying why an ncu run gave no figures."""
    if NOT_PERMITTED in text:
        return f"ncu may not read the GPU's performance counters here ({NOT_PERMITTED})"
    if "No kernels were profiled" in text:
        return "ncu profiled no decode kernel"
    last = [ln.strip() for ln in text.splitlines() if ln.strip()]
    tail = next((ln for ln in reversed(last) if "ERROR" in ln or "Error" in ln), last[-1] if last else "")
    return f"ncu failed (exit {returncode}): {tail[:200]}"


def command(ncu: str, spec: dict) -> list[str]:
    kernels = "|".join(n for names in PATH_KERNELS.values() for n in names)
    return [ncu, "--csv", "--print-units", "base", "--clock-control", "none", "--metrics", ",".join(METRICS),
            "--kernel-name", f"regex:^({kernels})$", sys.executable, "-c", CHILD, json.dumps(spec)]


def measure(spec: dict, timeout: float = 300.0) -> dict:
    """Profile one benchmark row's decode paths under ncu. ``spec``: {"shape": (Hq, Hkv, d),
    "batch", "context", "window", "codec", "bits", "paths": [...], "lut_config", "triton_kw"}. -> {path: figures}
    (see :func:`per_path`) or {"error": why}."""
    ncu = find_ncu()
    if ncu is None:
        return {"error": "ncu not found (PATH, $NCU, /usr/local/cuda/bin, /opt/nvidia/nsight-compute)"}
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(_ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    try:
        p = subprocess.run(command(ncu, spec), capture_output=True, text=True, timeout=timeout, env=env, cwd=_ROOT)
    except subprocess.TimeoutExpired:
        return {"error": f"ncu took longer than {timeout:.0f} s"}
    except OSError as e:
        return {"error": f"ncu could not start ({e})"}
    text = p.stdout + "\n" + p.stderr
    res = per_path(parse_csv(p.stdout), spec["batch"] * spec["shape"][1] * spec["context"])
    missing = [x for x in spec["paths"] if x not in res]
    if p.returncode != 0 or missing:
        note = failure_note(p.returncode, text)
        if not res:
            return {"error": note}
        res["error"] = f"no figures for {', '.join(missing)}: {note}" if missing else note
    return res


def child(spec: dict) -> int:
    """Inside ncu: build the row's inputs and launch each path once (nothing else is profiled)."""
    import torch

    from kernels import make_codec

    dev = torch.device("cuda")
    Hq, Hkv, d = spec["shape"]
    B, ctx = spec["batch"], spec["context"]
    W = min(spec["window"], ctx)
    g = torch.Generator(device=dev).manual_seed(1234)
    codec = make_codec(spec["codec"], spec["bits"], d, seed=0, layer=0, num_heads=Hkv, device=dev)
    ks, vs = random_state(codec, B, Hkv, ctx - W, dev, g)
    q = torch.randn(B, Hq, 1, d, device=dev, generator=g).to(torch.bfloat16)
    wk = torch.randn(B, Hkv, W, d, device=dev, generator=g).to(torch.bfloat16)
    wv = torch.randn(B, Hkv, W, d, device=dev, generator=g).to(torch.bfloat16)
    torch.cuda.synchronize()
    for path in spec["paths"]:
        if path == "lut":
            from kernels.cuda.decode_lut import decode_attention_lut

            cfg = spec.get("lut_config")
            decode_attention_lut(q, ks, vs, codec, wk, wv, **({"config": cfg} if cfg else {}))
        elif path == "triton":
            triton_path(codec)[1](q, ks, vs, codec, wk, wv, **spec.get("triton_kw", {}))
        else:
            raise SystemExit(f"unknown path {path!r}")
        torch.cuda.synchronize()
    return 0
