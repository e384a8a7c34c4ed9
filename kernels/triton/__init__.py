"""Fused Triton kernels for the codecs in :mod:`kernels` (one file per kernel: the kernel and a thin launcher).

- :mod:`.decode_attention`: split-K flash-decoding attention that reads packed key codes
  (OCTOPUS, OCTOPUS-QJL, TurboQuant-MSE/-prod) and group-quantized values, plus a native window.
- :mod:`.token_attention`: the same over per-token scalar codes (the engines' KV-cache presets), read as
  their ``codec.token_layout()`` declares (:mod:`kernels.token_layout`); :mod:`.combine` is shared.
- :mod:`.octopus_encode`, :mod:`.turboquant_encode`: fused key encoders producing the reference states;
  :mod:`.encoders` says which writes which key layout.

The kernels read what a codec declares in ``codec.fused_layout()`` (:mod:`kernels.fused_layout`),
never its name; the fused-or-reference choice is :mod:`kernels.backend`'s.

Importing this package needs ``triton``; :func:`available` says whether it can run here
(a CUDA device, or ``TRITON_INTERPRET=1`` on the CPU).
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
