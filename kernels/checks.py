"""What every codec checks of its input before encoding it, shared by the PyTorch references
(:mod:`kernels.base`) and the fused encoders (:mod:`kernels.triton`): dtype, shape, head dim, and
finiteness, checked at once or noted on the device and raised later (:class:`DeferredFinite`)."""
from __future__ import annotations

import math

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class DeferredFinite:
    """Non-finite inputs noted on the device, raised later: :func:`check_finite` given one notes a
    CUDA tensor's finiteness in a device flag (two launches, no host sync) instead of asking the
    host at once, and :meth:`raise_if_any` reads every flag in one sync. A decode step, which
    encodes a layer's keys and values every step, so pays no sync for the check (it cost two per
    layer); its owner raises where it syncs anyway. The error then cannot name the index."""

    def __init__(self):
        # what -> the largest magnitude noted so far (float32 on the device): NaN or inf exactly when
        # some input was not finite (max propagates NaN); two launches a note, in place
        self._max: dict[str, torch.Tensor] = {}

    def note(self, x: torch.Tensor, what: str) -> None:
        m = torch.linalg.vector_norm(x.detach(), float("inf"))
        seen = self._max.get(what)
        if seen is None:
            self._max[what] = m.float()
        else:
            torch.maximum(seen, m, out=seen)

    def flag(self, what: str, device) -> torch.Tensor:
        """The device flag of ``what`` (float32, 0-dim; zero if nothing was noted yet), for a kernel that
        notes in place: it writes a non-finite value there where an input of ``what`` is not finite
        (:mod:`kernels.triton.commit`; only finiteness is read, never the magnitude)."""
        if what not in self._max:
            self._max[what] = torch.zeros((), dtype=torch.float32, device=device)
        return self._max[what]

    def raise_if_any(self, where: str = "") -> None:
        """Raise the ValueError :func:`check_finite` raises, naming what was not finite; one sync."""
        if not self._max or bool(torch.isfinite(torch.stack(list(self._max.values()))).all()):
            return
        what = next(w for w, m in self._max.items() if not bool(torch.isfinite(m)))
        raise ValueError(f"{what}{where} contained non-finite values (found after the step that encoded them). Check "
                         f"the model's activations (fp16 overflow?) before compressing them.")

    def reset(self) -> None:
        """Forget what was noted, in place (the flags keep their tensors: a CUDA graph writes them)."""
        for m in self._max.values():
            m.zero_()

    def merge_into(self, other: "DeferredFinite") -> None:
        """Note in ``other`` what this one noted (no sync)."""
        for what, m in self._max.items():
            other.note(m, what)

    def fork(self) -> "DeferredFinite":
        other = DeferredFinite()
        other._max = {w: m.clone() for w, m in self._max.items()}  # noted in place: not shared
        return other


def check_finite(x: torch.Tensor, what: str = "keys", defer: DeferredFinite | None = None) -> None:
    """Raise a ValueError that names the first non-finite entry of ``x``.

    The common case (all finite) costs two launches and one sync: the largest magnitude, which
    is NaN or inf exactly when some entry is (max propagates NaN). ``defer``: on CUDA, note it
    there instead, with no sync (:class:`DeferredFinite`); on the CPU a check costs no sync and
    runs at once."""
    if x.numel() == 0:
        return
    if defer is not None and x.is_cuda:
        defer.note(x, what)
        return
    if math.isfinite(float(x.detach().abs().amax())):
        return
    bad = ~torch.isfinite(x)
    if bool(bad.any()):
        idx = tuple(int(i) for i in bad.nonzero()[0].tolist())
        value = x[idx].item()
        raise ValueError(
            f"{what} contain {int(bad.sum())} non-finite value(s); the first is {value} at index {idx} "
            f"of a tensor of shape {tuple(x.shape)}. Check the model's activations (fp16 overflow?) "
            f"before compressing them."
        )


def check_input(x: torch.Tensor, head_dim: int, what: str = "keys", defer: DeferredFinite | None = None) -> None:
    if not torch.is_floating_point(x) or x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{what} must be float32, float16 or bfloat16, got {x.dtype}")
    if x.dim() < 2:
        raise ValueError(f"{what} must have shape [..., T, d], got {tuple(x.shape)}")
    if x.shape[-1] != head_dim:
        raise ValueError(
            f"{what} have head dim {x.shape[-1]} but the codec was built for head_dim={head_dim}; "
            f"build it with head_dim={x.shape[-1]}"
        )
    check_finite(x, what, defer)
