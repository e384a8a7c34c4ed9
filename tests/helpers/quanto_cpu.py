"""optimum-quanto without its C++ build: quanto unpacks its packed codes on the CPU with a C++ extension
that it compiles with ninja on first use (about a minute on two cores, once per installation, paid by
whichever test first reads a quanto tensor back). The same op has quanto's own pure-PyTorch
implementation (registered for every device as the op's default kernel): the same bit unpacking, equal
output. Tests of hf-quanto take that one; the harness itself keeps the extension."""
from __future__ import annotations

from contextlib import contextmanager
from types import SimpleNamespace


def _torch_unpack(t, bits):
    import torch

    keys = torch._C.DispatchKeySet(torch._C.DispatchKey.CompositeExplicitAutograd)
    return torch.ops.quanto.unpack.default.redispatch(keys, t, bits)  # quanto's library/unpack.py


@contextmanager
def quanto_unpacks_in_torch():
    """Within: ``torch.ops.quanto.unpack`` on the CPU runs quanto's PyTorch implementation, not its C++
    extension (built, where it was not yet, on first use). Without optimum-quanto: nothing to do."""
    try:
        from optimum.quanto.library.extensions.cpp import ext
    except ImportError:
        yield
        return

    saved = ext._lib
    ext._lib = SimpleNamespace(unpack=_torch_unpack)
    try:
        yield
    finally:
        ext._lib = saved
