"""What the fused decode attention needs from a codec that does not change between steps: codebooks,
field sizes and the query-side feature matrix (the exact ±1 rotation, regrouped per triplet
component for OCTOPUS), built once per (codec, device) and kept while the codec lives."""
from __future__ import annotations

import math
import weakref

import torch

from ..rotation import hadamard_matrix

KINDS = {"octopus": 0, "octopus-qjl": 1, "turboquant-mse": 2, "turboquant-prod": 3}


def _triplet_chunks(nt: int) -> tuple[int, int]:
    """Triplet tiles (TN, number of chunks): chunks of 16 (32 past 48 triplets, head dims > 128),
    small enough to be decoded and consumed by one tensor-core product at a time."""
    tn = 16 if nt <= 48 else 32
    return tn, -(-nt // tn)


def _pm1_rotation(rot, head: int) -> torch.Tensor:
    """sqrt(n) * Rotation.matrix(head), built exactly: H diag(signs), entries ±1 (float64)."""
    return hadamard_matrix(rot.padded, dtype=torch.float64) * rot.signs[head, 0].cpu().double().unsqueeze(0)


class _Plan:
    """Everything the kernel needs from a codec that does not change between steps."""

    def __init__(self, codec, device):
        name = codec.name
        self.kind = KINDS[name]
        D = codec.head_dim
        self.D = D
        if self.kind <= 1:
            st = codec.stage
            self.bu, self.br, self.nt = st.b_u, st.b_r, st.nt
            self.ka_bytes, self.kb_bytes = st.u_field.nbytes, st.r_field.nbytes
            from ..lloyd_max import codebook
            self.cb1 = codebook("octa", 0, st.b_u, device=device).contiguous()
            self.cb2 = codebook("triplet_norm", st.d_pad, st.b_r, device=device).contiguous()
            self.tn, self.nch = _triplet_chunks(st.nt)
            rot = codec.rot
            self.cbits = 0
        else:
            st = codec.stage
            self.bu = self.br = self.nt = self.tn = self.nch = 0
            self.cbits = st.bits
            self.ka_bytes, self.kb_bytes = st.field.nbytes, 0
            self.cb1 = st.centroids(torch.device("cpu")).to(device).contiguous()
            self.cb2 = self.cb1
            rot = st.rotation
        n = rot.padded
        heads = rot.num_heads
        mats = []
        for hh in range(heads):
            R = _pm1_rotation(rot, hh)  # y = x R^T / sqrt(n)
            cols = []
            if self.kind <= 1:
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
            if self.kind == 1:
                R2 = _pm1_rotation(codec.rot2, hh)
                cols.append((R2 @ R)[:, :D].T)  # integer entries, |.| <= n: exact in bf16
            if self.kind == 3:
                S = codec.sketch._S[torch.device("cpu")][hh].double()  # [m, d]
                hi = S.to(torch.bfloat16).double()
                cols.append(S.T.to(torch.bfloat16).double())
                cols.append((S - hi).T)
            mats.append(torch.cat(cols, dim=1))
        qm = torch.stack(mats)  # [heads, D, NQ]
        qm_b = qm.to(torch.bfloat16)
        if self.kind != 3:
            assert torch.equal(qm_b.double(), qm), "rotation features must be exact in bf16"
        self.qm = qm_b.contiguous().to(device)
        self.nq = qm.shape[-1]
        self.qm_head_stride = 0 if heads == 1 else D * self.nq
        self.rot_scale = 1.0 / math.sqrt(n)
        if self.kind == 1:
            self.qjl_feat_scale, self.qjl_coef = 1.0 / n, codec.qjl_scale
        elif self.kind == 3:
            self.qjl_feat_scale, self.qjl_coef = 1.0, codec.sketch.scale
        else:
            self.qjl_feat_scale, self.qjl_coef = 1.0, 0.0
        vq = codec.value_quantizer
        self.vbits, self.vg = vq.bits, vq.group
        self.vc_bytes = vq.field.nbytes


_PLANS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def plan_for(codec, device) -> _Plan:
    per = _PLANS.setdefault(codec, {})
    key = str(torch.device(device))
    if key not in per:
        per[key] = _Plan(codec, device)
    return per[key]
