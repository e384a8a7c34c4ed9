"""The table-lookup kernels' parameter structs (``lut_common.cuh``), mirrored by ctypes Structures: each
kernel takes one struct by value, and :func:`kernels.cuda.launch.launch` passes a pointer to it as the
kernel's single parameter. Field for field, in the same order and of the same C types, so that ctypes
lays them out as the device compiler does; ``tests/kernels/cuda/test_cuda_launch.py`` parses the C
declarations and compares (and the ``.cu`` asserts the sizes, ``SIZES``, at compile time).

The fields and what they hold are documented once, on the C side. :func:`packer` makes the function that
fills a struct from keyword arguments in one ``struct.pack_into`` (a decode step launches these kernels
once per layer, and the step is bound by host time: setting the fields through ctypes took 20 us a
launch on the H100's host, about ten times as long).
"""
from __future__ import annotations

import ctypes
import struct

_ptr, _int, _u32, _u64, _f32, _i64 = (ctypes.c_void_p, ctypes.c_int, ctypes.c_uint, ctypes.c_uint64,
                                      ctypes.c_float, ctypes.c_longlong)
#: enum Field of lut_common.cuh: the per-token fields lut_split copies per stage, lane k field k
FIELDS = ("norm", "key codes", "value codes", "scales", "zeros", "sign bits", "residual norms")
MAX_FIELDS = len(FIELDS)


class LutWindow(ctypes.Structure):
    """``struct LutWindow``: the native window of lut_combine and the in-kernel merge."""

    _fields_ = [("k", _ptr), ("v", _ptr), ("lengths", _ptr), ("k_stride", _i64 * 3), ("v_stride", _i64 * 3),
                ("has_lengths", _int), ("tokens", _int)]


class LutOutput(ctypes.Structure):
    """``struct LutOutput``: where the attention output (and its log-sum-exp) goes."""

    _fields_ = [("out", _ptr), ("lse", _ptr), ("sm_log2", _f32), ("write_lse", _int)]


class LutSplitParams(ctypes.Structure):
    """``struct LutSplitParams``: lut_split, the compressed prefix of one split."""

    _fields_ = [("q", _ptr), ("signs", _ptr), ("qfrag", _ptr), ("table", _ptr), ("rho", _ptr),
                ("field", _u64 * MAX_FIELDS), ("field_end", _u64 * MAX_FIELDS), ("lengths", _ptr),
                ("o_part", _ptr), ("ml_part", _ptr), ("counters", _ptr), ("qscale", _f32), ("sign_stride", _int),
                ("has_lengths", _int), ("T", _int), ("Hkv", _int), ("tiles_per_cta", _int), ("S", _int),
                ("merge_in", _int), ("vmagic", _u32), ("window", LutWindow), ("output", LutOutput)]


class LutCombineParams(ctypes.Structure):
    """``struct LutCombineParams``: lut_combine, the window and the splits merged into the output."""

    _fields_ = [("q", _ptr), ("o_part", _ptr), ("ml_part", _ptr), ("S", _int), ("Hq", _int), ("Hkv", _int),
                ("window", LutWindow), ("output", LutOutput)]


class LutQprepParams(ctypes.Structure):
    """``struct LutQprepParams``: lut_qprep, the query's fragments once per step."""

    _fields_ = [("q", _ptr), ("signs", _ptr), ("sketch", _ptr), ("qfrag", _ptr), ("qscale", _f32),
                ("sign_stride", _int), ("Hkv", _int), ("sketch_stride", _int), ("qjl_scale", _f32)]


#: the sizes the .cu asserts (static_assert in lut_common.cuh): the C side's layout, checked on the CPU
SIZES = {LutWindow: 80, LutOutput: 24, LutSplitParams: 328, LutCombineParams: 144, LutQprepParams: 56}

_CODES = {_ptr: "Q", _int: "i", _u32: "I", _u64: "Q", _f32: "f", _i64: "q"}


def packer(ctype: type[ctypes.Structure]):
    """A function that fills a ``ctype`` from keyword arguments, one per top-level field (all required):
    scalars and pointers as ints / floats, arrays as sequences of their length, nested structs as ctypes
    instances of their type. -> a ``ctype`` instance.

    The function is generated, as :func:`collections.namedtuple` generates its constructor: its
    keyword-only parameters are the fields in order, and its body is one ``struct.pack_into`` whose format
    follows the ctypes layout (padding included), so that filling a struct costs about what packing the
    old positional arguments did."""
    fmt, at, params, values = "<", 0, [], []
    for name, ftype in ctype._fields_:
        off = getattr(ctype, name).offset
        fmt += "x" * (off - at)
        if issubclass(ftype, ctypes.Structure):
            fmt += f"{ctypes.sizeof(ftype)}s"
            values.append(f"bytes({name})")
        elif issubclass(ftype, ctypes.Array):
            fmt += _CODES[ftype._type_] * ftype._length_
            values.append(f"*{name}")
        else:
            fmt += _CODES[ftype]
            values.append(name)
        params.append(name)
        at = off + ctypes.sizeof(ftype)
    fmt += "x" * (ctypes.sizeof(ctype) - at)
    layout = struct.Struct(fmt)
    assert layout.size == ctypes.sizeof(ctype), (fmt, ctypes.sizeof(ctype))
    src = (f"def {ctype.__name__}_from(*, {', '.join(params)}):\n"
           f"    params = ctype()\n"
           f"    pack_into(params, 0, {', '.join(values)})\n"
           f"    return params\n")
    scope = {"ctype": ctype, "pack_into": layout.pack_into}
    exec(src, scope)  # noqa: S102 (generated from the field names above, as namedtuple does)
    fn = scope[f"{ctype.__name__}_from"]
    fn.__doc__ = f"A ``{ctype.__name__}`` from its fields (keyword arguments; :func:`packer`)."
    return fn


window_params = packer(LutWindow)
output_params = packer(LutOutput)
split_params = packer(LutSplitParams)
combine_params = packer(LutCombineParams)
qprep_params = packer(LutQprepParams)
