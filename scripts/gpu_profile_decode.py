"""Where the fused decode-attention kernel spends its time (GPU only).

python -m scripts.gpu_profile_decode time [--ctx 32k] [--batch 1]
    per codec/bits: the kernel, and ablations (no key decode, no value decode, neither,
    no prefetch), each as latency per step and against bf16 SDPA, timed by CUDA-graph replay.
python -m scripts.gpu_profile_decode once CODEC BITS [--ctx 32k]
    a few launches of one configuration, for ncu (--kernel-name regex:_split_kernel).
python -m scripts.gpu_profile_decode sass CODEC BITS OUTFILE
    the split kernel's SASS and an opcode histogram.
"""
from __future__ import annotations

import argparse
import collections
import re
from pathlib import Path

import torch

from harness.bench import parse_ctx, random_state, sdpa_backend_fn, time_graph, triton_path
from kernels import make_codec

HQ, HKV, D = 28, 4, 128


def setup(name, bits, T, B, ncp=1):
    """(codec, its Triton launcher with the profiling knobs, ncp random states, q, window keys, window values)."""
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    codec = make_codec(name, bits, D, seed=0, layer=0, num_heads=HKV, device=dev)
    states = [random_state(codec, B, HKV, T, dev, g) for _ in range(ncp)]
    q = torch.randn(B, HQ, 1, D, device=dev, dtype=torch.bfloat16)
    wk = torch.randn(B, HKV, 32, D, device=dev, dtype=torch.bfloat16)
    wv = torch.randn_like(wk)
    return codec, triton_path(codec)[1], states, q, wk, wv


def cmd_time(a):
    T, B = parse_ctx(a.ctx), a.batch
    dev = torch.device("cuda")
    k = torch.randn(B, HKV, T, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    qs = torch.randn(B, HQ, 1, D, device=dev, dtype=torch.bfloat16)
    fn, _ = sdpa_backend_fn(qs, k, v, True)
    t_sdpa = time_graph(fn, a.rep_ms)
    print(f"ctx {a.ctx} B {B}: sdpa {t_sdpa * 1e6:.1f} us", flush=True)
    variants = {"full": {}, "nokeys": {"ablate": 1}, "novals": {"ablate": 2}, "neither": {"ablate": 3},
                "noprefetch": {"prefetch": 0},
                "neither-nopf": {"ablate": 3, "prefetch": 0}, "split-only": {"ablate": 4},
                "split-neither-nopf": {"ablate": 7, "prefetch": 0}}
    for spec in a.configs.split(","):
        name, bits = spec.split("@")
        codec, launch, states, q, wk, wv = setup(name, int(bits), T, B, ncp=8)
        row, launched = [], {}
        for label, kw in variants.items():
            kw = kw | a.extra

            def f(kw=kw):
                for ks, vs in states:
                    launch(q, ks, vs, codec, wk, wv, record=launched, **kw)

            t = time_graph(f, a.rep_ms) / len(states)
            row.append(f"{label} {t * 1e6:.1f} ({t / t_sdpa:.2f}x)")
        kk = launched.get("split")
        print(f"{spec}: " + ", ".join(row) + f" | regs {getattr(kk, 'n_regs', '?')}", flush=True)


def cmd_once(a):
    codec, launch, states, q, wk, wv = setup(a.codec, a.bits, parse_ctx(a.ctx), a.batch)
    ks, vs = states[0]
    for _ in range(3):
        launch(q, ks, vs, codec, wk, wv, **a.extra)
    torch.cuda.synchronize()


def cmd_sass(a):
    codec, launch, states, q, wk, wv = setup(a.codec, a.bits, 4096, 1)
    ks, vs = states[0]
    launched = {}
    launch(q, ks, vs, codec, wk, wv, record=launched, **a.extra)
    k = launched["split"]
    import subprocess
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.asm["cubin"])
        f.flush()
        sass = subprocess.run(["cuobjdump", "-sass", f.name], capture_output=True, text=True).stdout
    Path(a.out).write_text(sass)
    # an instruction: its address comment, an optional predicate, the opcode
    opcode = re.compile(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)")
    ops = collections.Counter(m.group(1).split(".")[0] for m in opcode.finditer(sass))
    print(f"{a.codec}@{a.bits}: regs {k.n_regs} spills {k.n_spills} smem {k.metadata.shared}; "
          f"{sum(ops.values())} SASS instructions")
    print(", ".join(f"{o} {n}" for o, n in ops.most_common(30)))


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("time")
    t.add_argument("--configs", default="octopus@2,octopus@3,octopus@4,turboquant-mse@3")
    for s in (t, sub.add_parser("once"), sub.add_parser("sass")):
        if s.prog.endswith(("once", "sass")):
            s.add_argument("codec")
            s.add_argument("bits", type=int)
        if s.prog.endswith("sass"):
            s.add_argument("out")
        s.add_argument("--ctx", default="32k")
        s.add_argument("--batch", type=int, default=1)
        s.add_argument("--rep-ms", type=int, default=60)
        s.add_argument("--kw", default="", help="extra kernel kwargs, k=v,k=v (ints)")
    a = p.parse_args()
    a.extra = {kv.split("=")[0]: int(kv.split("=")[1]) for kv in a.kw.split(",") if kv}
    {"time": cmd_time, "once": cmd_once, "sass": cmd_sass}[a.cmd](a)


if __name__ == "__main__":
    main()
