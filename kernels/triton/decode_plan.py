"""What the fused decode attention needs from a codec that does not change between steps: codebooks,
field sizes and the query-side feature matrix (the exact ±1 rotation, regrouped per triplet
component for octahedral keys), built once per (codec, device) from the codec's
:class:`kernels.fused_layout.FusedLayout` and kept while the codec lives."""
from __future__ import annotations

import math
import weakref

import torch

from ..fused_layout import FusedLayout, KeyCodes, Sketch


def _triplet_chunks(nt: int) -> tuple[int, int]:
    """Triplet tiles (TN, number of chunks): chunks of 16 (32 past 48 triplets, head dims > 128),
    small enough to be decoded and consumed by one tensor-core product at a time."""
    tn = 16 if nt <= 48 else 32
    return tn, -(-nt // tn)


class _Plan:
    """Everything the kernel needs from a codec that does not change between steps.

    ``octa``: the keys are octahedral triplets (else scalar codes); ``qjl``: there is a QJL
    residual; ``sketch_split``: its query features are stored as bf16 hi + lo columns (a Gaussian
    sketch is not exact in bf16; products of ±1 rotations are)."""

    def __init__(self, layout: FusedLayout, codec, device):
        D = codec.head_dim
        self.D = D
        self.octa = layout.keys == KeyCodes.OCTAHEDRAL
        res = layout.residual
        self.qjl = res is not None
        self.sketch_split = self.qjl and res.sketch == Sketch.GAUSSIAN
        self.fields = (layout.norm_field, layout.codes_field)
        self.qjl_fields = (res.bits_field, res.norm_field) if self.qjl else None
        rot = layout.rotation
        if self.octa:
            self.bu, self.br = layout.bits
            self.nt = layout.triplets
            self.ka_bytes = layout.codes.nbytes  # fused triplet codes (kernels.fused_layout.TripletCodes)
            self.cb1, self.cb2 = (c.to(device).contiguous() for c in layout.codebooks)
            self.tn, self.nch = _triplet_chunks(self.nt)
            self.cbits = 0
        else:
            self.bu = self.br = self.nt = self.tn = self.nch = 0
            self.cbits = layout.bits[0]
            self.ka_bytes = layout.codes.nbytes
            self.cb1 = layout.codebooks[0].to(device).contiguous()
            self.cb2 = self.cb1
        n = rot.padded
        heads = rot.num_heads
        mats = []
        sketch = layout.sketch_matrices() if self.qjl else None  # [heads, m, D] float64
        for hh in range(heads):
            R = rot.pm1_matrix(hh)  # y = x R^T / sqrt(n)
            cols = []
            if self.octa:
                for t0, tn in [(k * self.tn, self.tn) for k in range(self.nch)]:
                    for c in range(3):
                        sec = torch.zeros(D, tn, dtype=torch.float64)
                        for j in range(tn):
                            coord = 3 * (t0 + j) + c
                            if t0 + j < self.nt and coord < n:
                                sec[:, j] = R[coord, :D]
                        cols.append(sec)
            else:
                cols.append(R[:, :D].T)
            if self.qjl and res.sketch == Sketch.ROTATION:
                # R2 R with both ±1 rotations: integer entries, |.| <= n: exact in bf16
                cols.append((sketch[min(hh, sketch.shape[0] - 1)] * n).T)
            elif self.qjl:
                S = sketch[hh]  # [m, d]
                hi = S.to(torch.bfloat16).double()
                cols.append(S.T.to(torch.bfloat16).double())
                cols.append((S - hi).T)
            mats.append(torch.cat(cols, dim=1))
        qm = torch.stack(mats)  # [heads, D, NQ]
        qm_b = qm.to(torch.bfloat16)
        if not self.sketch_split:
            assert torch.equal(qm_b.double(), qm), "rotation features must be exact in bf16"
        self.qm = qm_b.contiguous().to(device)
        self.nq = qm.shape[-1]
        self.qm_head_stride = 0 if heads == 1 else D * self.nq
        self.rot_scale = 1.0 / math.sqrt(n)
        if not self.qjl:
            self.qjl_feat_scale, self.qjl_coef = 1.0, 0.0
        elif res.sketch == Sketch.ROTATION:  # two ±1 rotations, each sqrt(n) times the orthonormal one
            self.qjl_feat_scale, self.qjl_coef = 1.0 / n, res.coef
        else:
            self.qjl_feat_scale, self.qjl_coef = 1.0, res.coef
        vq = codec.value_quantizer
        self.vbits, self.vg = vq.bits, vq.group
        self.vc_bytes = vq.field.nbytes


_PLANS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def plan_for(codec, device) -> _Plan:
    per = _PLANS.setdefault(codec, {})
    key = str(torch.device(device))
    if key not in per:
        per[key] = _Plan(codec.fused_layout(), codec, device)
    return per[key]
