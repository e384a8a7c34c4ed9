"""The tables of ``harness bench`` and the targets its rows are marked against: one line per measured row as
it runs, and the Markdown report (latency against SDPA, bandwidth against the bytes floor, the fixed cost at
the shortest context)."""
from __future__ import annotations


HEADER = ("shape", "B", "ctx", "codec", "b", "sdpa us", "triton us", "tri x sdpa", "lut us", "lut x sdpa",
          "deq us", "x deq", "MB/step", "floor us", "GB/s", "of copy", "inst/tok", "tri inst/tok", "ncu MB",
          "extra MB", "fp-key MB")
NO_NCU = "—"  # an ncu figure not measured (no --ncu, or ncu could not run: the report says why)


def _f(x, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _ncu(r: dict, path: str, key: str, fmt: str, scale: float = 1.0) -> str:
    fig = (r.get("ncu") or {}).get(path)
    return NO_NCU if not isinstance(fig, dict) or fig.get(key) is None else format(fig[key] * scale, fmt)


def cells(r: dict) -> list[str]:
    """One row's cells in HEADER's order; GB/s, 'of copy', 'inst/tok' and 'ncu MB' are the path 'auto'
    takes (LUT where it runs); 'tri inst/tok' is the Triton kernel's."""
    auto = r.get("auto_path", "triton")
    return [r["shape"], str(r["batch"]), f"{r['context'] // 1024}k", r["codec"], str(r["bits"]),
            f"{r['sdpa_us']:.1f}", _f(r["fused_us"], ".1f"), _f(r["ratio_vs_sdpa"], ".3f"),
            _f(r.get("lut_us"), ".1f"), _f(r.get("lut_ratio_vs_sdpa"), ".3f"),
            _f(r["dequant_sdpa_us"], ".0f"), _f(r["ratio_vs_dequant"], ".3f"),
            f"{r['bytes_per_step'] / 1e6:.2f}", _f(r.get("floor_us"), ".1f"), f"{r['achieved_Bps'] / 1e9:.0f}",
            f"{r['frac_of_copy_bw']:.2f}", _ncu(r, auto, "inst_per_token_head", ".1f"),
            _ncu(r, "triton", "inst_per_token_head", ".1f"), _ncu(r, auto, "dram_bytes", ".2f", 1e-6),
            f"{r['extra_alloc_bytes'] / 1e6:.2f}", f"{r['fp_key_tensor_bytes'] / 1e6:.1f}"]


def ncu_notes(res: dict) -> list[str]:
    """Why the ncu columns say '—': not asked for, ncu missing, or its error per row."""
    if not res.get("ncu"):
        return [f"{NO_NCU} in the ncu columns: not measured (run with --ncu; needs Nsight Compute's ncu)."]
    notes = {}
    for r in res["rows"]:
        err = (r.get("ncu") or {}).get("error")
        if err:
            notes.setdefault(err, []).append(f"{r['shape']} B={r['batch']} {r['context'] // 1024}k "
                                             f"{r['codec']}@{r['bits']}")
    return [f"{NO_NCU} in the ncu columns ({', '.join(rows)}): {err}" for err, rows in notes.items()]


def row_line(r: dict) -> str:
    c = cells(r)
    return f"{c[0]:<11} {c[1]:>2} {c[2]:>5} {c[3]:<15} {c[4]} " + " ".join(f"{x:>7}" for x in c[5:])


def fixed_costs(rows: list[dict]) -> list[dict]:
    """Per (shape, batch, codec, bits): the rows at the shortest context timed (the fixed cost of a step)."""
    first: dict = {}
    for r in rows:
        k = (r["shape"], r["batch"], r["codec"], r["bits"])
        if k not in first or r["context"] < first[k]["context"]:
            first[k] = r
    return list(first.values())


#: latency targets vs bf16 SDPA at >= 32k (H100), per codec and bits
TARGETS = {"octopus": {2: 0.5, 3: 0.5, 4: 0.7}}
TARGET_BW = 0.6  # fraction of copy bandwidth, at 2/3 bits at >= 32k, for the codecs in TARGETS


def add_targets(row: dict) -> None:
    """Mark a row of a codec in TARGETS at >= 32k: its target ratio to SDPA, whether the path 'auto'
    takes meets it, and (at 2-3 bits) whether it reaches TARGET_BW of copy bandwidth."""
    name, bits = row["codec"], row["bits"]
    if name in TARGETS and row["context"] >= 32 * 1024:
        row["target_ratio"] = TARGETS[name].get(bits)
        row["meets_ratio"] = row["best_ratio_vs_sdpa"] <= TARGETS[name].get(bits, 0)
        if bits in (2, 3):
            row["meets_bw"] = row["frac_of_copy_bw"] >= TARGET_BW



#: codec -> the codec it must be at least as fast as at the same bits (issue #16), in the 'auto' path's time
AS_FAST_AS = {"turboquant-mse": "octopus"}


def as_fast_as(rows: list[dict]) -> list[dict]:
    """Per row of a codec in AS_FAST_AS whose reference codec has the same (shape, batch, context,
    bits) row: both 'auto' paths' times and their ratio (<= 1: the target is met)."""
    t = {(r["shape"], r["batch"], r["context"], r["codec"], r["bits"]): r for r in rows}
    out = []
    for r in rows:
        ref = t.get((r["shape"], r["batch"], r["context"], AS_FAST_AS.get(r["codec"]), r["bits"]))
        if ref is None:
            continue
        mine, theirs = r["best_ratio_vs_sdpa"] * r["sdpa_us"], ref["best_ratio_vs_sdpa"] * ref["sdpa_us"]
        out.append({"shape": r["shape"], "batch": r["batch"], "context": r["context"], "bits": r["bits"],
                    "codec": r["codec"], "ref": ref["codec"], "us": mine, "ref_us": theirs, "ratio": mine / theirs,
                    "x_sdpa": r["best_ratio_vs_sdpa"], "ref_x_sdpa": ref["best_ratio_vs_sdpa"],
                    "path": r.get("auto_path"), "ref_path": ref.get("auto_path")})
    return out


def to_markdown(res: dict) -> str:
    lines = [f"# harness bench — {res['device']}", "",
             f"`{res['command']}`", "",
             f"torch {res['torch']}, triton {res['triton']}; copy bandwidth {res['copy_bandwidth_Bps'] / 1e9:.0f} GB/s "
             "(read + write). Latency per decode step (CUDA-graph replay, median); 'triton' = the fused Triton "
             "kernel, 'lut' = the table-lookup CUDA kernel (OCTOPUS, TurboQuant-MSE and their QJL forms; what "
             "backend 'auto' runs where it applies); "
             "'x sdpa' = that kernel / bf16 SDPA (flash) on the uncompressed cache; 'x deq' = the 'auto' path / "
             "(PyTorch decode + SDPA); MB/step = compulsory bytes (compressed states + native window + query); "
             "floor = MB/step / copy bandwidth; GB/s and 'of copy' = achieved bandwidth of the 'auto' path "
             "(LUT where it runs) / copy bandwidth; 'inst/tok' = warp instructions (ncu smsp__inst_executed.sum) of "
             "that path's kernels per token and KV head (/ batch x KV heads x context), 'tri inst/tok' the Triton "
             "kernel's, 'ncu MB' = DRAM bytes read + written by that path's kernels (ncu, caches flushed), next to "
             "MB/step; 'extra MB' = device memory one Triton step allocates (split "
             "workspace), next to the size a full-precision key tensor would take.", "",
             "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for r in res["rows"]:
        lines.append("| " + " | ".join(cells(r)) + " |")
    lines += [""] + ncu_notes(res)
    fixed = fixed_costs(res["rows"])
    if fixed:
        lines += ["", "## Fixed cost (the time at the shortest context timed)", "",
                  "| shape | B | ctx | codec | b | sdpa us | triton us | lut us | floor us |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in fixed:
            lines.append(f"| {r['shape']} | {r['batch']} | {r['context'] // 1024}k | {r['codec']} | {r['bits']} | "
                         f"{r['sdpa_us']:.1f} | {_f(r['fused_us'], '.1f')} | {_f(r.get('lut_us'), '.1f')} | "
                         f"{_f(r.get('floor_us'), '.1f')} |")
    tgt = [r for r in res["rows"] if "target_ratio" in r]
    if tgt:
        lines += ["", "## Targets (OCTOPUS, context >= 32k, the path 'auto' takes): latency <= 0.5x SDPA at 2-3 "
                  "bits (0.7x at 4) and >= 60% of copy bandwidth at 2-3 bits", "",
                  "| shape | B | ctx | bits | path | x sdpa | meets | of copy | meets |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in tgt:
            bw = "-" if "meets_bw" not in r else ("yes" if r["meets_bw"] else "no")
            lines.append(f"| {r['shape']} | {r['batch']} | {r['context'] // 1024}k | {r['bits']} | "
                         f"{r.get('auto_path', 'triton')} | {r.get('best_ratio_vs_sdpa', r['ratio_vs_sdpa']):.3f} | "
                         f"{'yes' if r['meets_ratio'] else 'no'} | {r['frac_of_copy_bw']:.2f} | {bw} |")
    rel = as_fast_as(res["rows"])
    if rel:
        lines += ["", "## At least as fast as (same bits, the paths 'auto' takes): time / the other codec's time "
                  "<= 1", "",
                  "| shape | B | ctx | bits | codec (path) | us | x sdpa | vs (path) | us | x sdpa | ratio | meets |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for x in rel:
            lines.append(f"| {x['shape']} | {x['batch']} | {x['context'] // 1024}k | {x['bits']} | "
                         f"{x['codec']} ({x['path']}) | "
                         f"{x['us']:.1f} | {x['x_sdpa']:.3f} | {x['ref']} ({x['ref_path']}) | {x['ref_us']:.1f} | "
                         f"{x['ref_x_sdpa']:.3f} | {x['ratio']:.3f} | {'yes' if x['ratio'] <= 1 else 'no'} |")
    cmp_rows = [r for r in res["rows"] if r.get("lut_compare_us") is not None]
    if cmp_rows:
        lines += ["", f"## Table-lookup kernel against the variant {res['config'].get('lut_compare')} (same rows, "
                  "same process)", "",
                  "| shape | B | ctx | codec | b | sdpa us | lut us | variant us | lut x sdpa | variant x sdpa "
                  "| lut / variant |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in cmp_rows:
            lines.append(f"| {r['shape']} | {r['batch']} | {r['context'] // 1024}k | {r['codec']} | {r['bits']} | "
                         f"{r['sdpa_us']:.1f} | "
                         f"{r['lut_us']:.1f} | {r['lut_compare_us']:.1f} | {r['lut_ratio_vs_sdpa']:.3f} | "
                         f"{r['lut_compare_ratio_vs_sdpa']:.3f} | {r['lut_us'] / r['lut_compare_us']:.3f} |")
    if res.get("lut_refused"):
        lines += ["", "## Table-lookup kernel not run", ""]
        lines += [f"- {k}: {v}" for k, v in res["lut_refused"].items()]
    lut = next((r["lut_kernel"] for r in reversed(res["rows"]) if r.get("lut_kernel")), None)
    if lut:
        lines += ["", f"lut_split (last row): {lut.get('regs')} registers, {lut.get('local_bytes')} B local, "
                  f"{lut.get('smem')} B shared"]
    if res["encode"]:
        lines += ["", "## Encode throughput (4 KV heads, d=128, bf16 keys)", "",
                  "| codec | bits | fused M vec/s | torch M vec/s | speedup | bytes equal |",
                  "|---|---|---|---|---|---|"]
        for e in res["encode"]:
            lines.append(f"| {e['codec']} | {e['bits']} | {e['fused_vec_per_s'] / 1e6:.1f} | "
                         f"{e['torch_vec_per_s'] / 1e6:.2f} | {e['speedup']:.0f}x | {e['bytes_equal_frac']} |")
    if res["correctness"]:
        lines += ["", "## Fused vs PyTorch reference (real encoded keys, relative error of the output)", ""]
        lines += [f"- {k}: {v:.2e}" for k, v in res["correctness"].items()]
    return "\n".join(lines) + "\n"
