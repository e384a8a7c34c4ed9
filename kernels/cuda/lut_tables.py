"""The tables of the table-lookup decode kernel (:mod:`kernels.cuda.decode_lut`), pure PyTorch (tested
on the CPU): how a group code of the declared key layout (:attr:`kernels.fused_layout.FusedLayout.groups`)
becomes the 4 tensor-core fragment slots it feeds (:class:`Lookup`), the tables built from the
layout's codebooks (:func:`lut_tables`), and the rotated keys rebuilt from stored codes exactly as the
kernel indexes the tables (:func:`table_keys`)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.fused_layout import FusedLayout, KeyCodes
from kernels.octahedral import octa_decode
from kernels.packing import BitField

TSCALE = 8.0  #: table entries are TSCALE * the rotated unit key's coordinates (kept in fp16's normal range)


@dataclass(frozen=True)
class Lookup:
    """How the kernel turns one group code (:attr:`FusedLayout.groups`) into the 4 fragment slots
    (x, y, z, w) it feeds: ``lookups`` = 1: one 8-byte entry (x, y, z, w) indexed by the code's low
    ``index_bits``, times (where ``scale_bits`` > 0) a half2 factor indexed by the next scale_bits;
    ``lookups`` = 2: two 4-byte entries, (x, y) indexed by the low index_bits and (z, w) by the
    next index_bits. The kernel's constants LOOKUPS, INDEX_BITS, SCALE_BITS."""

    lookups: int
    index_bits: int
    scale_bits: int = 0

    @property
    def entry_bytes(self) -> int:
        return 8 // self.lookups

    @property
    def entries(self) -> int:
        return 1 << self.index_bits


def lookup_for(layout: FusedLayout, config) -> Lookup:
    """The lookup a launch config (:class:`kernels.cuda.lut_config.LutConfig`) asks for: octahedral keys
    ``fused`` (the whole triplet code) or not ((u, v) and a rho factor); scalar keys ``pairs`` (two codes
    per lookup) or not (four)."""
    if layout.keys == KeyCodes.OCTAHEDRAL:
        b_u, b_r = layout.bits
        return Lookup(1, 2 * b_u + b_r) if config.fused else Lookup(1, 2 * b_u, b_r)
    b = layout.bits[0]
    return Lookup(2, 2 * b) if config.pairs else Lookup(1, 4 * b)


def lut_tables(layout: FusedLayout, lookup: Lookup) -> tuple[torch.Tensor, torch.Tensor]:
    """(table, scale) on the CPU, from the layout's codebooks. table: fp16 [entries, 4 // lookups],
    row = TSCALE * the slots that index gives (see :class:`Lookup`). Octahedral (codebooks:
    coordinate centroids c, triplet lengths rho_c): row ``u | v << b_u (| r << 2 b_u)`` =
    TSCALE * (rho_c[r] *) octa_decode(c[u], c[v]), 4th slot 0; scale: fp16 [2^b_r, 2] =
    (rho_c[r], rho_c[r]) (the unfused kernel multiplies half2 by it), empty where scale_bits = 0.
    Scalar (codebook c): row ``i_0 | i_1 << b (| i_2 << 2 b | i_3 << 3 b)`` = TSCALE * (c[i_0], ...)."""
    per = 4 // lookup.lookups  # slots per entry
    if layout.keys == KeyCodes.OCTAHEDRAL:
        b_u, _ = layout.bits
        c, rho = (cb.detach().cpu().float() for cb in layout.codebooks)
        K = 1 << b_u
        cu, cv = torch.meshgrid(c, c, indexing="ij")
        grid = octa_decode(torch.stack((cu, cv), dim=-1)).reshape(-1, 3)  # row iu * K + iv, as the reference's
        p = torch.arange(K * K)
        dirs = grid[(p & (K - 1)) * K + (p >> b_u)].double()  # [K*K, 3], row u | v << b_u
        rho = rho.double()  # [2^b_r]
        ent = (rho[:, None, None] * dirs[None]).reshape(-1, 3) if lookup.scale_bits == 0 else dirs
        assert ent.shape[0] == lookup.entries
        tab = torch.zeros(ent.shape[0], 4, dtype=torch.float64)
        tab[:, :3] = ent * TSCALE
        scale = torch.stack((rho, rho), -1) if lookup.scale_bits else torch.zeros(0, 2)
        return tab.to(torch.float16), scale.to(torch.float16)
    b = layout.bits[0]
    c = layout.codebooks[0].detach().cpu().double()
    p = torch.arange(lookup.entries)
    codes = torch.stack([(p >> (i * b)) & ((1 << b) - 1) for i in range(per)], -1)  # [entries, per]
    return (c[codes] * TSCALE).to(torch.float16), torch.zeros(0, 2, dtype=torch.float16)


def group_codes(layout: FusedLayout, row: torch.Tensor) -> torch.Tensor:
    """uint8 codes rows [..., nbytes] -> the group codes (:attr:`FusedLayout.groups`), int64 [..., count]."""
    g = layout.groups
    return BitField(g.count, g.width).unpack(row)


def table_keys(layout: FusedLayout, fields: dict, lookup: Lookup) -> torch.Tensor:
    """Rotated-frame keys (unit norm, [..., T, n], float32) rebuilt from the stored fields with the
    tables alone, exactly as the kernel indexes them: the CPU test of the tables and their index."""
    tab, scale = lut_tables(layout, lookup)
    code = group_codes(layout, fields[layout.codes_field])  # [..., groups], as stored
    m, ib = lookup.entries - 1, lookup.index_bits
    if lookup.lookups == 2:
        e = torch.cat((tab[code & m].float(), tab[(code >> ib) & m].float()), -1)
    else:
        e = tab[code & m].float()
        if lookup.scale_bits:
            e = e * scale[(code >> ib) & ((1 << lookup.scale_bits) - 1)][..., :1].float()
    t = e[..., : layout.groups.coords] / TSCALE  # [..., groups, coords]
    return t.flatten(-2)[..., : layout.padded]
