"""Regenerate the shipped Lloyd–Max codebooks in kernels/codebooks/ (deterministic).

    python -m scripts.make_codebooks            # all kinds
    python -m scripts.make_codebooks --check    # regenerate in memory and compare with the files

Which (kind, d, bits) are shipped is listed in SHIPPED below; anything else is trained on
first use and cached (see kernels/lloyd_max.py).
"""
from __future__ import annotations

import argparse
import json

from kernels.lloyd_max import SHIPPED_DIR, codebook_key, train

SHIPPED = {
    "coord": [(d, b) for d in (32, 64, 128, 256) for b in range(0, 9)],
    "triplet_norm": [(d, b) for d in (32, 64, 128, 256) for b in range(0, 8)],
    "octa": [(0, b) for b in range(1, 9)],
    "polar": [(0, b, level) for level in range(1, 8) for b in range(1, 9)],
    "gauss": [(0, b) for b in range(1, 9)],
}


def build(kind: str) -> dict[str, list[float]]:
    out = {}
    for entry in SHIPPED[kind]:
        if kind == "polar":
            d, b, level = entry
            k = f"polar{level}"
        else:
            (d, b), k = entry, kind
        out[codebook_key(k, d, b)] = [float(x) for x in train(k, d, b).tolist()]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare with the shipped files instead of writing")
    ap.add_argument("--kinds", nargs="*", default=list(SHIPPED))
    args = ap.parse_args(argv)
    bad = 0
    for kind in args.kinds:
        books = build(kind)
        path = SHIPPED_DIR / f"{kind}.json"
        text = json.dumps(books, indent=0, sort_keys=True) + "\n"
        if args.check:
            same = path.exists() and path.read_text() == text
            print(f"{path.name}: {'ok' if same else 'DIFFERS'}")
            bad += not same
        else:
            path.write_text(text)
            print(f"wrote {path} ({len(books)} codebooks)")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
