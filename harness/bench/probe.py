"""``harness probe``: the synthetic probe (OCTOPUS paper, Table 1 protocol).

Isotropic Gaussian keys and queries; per codec and bit width: unit-direction MSE,
reconstruction cosine, inner-product error with the codec's own estimator, and the true
bits per coordinate counted from the stored bytes. Plus a needle test, the OCTOPUS bit-split
sweep and the agreement of local 3x3 joint rounding with the full grid. Writes probe.json,
report.md and rate_distortion.png under --out.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

from kernels import list_codecs, make_codec, private_generator
from metrics.probe import cosine, ip_error, needle_mass, unit_mse

from harness.run.rows import atomic_write, write_via

DEFAULT_BITS = (1, 2, 3, 4)
NEEDLE_KEYS = 4096
NEEDLE_QUERIES = 64
NEEDLE_NOISE = 2.0  # query = needle + N(0, NEEDLE_NOISE^2 I): fp32 mass on the needle ~0.9 at d=128


def default_codecs() -> list[str]:
    return [c for c in list_codecs() if c != "none"]


def _fmt(x: float, nd: int = 4) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    if x == 0 or 1e-3 <= abs(x) < 1e4:
        return f"{x:.{nd}f}"
    return f"{x:.{nd - 1}e}"


def measure(codec_name: str, bits: int, dim: int, n: int, seed: int, **options) -> dict:
    """One (codec, bits, seed) cell of the table."""
    codec = make_codec(codec_name, bits, dim, seed=seed, **options)
    g = private_generator("probe-data", dim, n, seed)
    keys = torch.randn(n, dim, generator=g)
    queries = torch.randn(n, dim, generator=g)
    k_unit = keys / keys.norm(dim=-1, keepdim=True)
    q_unit = queries / queries.norm(dim=-1, keepdim=True)
    # encode in chunks so that the codec's own score matrix per chunk stays small; rate is
    # counted over every stored byte
    k_hat, est, nbytes = [], [], 0
    for i in range(0, n, 512):
        state = codec.encode(k_unit[i:i + 512])
        nbytes += state.nbytes()
        k_hat.append(codec.decode(state).float())
        est.append(torch.diagonal(codec.score(q_unit[i:i + 512], state)))
    k_hat, est = torch.cat(k_hat), torch.cat(est)
    true_ip = (q_unit * k_unit).sum(-1)
    row = {
        "codec": codec_name, "bits": bits, "seed": seed,
        "true_bits": 8.0 * nbytes / (n * dim),
        "unit_mse": unit_mse(k_unit, k_hat),
        "cosine": cosine(k_unit, k_hat),
        "ip_error": ip_error(true_ip, est),
    }
    row.update(_needle(codec, dim, seed))
    return row


def _needle(codec, dim: int, seed: int) -> dict:
    """One needle among Gaussian distractors; noisy queries; softmax mass on it vs fp32."""
    g = private_generator("probe-needle", dim, seed)
    keys = torch.randn(NEEDLE_KEYS, dim, generator=g)
    needle = int(torch.randint(0, NEEDLE_KEYS, (1,), generator=g))
    q = keys[needle] + NEEDLE_NOISE * torch.randn(NEEDLE_QUERIES, dim, generator=g)
    scale = 1 / math.sqrt(dim)
    ref = (q @ keys.T) * scale
    est = codec.score(q, codec.encode(keys)) * scale
    return {
        "needle_mass_fp32": needle_mass(ref, needle),
        "needle_mass": needle_mass(est, needle),
        "needle_top1": float((est.argmax(-1) == needle).double().mean()),
    }


def split_sweep(dim: int, bits: tuple[int, ...], n: int, seeds: int) -> list[dict]:
    """OCTOPUS bit splits at nominal b: every (b_u, b_u, b_r) with 2 b_u + b_r = 3 b, i.e. the line
    (b+k, b+k, b-2k), which holds the rate fixed; plus the paper's default (b+1, b+1, b-1), which
    spends one more bit per triplet and so sits off that line."""
    if "octopus" not in list_codecs():
        return []
    bits = tuple(b for b in bits if b in list_codecs()["octopus"])
    out = []
    keys = ("true_bits", "unit_mse", "cosine", "ip_error")
    for b in bits:
        splits = [(b + k, b - 2 * k, k) for k in range(-b, b + 1)]
        splits = [(bu, br, k) for bu, br, k in splits if 1 <= bu <= 8 and 0 <= br <= 7]
        splits.append((b + 1, b - 1, None))
        for b_u, b_r, k in splits:
            if b_r < 0:
                continue
            rows = [measure("octopus", b, dim, n, s, split=(b_u, b_r)) for s in range(seeds)]
            out.append({"bits": b, "k": k, "split": [b_u, b_u, b_r], "default": k is None, **_mean(rows, keys)})
    return out


def rounding_agreement(dim: int, bits: tuple[int, ...], n: int, seed: int) -> list[dict]:
    """How often local 3x3 joint rounding reaches the full-grid optimum, at the default b_u = b + 1."""
    try:
        from kernels.joint_rounding import local_full_agreement
    except ImportError:
        return []
    out = []
    for b in bits:
        g = private_generator("probe-rounding", dim, seed, b)
        trip = torch.randn(n, 3, generator=g)
        out.append({"bits": b, "b_u": b + 1, "agreement": local_full_agreement(trip, b + 1)})
    return out


def _mean(rows: list[dict], keys) -> dict:
    return {k: sum(r[k] for r in rows) / len(rows) for k in keys}


def matched_rate(table: list[dict], rates: list[float]) -> dict:
    """Unit MSE of each codec interpolated (log-linear in bits) at common TRUE rates."""
    out: dict[str, dict[str, float | None]] = {}
    by_codec: dict[str, list[tuple[float, float]]] = {}
    for r in table:
        by_codec.setdefault(r["codec"], []).append((r["true_bits"], r["unit_mse"]))
    for c, pts in by_codec.items():
        pts.sort()
        out[c] = {}
        for rate in rates:
            val = None
            for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
                if x0 <= rate <= x1 and x1 > x0 and y0 > 0 and y1 > 0:
                    t = (rate - x0) / (x1 - x0)
                    val = math.exp(math.log(y0) * (1 - t) + math.log(y1) * t)
                    break
            out[c][f"{rate:g}"] = val
    return out


def write_report(out: Path, result: dict) -> None:
    table, dim = result["table"], result["config"]["dim"]
    lines = [f"# Synthetic probe, d = {dim}", "",
             f"Isotropic Gaussian keys and queries, {result['config']['n']} vectors x "
             f"{result['config']['seeds']} seeds (means over seeds). MSE is E||u - û||² of the unit "
             "direction; IP error is mean |<q,k> - estimate| for unit q, k with each codec's own "
             "estimator; true bits per coordinate are counted from the bytes each codec stores "
             "(norms, scales and zero points included). Lower bound: 4^-b at the true rate.", "",
             "## At nominal bits", "",
             "| codec | bits | true bits/coord | unit MSE | 4^-true | cosine | IP error | needle mass (fp32) "
             "| needle top-1 |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(table, key=lambda r: (r["bits"], r["unit_mse"])):
        lines.append(f"| {r['codec']} | {r['bits']} | {r['true_bits']:.3f} | {_fmt(r['unit_mse'])} | "
                     f"{_fmt(4 ** -r['true_bits'])} | {r['cosine']:.4f} | {_fmt(r['ip_error'])} | "
                     f"{r['needle_mass']:.3f} ({r['needle_mass_fp32']:.3f}) | {r['needle_top1']:.3f} |")
    rates = result["matched_rate"]
    rate_keys = list(next(iter(rates.values())).keys()) if rates else []
    lines += ["", "## At matched true rate", "",
              "Unit MSE interpolated log-linearly between measured bit widths (— where the codec's "
              "measured range does not cover the rate).", "",
              "| codec | " + " | ".join(f"{k} b" for k in rate_keys) + " |",
              "|---|" + "---|" * len(rate_keys)]
    for c, vals in sorted(rates.items()):
        lines.append(f"| {c} | " + " | ".join(_fmt(vals[k]) for k in rate_keys) + " |")
    if result["split_sweep"]:
        lines += ["", "## OCTOPUS bit split", "",
                  "Every split (b+k, b+k, b-2k) spends 3b bits per triplet (the same true rate); the "
                  "paper's default (b+1, b+1, b-1) spends 3b+1 and is listed last for each b.", "",
                  "| bits | split (b_u, b_u, b_r) | true bits | unit MSE | cosine | IP error |",
                  "|---|---|---|---|---|---|"]
        for r in result["split_sweep"]:
            mark = " (default, +1 bit/triplet)" if r["default"] else f" k={r['k']}"
            lines.append(f"| {r['bits']} | {tuple(r['split'])}{mark} | {r['true_bits']:.3f} | "
                         f"{_fmt(r['unit_mse'])} | {r['cosine']:.4f} | {_fmt(r['ip_error'])} |")
    if result["rounding_agreement"]:
        lines += ["", "## Local 3x3 joint rounding vs full grid", "", "| bits | b_u | agreement |", "|---|---|---|"]
        for r in result["rounding_agreement"]:
            lines.append(f"| {r['bits']} | {r['b_u']} | {r['agreement']:.4f} |")
    lines += ["", "![rate-distortion](rate_distortion.png)", ""]
    atomic_write(out / "report.md", "\n".join(lines))


def plot(out: Path, table: list[dict], dim: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for c in sorted({r["codec"] for r in table}):
        pts = sorted((r["true_bits"], r["unit_mse"]) for r in table if r["codec"] == c)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=c)
    xs = [x / 10 for x in range(5, 91)]
    lo = min(r["true_bits"] for r in table)
    hi = max(r["true_bits"] for r in table)
    xs = [x for x in xs if lo - 0.2 <= x <= hi + 0.2]
    ax.plot(xs, [4 ** -x for x in xs], "k--", lw=1, label="4^-b bound")
    ax.set_yscale("log")
    ax.set_xlabel("true bits per coordinate")
    ax.set_ylabel("unit-direction MSE")
    ax.set_title(f"Rate-distortion, d = {dim}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    write_via(out / "rate_distortion.png", lambda p: fig.savefig(p, dpi=110, metadata={"Software": None}))
    plt.close(fig)


def validate(dim: int, bits, n: int, seeds: int, codecs, out: Path | None) -> tuple[tuple[int, ...], list[str]]:
    """Check every argument before any work; returns (bits, codecs) with repeats dropped. Raises
    ValueError naming the flag and what it takes. Each codec is built once at ``dim``, so a head
    dimension a codec cannot take is refused here, not after the cells before it ran."""
    supported = list_codecs()
    for c in codecs:
        if c not in supported:
            raise ValueError(f"Unknown codec '{c}'. Available: {', '.join(supported)}")
    if dim < 2:
        raise ValueError(f"--dim must be a head dimension >= 2, got {dim}")
    if n < 1:
        raise ValueError(f"--n must be >= 1 vectors per seed, got {n}")
    if seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {seeds}")
    known = sorted({b for c in supported for b in supported[c]})
    for b in bits:
        if b not in known:
            raise ValueError(f"--bits {b}: no codec supports it; use {known[0]}..{known[-1]}")
    bits, codecs = tuple(dict.fromkeys(bits)), list(dict.fromkeys(codecs))
    for c in codecs:
        b = next((b for b in bits if b in supported[c]), None)
        if b is not None:
            try:
                make_codec(c, b, dim, seed=0)
            except (ValueError, TypeError) as e:
                raise ValueError(f"--dim {dim}: {e}; pick another --dim or leave {c} out of --codecs") from None
    if out is not None and out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file, not a folder; pass a folder path")
    return bits, codecs


def run(dim: int = 128, bits=DEFAULT_BITS, n: int = 4096, seeds: int = 3, codecs=None, out: Path | None = None,
        sweep: bool = True, progress: bool = True) -> dict:
    """The probe; with ``out``, probe.json (written last, atomically: never a partial one),
    report.md and rate_distortion.png there."""
    bits, codecs = validate(dim, bits, n, seeds, codecs or default_codecs(), out)
    supported = list_codecs()
    cells = [(c, b) for c in codecs for b in bits if b in supported[c]]
    skipped = [(c, b) for c in codecs for b in bits if b not in supported[c]]
    table = []
    from tqdm import tqdm

    for c, b in tqdm(cells, desc="probe", disable=not progress, file=sys.stderr):
        rows = [measure(c, b, dim, n, s) for s in range(seeds)]
        keys = ("true_bits", "unit_mse", "cosine", "ip_error", "needle_mass", "needle_mass_fp32", "needle_top1")
        table.append({"codec": c, "bits": b, **_mean(rows, keys)})
    rates = [r / 2 for r in range(2, 11)]
    result = {
        "config": {"dim": dim, "bits": list(bits), "n": n, "seeds": seeds, "codecs": list(codecs)},
        "skipped": [{"codec": c, "bits": b, "supported": list(supported[c])} for c, b in skipped],
        "table": table,
        "matched_rate": matched_rate(table, rates),
        "split_sweep": split_sweep(dim, tuple(b for b in bits if b >= 1), min(n, 2048), seeds) if sweep else [],
        "rounding_agreement": rounding_agreement(dim, tuple(b for b in bits if b >= 2), 20000, 0) if sweep else [],
    }
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        write_report(out, result)
        if table:
            plot(out, table, dim)
        atomic_write(out / "probe.json", json.dumps(result, indent=1, sort_keys=True) + "\n")
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="harness probe", description=__doc__.splitlines()[0])
    ap.add_argument("--dim", type=int, default=128, help="head dimension (default 128)")
    ap.add_argument("--bits", type=int, nargs="+", default=list(DEFAULT_BITS), help="nominal bit widths")
    ap.add_argument("--n", type=int, default=4096, help="vectors per seed (default 4096)")
    ap.add_argument("--seeds", type=int, default=3, help="number of seeds averaged (default 3)")
    ap.add_argument("--codecs", nargs="+", default=None, help="codecs (default: every registered one)")
    ap.add_argument("--no-sweep", action="store_true", help="skip the split sweep and rounding agreement")
    ap.add_argument("--out", type=Path, default=None, help="output folder (default reports/probe-d<dim>)")
    args = ap.parse_args(argv)
    out = args.out or Path("reports") / f"probe-d{args.dim}"
    t0 = time.perf_counter()
    run(args.dim, tuple(args.bits), args.n, args.seeds, args.codecs, out, sweep=not args.no_sweep)
    print((out / "report.md").read_text())
    print(f"wrote {out}/probe.json, report.md, rate_distortion.png in {time.perf_counter() - t0:.1f} s",
          file=sys.stderr)
    return 0

