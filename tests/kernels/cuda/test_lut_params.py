"""The table-lookup kernels' parameter structs on the CPU: the ctypes mirrors (kernels/cuda/lut_params.py)
against the C declarations of lut_common.cuh, parsed from the source the launcher compiles (same fields,
order, C types and hence offsets; the sizes the .cu asserts at compile time), and the packer that fills
them (every value lands in its field, every field is named)."""
from __future__ import annotations

import ctypes
import re
import struct

import pytest

from kernels.cuda import lut_params
from kernels.cuda.decode_lut import source
from kernels.cuda.lut_params import SIZES, LutSplitParams, LutWindow, output_params, split_params, window_params

#: C scalar types of the structs -> ctypes (every pointer is a c_void_p)
_C_TYPES = {"int": ctypes.c_int, "float": ctypes.c_float, "u32": ctypes.c_uint, "u64": ctypes.c_uint64,
            "long long": ctypes.c_longlong}


def c_structs(src: str) -> dict[str, type[ctypes.Structure]]:
    """Every ``struct Lut* {...};`` of the source as a ctypes Structure built from its declaration (so
    laid out by the C rules), array sizes read from the source's enums and constants."""
    enum = re.search(r"enum Field \{([^}]*)\}", src).group(1)
    consts = {"MAX_FIELDS": [n.strip() for n in enum.split(",")].index("MAX_FIELDS")}
    out: dict[str, type[ctypes.Structure]] = {}
    for name, body in re.findall(r"struct (Lut\w+) \{(.*?)\n\};", src, re.S):
        fields = []
        for line in body.splitlines():
            decl = line.split("//")[0].strip()
            if not decl:
                continue
            m = re.fullmatch(r"(.+?)\s*\b(\w+)(?:\[(\w+)\])?;", decl)
            assert m, f"{name}: cannot read {decl!r}"
            ctype, fname, n = m.groups()
            ctype = " ".join(ctype.replace("const", " ").replace("__restrict__", " ").split())
            t = ctypes.c_void_p if ctype.endswith("*") else out.get(ctype) or _C_TYPES[ctype]
            if n is not None:
                t = t * (int(n) if n.isdigit() else consts[n])
            fields.append((fname, t))
        out[name] = type(name, (ctypes.Structure,), {"_fields_": fields})
    return out


def asserted_sizes(src: str) -> dict[str, int]:
    return {n: int(v) for n, v in re.findall(r"static_assert\(sizeof\((Lut\w+)\) == (\d+)", src)}


def layout(t: type[ctypes.Structure]) -> list:
    """(name, C type, offset, size) of every field, nested structs by their own layout."""
    rows = []
    for name, ft in t._fields_:
        f = getattr(t, name)
        if issubclass(ft, ctypes.Structure):
            kind = layout(ft)
        elif issubclass(ft, ctypes.Array):
            kind = (ft._type_.__name__, ft._length_)
        else:
            kind = ft.__name__
        rows.append((name, kind, f.offset, f.size))
    return rows + [("sizeof", ctypes.sizeof(t))]


def mismatches(src: str) -> list[str]:
    c = c_structs(src)
    mirrors = {t.__name__: t for t in SIZES}
    errs = [f"{n}: declared in C only" for n in set(c) - set(mirrors)]
    errs += [f"{n}: mirrored in Python only" for n in set(mirrors) - set(c)]
    for n in sorted(set(c) & set(mirrors)):
        if layout(c[n]) != layout(mirrors[n]):
            errs.append(f"{n}: C {layout(c[n])} != ctypes {layout(mirrors[n])}")
    sizes = asserted_sizes(src)
    for t, size in SIZES.items():
        if (ctypes.sizeof(t), sizes.get(t.__name__)) != (size, size):
            errs.append(f"{t.__name__}: ctypes {ctypes.sizeof(t)}, the .cu asserts {sizes.get(t.__name__)}, "
                        f"lut_params.SIZES {size}")
    return errs


def test_ctypes_mirrors_match_the_c_structs():
    assert set(asserted_sizes(source())) == {t.__name__ for t in SIZES}
    assert mismatches(source()) == []


@pytest.mark.parametrize("edit", ["swap", "type", "drop", "size"])
def test_a_mismatch_is_found(edit):
    """The check fails on an edit of the C side that the mirror does not follow."""
    src = source()
    if edit == "swap":  # two fields of the same size, in the other order
        src = src.replace("  int T;  ", "  int Tmp;  ").replace("  int Hkv;  ", "  int T;  ", 1)
        src = src.replace("  int Tmp;  ", "  int Hkv;  ")
    elif edit == "type":
        src = src.replace("  float qscale;", "  int qscale;", 1)
    elif edit == "drop":
        src = src.replace("  int merge_in; ", "  // int merge_in; ", 1)
    else:
        src = src.replace("sizeof(LutOutput) == 24", "sizeof(LutOutput) == 32")
    assert src != source() and mismatches(src)


def test_packer_puts_every_value_in_its_field():
    win = window_params(k=11, v=12, lengths=13, k_stride=(1, -2, 3), v_stride=(4, 5, 2**40), has_lengths=1, tokens=9)
    out = output_params(out=21, lse=22, sm_log2=0.5, write_lse=1)
    values = dict(q=2**64 - 16, signs=2, qfrag=3, table=4, rho=5, field=tuple(range(100, 107)),
                  field_end=tuple(range(200, 207)), lengths=6, o_part=7, ml_part=8, counters=9, qscale=0.375,
                  sign_stride=128, has_lengths=1, T=1000, Hkv=-3, tiles_per_cta=4, S=5, merge_in=1,
                  vmagic=0x64006400, window=win, output=out)
    p = split_params(**values)
    assert isinstance(p, LutSplitParams)
    for name, v in values.items():
        got = getattr(p, name)
        if name in ("field", "field_end"):
            assert tuple(got) == v
        elif name in ("window", "output"):
            assert bytes(got) == bytes(v)
        else:
            assert got == v, name
    assert (p.window.k, list(p.window.v_stride), p.window.tokens) == (11, [4, 5, 2**40], 9)
    assert (p.output.lse, p.output.sm_log2) == (22, 0.5)
    with pytest.raises(TypeError, match="missing 1 required keyword-only argument: 'vmagic'"):
        split_params(**{k: v for k, v in values.items() if k != "vmagic"})
    with pytest.raises(TypeError, match="unexpected keyword argument 'W'"):
        split_params(**values, W=3)
    with pytest.raises(TypeError):  # keywords only: the order of the fields is the struct's business
        split_params(*values.values())
    with pytest.raises(struct.error):  # an array of the wrong length
        split_params(**(values | {"field": (1, 2)}))
    assert ctypes.sizeof(LutWindow) == lut_params.SIZES[LutWindow]
