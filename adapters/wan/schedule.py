"""The few-step flow-matching schedule CausVid and Causal Forcing sample with.

Both models were distilled against a 1000-step rectified-flow table with a timestep shift:
``sigma_i = shift * s_i / (1 + (shift - 1) * s_i)`` for ``s = linspace(1, 0, 1001)[:-1]``
and ``t_i = 1000 * sigma_i``. A denoising step list names timesteps in that table; a
"warped" list (Causal Forcing) first maps each nominal step ``n`` to ``t[1000 - n]`` of the
shifted table (with ``t[1000] = 0``). The model predicts the flow ``noise - x0``, so
``x0 = x_t - sigma_t * flow`` with ``sigma_t`` the table entry nearest ``t``, and the next
step re-noises ``x_t' = (1 - sigma_t') * x0 + sigma_t' * noise``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

NUM_TRAIN_TIMESTEPS = 1000


@dataclass(frozen=True)
class FlowSchedule:
    shift: float
    steps: tuple[int, ...]  # nominal denoising steps, e.g. (1000, 757, 522)
    warp: bool = False

    def table(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(sigmas, timesteps), float64 [1000] each, from sigma 1 down to the last non-zero entry."""
        s = torch.linspace(1.0, 0.0, NUM_TRAIN_TIMESTEPS + 1, dtype=torch.float64)[:-1]
        sigmas = self.shift * s / (1 + (self.shift - 1) * s)
        return sigmas, sigmas * NUM_TRAIN_TIMESTEPS

    def timesteps(self) -> torch.Tensor:
        """The timesteps the model is called at, float32 [len(steps)] (what it sees)."""
        steps = torch.tensor(self.steps, dtype=torch.long)
        if not self.warp:
            return steps.float()
        _, t = self.table()
        t = torch.cat([t, torch.zeros(1, dtype=t.dtype)])
        return t[NUM_TRAIN_TIMESTEPS - steps].float()

    def sigma(self, t: float) -> float:
        """sigma of the table entry nearest timestep t (as the released samplers look it up)."""
        sigmas, ts = self.table()
        return float(sigmas[torch.argmin((ts - float(t)).abs())])

    def sigmas(self) -> list[float]:
        return [self.sigma(t) for t in self.timesteps().tolist()]
