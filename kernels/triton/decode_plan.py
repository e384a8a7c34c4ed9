"""What the fused decode attention needs from a codec that does not change between steps: codebooks,
field sizes and the query-side feature matrix (the exact ±1 rotation, regrouped per triplet
component for octahedral keys) and the kernel's compile-time groups of the key and value formats, built
once per (codec, device) from the codec's :class:`kernels.fused_layout.FusedLayout` and kept while the
codec lives."""
from __future__ import annotations

import math
import weakref
from typing import NamedTuple

import torch

from kernels.fused_layout import FusedLayout, KeyCodes, Sketch


class KeyFormat(NamedTuple):
    """How the keys are stored and read (the kernel's constexpr group KEYS; from the declared layout)."""

    OCTA: bool            #: octahedral triplets (fused codes u | v << BU | r << 2 BU), else scalar codes
    ROW_BYTES: int        #: bytes per token of the codes field
    BITS: int             #: scalar codes: bits per code (0 for triplets)
    BU: int               #: triplets: bits of each direction code u, v
    BR: int               #: triplets: bits of the length code r
    TRIPLET_TILE: int     #: triplets decoded per chunk (16, 32 past 48 triplets)
    TRIPLET_CHUNKS: int   #: chunks of TRIPLET_TILE triplets
    FEATURES: int         #: columns of the query feature matrix QM (rotation, then the QJL sketch)
    CHUNK: int            #: coordinates per chunk of scalar codes and of the QJL sketch (min(64, HEAD_DIM))
    HAS_QJL: bool         #: a QJL residual: HEAD_DIM sign bits and an fp16 residual norm per token
    SKETCH_SPLIT: bool    #: the sketch's query features stored as bf16 hi + lo columns (a Gaussian sketch)
    QJL_COL: int          #: QM's first column of the sketch
    QJL_ROW_BYTES: int    #: bytes per token of the sign bits


class ValueFormat(NamedTuple):
    """How the values are stored (the kernel's constexpr group VALUES; the codec's value quantizer)."""

    BITS: int             #: bits per value code
    ROW_BYTES: int        #: bytes per token of the codes field
    GROUP: int            #: coordinates per scale / zero
    GROUPS: int           #: groups per token (HEAD_DIM / GROUP)
    CHUNK: int            #: coordinates per chunk of the output accumulator (min(64, HEAD_DIM))


def _triplet_chunks(nt: int) -> tuple[int, int]:
    """Triplet tiles (TN, number of chunks): chunks of 16 (32 past 48 triplets, head dims > 128),
    small enough to be decoded and consumed by one tensor-core product at a time."""
    tn = 16 if nt <= 48 else 32
    return tn, -(-nt // tn)


class _Plan:
    """Everything the kernel needs from a codec that does not change between steps.

    ``octa``: the keys are octahedral triplets (else scalar codes); ``qjl``: there is a QJL
    residual; ``sketch_split``: its query features are stored as bf16 hi + lo columns (a Gaussian
    sketch is not exact in bf16; products of ±1 rotations are). ``keys``, ``values``: the kernel's
    compile-time groups :class:`KeyFormat`, :class:`ValueFormat`."""

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
        cw = min(64, D)
        self.keys = KeyFormat(OCTA=self.octa, ROW_BYTES=self.ka_bytes, BITS=self.cbits, BU=self.bu, BR=self.br,
                              TRIPLET_TILE=self.tn, TRIPLET_CHUNKS=self.nch, FEATURES=self.nq, CHUNK=cw,
                              HAS_QJL=self.qjl, SKETCH_SPLIT=self.sketch_split,
                              QJL_COL=3 * self.tn * self.nch if self.octa else D, QJL_ROW_BYTES=D // 8)
        self.values = ValueFormat(BITS=self.vbits, ROW_BYTES=self.vc_bytes, GROUP=self.vg, GROUPS=D // self.vg,
                                  CHUNK=cw)


_PLANS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def plan_for(codec, device) -> _Plan:
    per = _PLANS.setdefault(codec, {})
    key = str(torch.device(device))
    if key not in per:
        per[key] = _Plan(codec.fused_layout(), codec, device)
    return per[key]
