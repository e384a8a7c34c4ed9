"""The one backend decision: a fused Triton kernel or the PyTorch reference.

Both users of the fused kernels ask here: :meth:`kernels.base.Codec.encode` (fused key encoders)
and the attention dispatch (:func:`kernels.attention.decode_attention`, and through it
:meth:`adapters.kv_cache.LayerKV.attend`). The backend is 'auto' | 'triton' | 'torch':

- 'torch': always the reference;
- 'auto': the fused kernel on a CUDA device where it covers the call, else the reference; the
  environment variable ``KVCODEC_BACKEND`` overrides 'auto' (read at every call);
- 'triton': the fused kernel, or a RuntimeError saying why it cannot run (anywhere: on the CPU
  under ``TRITON_INTERPRET=1``).
"""
from __future__ import annotations

import os
from typing import Callable

import torch

BACKENDS = ("auto", "triton", "torch")


def resolve_backend(backend: str | None) -> str:
    """'auto' | 'triton' | 'torch'; the environment variable KVCODEC_BACKEND overrides 'auto'."""
    backend = backend or "auto"
    if backend == "auto":
        backend = os.environ.get("KVCODEC_BACKEND", "auto") or "auto"
    if backend not in BACKENDS:
        raise ValueError(f"Unknown backend '{backend}'. Available: {', '.join(BACKENDS)}")
    return backend


def fused_wanted(backend: str | None, device: torch.device) -> bool:
    """Whether ``backend`` asks for the fused kernels on ``device`` at all (before asking whether
    they cover the call): 'triton' anywhere, 'auto' on CUDA, 'torch' never."""
    backend = resolve_backend(backend)
    return backend == "triton" or (backend == "auto" and torch.device(device).type == "cuda")


def use_fused(backend: str | None, device: torch.device, why_not: Callable[[], str | None], what: str) -> bool:
    """True: run the fused kernel; False: the PyTorch reference.

    ``why_not()`` is None when the fused kernel covers this call, else the reason it does not
    (asked only when the backend wants the kernel). With 'triton' a reason is an error:
    ``RuntimeError("backend='triton' cannot {what}: {reason}")``.
    """
    if not fused_wanted(backend, device):
        return False
    why = why_not()
    if why is None:
        return True
    if resolve_backend(backend) == "triton":
        raise RuntimeError(f"backend='triton' cannot {what}: {why}")
    return False


def triton_unavailable(device: torch.device) -> str | None:
    """None when the Triton kernels can run on ``device``, else why not."""
    try:
        import triton  # noqa: F401
    except ImportError as e:
        return f"triton is not importable ({e})"
    from .triton import available

    if not available(device):
        return f"the Triton kernels need a CUDA device (or TRITON_INTERPRET=1), got {device}"
    return None
