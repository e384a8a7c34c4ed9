"""Kernel launches with programmatic dependent launch (PDL, Hopper), through the CUDA driver.

CuPy's ``RawKernel.__call__`` takes no launch attributes, so a PDL launch goes through the driver's
``cuLaunchKernelEx`` (CUDA 12.0+) with the attribute ``CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION``,
called with ctypes: the kernel may then start while the kernel before it in the stream still runs,
and its ``griddepcontrol.wait`` waits for that kernel (see ``decode_lut.cu``). Stream capture
turns the attribute into a programmatic edge of the CUDA graph (CUDA 12.3+).

:func:`launch` takes (grid, block, the kernel's parameter struct, stream, shared memory) and launches
with or without the attribute: the table-lookup kernels launch through it either way (one path for every
launch). Each of them takes one struct by value (``lut_common.cuh``, mirrored by
:mod:`kernels.cuda.lut_params`), passed to the driver as the single entry of ``kernelParams``.
"""
from __future__ import annotations

import ctypes
import functools

#: CUlaunchAttributeID CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION (cuda.h)
PROGRAMMATIC_STREAM_SERIALIZATION = 6


class LaunchAttribute(ctypes.Structure):
    """``CUlaunchAttribute``: the id, padding to 8 bytes, a 64-byte value union (cuda.h)."""

    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_char * 64)]


class LaunchConfig(ctypes.Structure):
    """``CUlaunchConfig`` (cuda.h): grid and block dims, dynamic shared memory, stream, attributes."""

    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(LaunchAttribute)), ("numAttrs", ctypes.c_uint)]


def pdl_attribute() -> LaunchAttribute:
    """The attribute that allows the launch to overlap the previous kernel (value: int 1)."""
    a = LaunchAttribute()
    a.id = PROGRAMMATIC_STREAM_SERIALIZATION
    ctypes.memmove(ctypes.addressof(a) + LaunchAttribute.value.offset, ctypes.byref(ctypes.c_int(1)), 4)
    return a


_PDL_ATTR = ctypes.pointer(pdl_attribute())


@functools.lru_cache(maxsize=1)
def _driver():
    lib = ctypes.CDLL("libcuda.so.1")
    fn = lib.cuLaunchKernelEx
    fn.argtypes = [ctypes.POINTER(LaunchConfig), ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
    fn.restype = ctypes.c_int
    err = lib.cuGetErrorString
    err.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    err.restype = ctypes.c_int
    return fn, err


def driver_missing() -> str | None:
    """None when the driver has ``cuLaunchKernelEx``, else why a PDL launch cannot be made."""
    try:
        _driver()
    except (OSError, AttributeError) as e:
        return f"no cuLaunchKernelEx in the CUDA driver ({e})"
    return None


def launch(kernel, grid: tuple, block: tuple, params: ctypes.Structure, stream: int, shared_mem: int = 0,
           pdl: bool = False) -> None:
    """Launch a CuPy kernel (a RawKernel, or its ``Function``, whose ``ptr`` is the CUfunction) that
    takes one parameter struct by value (``params``, a ctypes Structure mirroring it:
    :mod:`kernels.cuda.lut_params`) on ``stream`` (a CUstream handle), with the PDL attribute where
    ``pdl``. The driver copies the struct's bytes at the launch. Raises RuntimeError with the driver's
    message."""
    if not isinstance(params, ctypes.Structure):
        raise TypeError(f"launch takes the kernel's parameter struct (a ctypes Structure), got {type(params).__name__}")
    fn, err = _driver()
    func = getattr(kernel, "kernel", kernel)  # a RawKernel holds its cupy.cuda.Function
    gx, gy, gz = tuple(grid) + (1,) * (3 - len(grid))
    bx, by, bz = tuple(block) + (1,) * (3 - len(block))
    cfg = LaunchConfig(gx, gy, gz, bx, by, bz, shared_mem, stream, _PDL_ATTR if pdl else None, int(pdl))
    args = (ctypes.c_void_p * 1)(ctypes.addressof(params))  # kernelParams: one pointer, to the struct
    rc = fn(ctypes.byref(cfg), func.ptr, args, None)
    if rc != 0:
        msg = ctypes.c_char_p()
        err(rc, ctypes.byref(msg))
        raise RuntimeError(f"cuLaunchKernelEx failed: {rc} ({(msg.value or b'?').decode()})")
