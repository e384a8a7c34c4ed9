"""The ctypes mirror of the driver's launch structs (kernels/cuda/launch.py) against cuda.h: the sizes
and offsets the driver reads, from a C program compiled against the installed header where a C
compiler and cuda.h are present (else the values cuda.h 12.x/13.x defines)."""
from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from kernels.cuda.launch import PROGRAMMATIC_STREAM_SERIALIZATION, LaunchAttribute, LaunchConfig, pdl_attribute

C_PROGRAM = r"""
#include <cuda.h>
#include <stdio.h>
#include <stddef.h>
int main(void) {
  printf("%zu %zu %zu %zu %zu %zu %d\n", sizeof(CUlaunchAttribute), offsetof(CUlaunchAttribute, value),
         sizeof(CUlaunchConfig), offsetof(CUlaunchConfig, hStream), offsetof(CUlaunchConfig, attrs),
         offsetof(CUlaunchConfig, numAttrs), (int)CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION);
  return 0;
}
"""


def _header() -> Path | None:
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda",
                 *sorted(str(p) for p in Path("/usr/local").glob("cuda-*"))):
        if root and (Path(root) / "include" / "cuda.h").is_file():
            return Path(root) / "include"
    return None


def _mirror() -> list[int]:
    return [ctypes.sizeof(LaunchAttribute), LaunchAttribute.value.offset, ctypes.sizeof(LaunchConfig),
            LaunchConfig.hStream.offset, LaunchConfig.attrs.offset, LaunchConfig.numAttrs.offset,
            PROGRAMMATIC_STREAM_SERIALIZATION]


def test_structs_match_cuda_h(tmp_path):
    inc, cc = _header(), shutil.which("cc") or shutil.which("gcc")
    if inc is None or cc is None:
        pytest.skip("no cuda.h or C compiler here")
    (tmp_path / "lay.c").write_text(C_PROGRAM)
    subprocess.run([cc, f"-I{inc}", str(tmp_path / "lay.c"), "-o", str(tmp_path / "lay")], check=True)
    got = [int(x) for x in subprocess.run([str(tmp_path / "lay")], capture_output=True, text=True,
                                          check=True).stdout.split()]
    assert _mirror() == got


def test_structs_match_the_documented_abi():
    # cuda.h: CUlaunchAttribute = {int id; char pad[4]; union (64 bytes)}; CUlaunchConfig = 7 unsigned
    # ints, then the stream and attrs pointers (8-byte aligned), then numAttrs, padded to 8
    assert _mirror() == [72, 8, 56, 32, 40, 48, 6]


def test_pdl_attribute_bytes():
    raw = bytes(pdl_attribute())
    assert raw[:4] == (6).to_bytes(4, "little") and raw[8:12] == (1).to_bytes(4, "little")
    assert raw[12:] == bytes(60)


def test_the_struct_is_the_single_parameter(monkeypatch):
    """launch() with the driver stubbed: kernelParams holds one pointer, to the parameter struct, whose
    bytes the driver reads at the call; the launch config carries the grid, block, shared memory,
    stream and (only with pdl) the attribute. Anything but a ctypes Structure is refused."""
    from kernels.cuda import launch as L
    from kernels.cuda.lut_params import LutQprepParams, qprep_params

    params = qprep_params(q=2**63 + 5, signs=16, sketch=0, qfrag=4096, qscale=1.5, sign_stride=128, Hkv=-7,
                          sketch_stride=16384, qjl_scale=0.25)
    seen = []

    def fake_launch(cfg, func, ptrs, extra):  # what the driver would read, read at the call
        c = cfg._obj
        got = LutQprepParams.from_buffer_copy(ctypes.string_at(ptrs[0], ctypes.sizeof(LutQprepParams)))
        seen.append(dict(values=(got.q, got.signs, got.sketch, got.qfrag, got.qscale, got.sign_stride, got.Hkv,
                                 got.sketch_stride, got.qjl_scale), func=func, extra=extra,
                         dims=(c.gridDimX, c.gridDimY, c.gridDimZ, c.blockDimX, c.blockDimY, c.blockDimZ),
                         smem=c.sharedMemBytes, stream=c.hStream, n_attrs=c.numAttrs,
                         attr=c.attrs.contents.id if c.numAttrs else None))
        return 0

    monkeypatch.setattr(L, "_driver", lambda: (fake_launch, None))
    kernel = type("Fn", (), {"ptr": 12345})()
    L.launch(kernel, (3, 2), (128,), params, stream=777, shared_mem=4096, pdl=True)
    L.launch(kernel, (1,), (64,), params, stream=777, pdl=False)
    want = (2**63 + 5, 16, None, 4096, 1.5, 128, -7, 16384, 0.25)  # (ctypes reads a null c_void_p as None)
    assert [s["values"] for s in seen] == [want] * 2
    assert seen[0]["func"] == 12345 and seen[0]["extra"] is None
    assert seen[0]["dims"] == (3, 2, 1, 128, 1, 1) and seen[0]["smem"] == 4096
    assert seen[0]["stream"] == 777 and (seen[0]["n_attrs"], seen[0]["attr"]) == (1, PROGRAMMATIC_STREAM_SERIALIZATION)
    assert seen[1]["dims"] == (1, 1, 1, 64, 1, 1) and (seen[1]["n_attrs"], seen[1]["attr"]) == (0, None)
    with pytest.raises(TypeError, match="parameter struct"):
        L.launch(kernel, (1,), (64,), (1, 2, 3), stream=777)
