"""The one backend decision: which fused kernel, if any, runs a call, or the PyTorch reference.

Every user of the fused kernels asks here: :meth:`kernels.base.Codec.encode` (fused key encoders:
one path, 'triton') and the attention dispatch (:func:`kernels.attention.decode_attention`, and
through it :meth:`adapters.cache.kv_cache.LayerKV.attend`: paths 'lut', the table-lookup CUDA kernel,
then 'triton'). :meth:`kernels.base.Codec.encode_values` asks :func:`fused_wanted` and runs the
fused value encoder (:mod:`kernels.triton.value_encode`) where it covers the quantizer, else the
reference (never an error: its bytes are the reference's); a graphed decode step's commit asks
:func:`decide_commit` (one launch that encodes as both fused encoders do, where both would run).
Each operation lists its fused paths in order of preference, each with a function that says why it
cannot run the call (None: it can); :func:`decide` picks one. The backend is
'auto' | 'lut' | 'triton' | 'torch':

- 'torch': always the reference;
- 'auto': on a CUDA device the first fused path that covers the call, else the reference; the
  environment variable ``KVCODEC_BACKEND`` overrides 'auto' (read at every call);
- 'lut' / 'triton': that fused path, or a RuntimeError saying why it cannot run ('triton'
  anywhere: on the CPU under ``TRITON_INTERPRET=1``). An operation without that path (encoding
  under 'lut') decides as under 'auto'.

The :class:`Decision` keeps the reason of every path passed over (``decision.refused``).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from kernels.triton import unavailable as triton_unavailable

BACKENDS = ("auto", "lut", "triton", "torch")
#: the fused paths of each operation, in the order 'auto' tries them
ATTENTION_PATHS = ("lut", "triton")
ENCODE_PATHS = ("triton",)


def resolve_backend(backend: str | None) -> str:
    """'auto' | 'lut' | 'triton' | 'torch'; the environment variable KVCODEC_BACKEND overrides 'auto'."""
    backend = backend or "auto"
    if backend == "auto":
        backend = os.environ.get("KVCODEC_BACKEND", "auto") or "auto"
    if backend not in BACKENDS:
        raise ValueError(f"Unknown backend '{backend}'. Available: {', '.join(BACKENDS)}")
    return backend


def fused_wanted(backend: str | None, device: torch.device) -> bool:
    """Whether ``backend`` asks for a fused kernel on ``device`` at all (before asking whether one
    covers the call): a named kernel ('lut', 'triton') anywhere, 'auto' on CUDA, 'torch' never."""
    backend = resolve_backend(backend)
    return backend in ("lut", "triton") or (backend == "auto" and torch.device(device).type == "cuda")


@dataclass(frozen=True)
class Decision:
    """What :func:`decide` chose: ``path`` is a fused path's name or 'torch'; ``refused`` holds
    (path, reason) for each path passed over, in the order they were asked."""

    path: str
    refused: tuple[tuple[str, str], ...] = ()

    @property
    def fused(self) -> bool:
        return self.path != "torch"

    def reason(self, path: str) -> str | None:
        """Why ``path`` was passed over (None: it was chosen, or not asked)."""
        return dict(self.refused).get(path)

    def __str__(self) -> str:
        why = "; ".join(f"{p}: {r}" for p, r in self.refused)
        return self.path + (f" ({why})" if why else "")


Paths = Sequence[tuple[str, Callable[[], "str | None"]]]


def decide(backend: str | None, device: torch.device, paths: Paths, what: str) -> Decision:
    """Pick the fused path (or the reference) for one call.

    ``paths``: (name, why_not) in order of preference; ``why_not()`` is None when that kernel
    covers the call, else the reason it does not (asked only when the backend wants it). A named
    backend that is one of ``paths`` gets that path or ``RuntimeError("backend='NAME' cannot
    {what}: {reason}")``; one that is not decides as 'auto'."""
    backend = resolve_backend(backend)
    names = [name for name, _ in paths]
    if backend == "torch":
        return Decision("torch", tuple((n, "backend 'torch'") for n in names))
    if backend in names:
        why = dict(paths)[backend]()
        if why is not None:
            raise RuntimeError(f"backend='{backend}' cannot {what}: {why}")
        return Decision(backend)
    dev = torch.device(device)
    if dev.type != "cuda":
        return Decision("torch", tuple((n, f"'{backend}' runs fused kernels on CUDA only, got {dev}") for n in names))
    refused = []
    for name, why_not in paths:
        why = why_not()
        if why is None:
            return Decision(name, tuple(refused))
        refused.append((name, why))
    return Decision("torch", tuple(refused))


def use_fused(backend: str | None, device: torch.device, why_not: Callable[[], str | None], what: str) -> bool:
    """True: run the fused Triton kernel; False: the PyTorch reference (:func:`decide` over the one
    path 'triton'). With 'triton' a reason is an error:
    ``RuntimeError("backend='triton' cannot {what}: {reason}")``."""
    return decide(backend, device, [(path, why_not) for path in ENCODE_PATHS], what).fused


def decide_commit(backend: str | None, device: torch.device, why_not: Callable[[], "str | None"]) -> Decision:
    """A graphed decode step's commit of one layer (:mod:`kernels.triton.commit`): 'triton' where
    ``backend`` wants fused kernels on ``device`` (:func:`fused_wanted`) and ``why_not()`` (the codec's
    :func:`kernels.triton.encoders.commit_unsupported`) is None: exactly where the step's two encodes would
    both take their fused encoders, whose bytes the commit writes. Else 'torch': the step encodes as any
    encode does, each encoder deciding for itself; never an error (nothing is lost but launches)."""
    if not fused_wanted(backend, device):
        return Decision("torch", (("triton", f"backend '{resolve_backend(backend)}' on {torch.device(device)}"),))
    why = why_not()
    return Decision("triton") if why is None else Decision("torch", (("triton", why),))


def backend_unavailable(backend: str | None, device) -> str | None:
    """None when a named backend can run on ``device`` at all, else why not: 'lut' (the table-lookup
    CUDA kernel) needs a CUDA device, 'triton' a CUDA device or TRITON_INTERPRET=1; 'auto' and
    'torch' run anywhere. Checked once per run, before any model loads."""
    backend = resolve_backend(backend)
    if backend == "lut" and torch.device(device).type != "cuda":
        return f"the table-lookup kernel runs on CUDA only, and this run's device is {device}"
    if backend == "triton":
        return triton_unavailable(torch.device(device))
    return None
