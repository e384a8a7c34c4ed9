"""Fused Triton kernels for the codecs in :mod:`kernels` (one file per kernel: the kernel and a thin launcher).

- :mod:`.decode_attention`: split-K flash-decoding attention that reads packed key codes
  (OCTOPUS, OCTOPUS-QJL, TurboQuant-MSE/-prod) and group-quantized values, plus a native window.
- :mod:`.token_attention`: the same over per-token scalar codes (the engines' KV-cache presets), read as
  their ``codec.token_layout()`` declares (:mod:`kernels.token_layout`); :mod:`.combine` is shared.
- :mod:`.octopus_encode`, :mod:`.turboquant_encode`: fused key encoders producing the reference states;
  :mod:`.encoders` says which writes which key layout. :mod:`.value_encode`: the fused value encoder.
- :mod:`.commit`: a graphed decode step's window write and commit of one layer in one launch, through the
  encoders' own bodies (``@triton.jit`` functions the standalone encoders run too).

The kernels read what a codec declares in ``codec.fused_layout()`` (:mod:`kernels.fused_layout`),
never its name; the fused-or-reference choice is :mod:`kernels.backend`'s.

Importing this package does not import ``triton``; :func:`unavailable` says whether the kernels can run
here (``triton`` importable, and a CUDA device or ``TRITON_INTERPRET=1`` on the CPU), and why not.
"""
from __future__ import annotations

import os


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def available(device) -> bool:
    """True when the Triton kernels can run on tensors of ``device``."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    dev = device if isinstance(device, str) else getattr(device, "type", str(device))
    return str(dev).startswith("cuda") or interpreting()


def unavailable(device) -> str | None:
    """None when the Triton kernels can run on ``device``, else why not."""
    try:
        import triton  # noqa: F401
    except ImportError as e:
        return f"triton is not importable ({e})"
    if not available(device):
        return f"the Triton kernels need a CUDA device (or TRITON_INTERPRET=1), got {device}"
    return None
