"""Codecs declare what the fused kernels need as data (kernels.fused_layout.FusedLayout); the
kernels' supports(), the encoders and the decode plan read that declaration, never a codec name."""
from __future__ import annotations

import pytest
import torch

from kernels import codec_class, list_codecs, make_codec
from kernels.fused_layout import FusedLayout, KeyCodes, QJLResidual, Sketch
from kernels.codecs.octopus import Octopus
from kernels.codecs.turboquant import TurboQuantProd

FUSED = {"octopus": (KeyCodes.OCTAHEDRAL, None), "octopus-qjl": (KeyCodes.OCTAHEDRAL, Sketch.ROTATION),
         "turboquant-mse": (KeyCodes.SCALAR, None), "turboquant-prod": (KeyCodes.SCALAR, Sketch.GAUSSIAN)}


@pytest.mark.parametrize("name", sorted(list_codecs()))
def test_declared_layout_matches_the_state(name):
    """Every codec: a layout or None; a layout names the fields of the state encode writes, with
    the packed sizes it declares."""
    bits = list_codecs()[name]
    if not bits:
        pytest.skip("no bit width")
    d = 64 if codec_class(name).head_dim_unsupported(64) is None else 128  # mlx-g128 quantizes groups of 128
    codec = make_codec(name, 3 if 3 in bits else bits[0], d, num_heads=2, backend="torch")
    layout = codec.fused_layout()
    if name not in FUSED:
        assert layout is None
        return
    keys, sketch = FUSED[name]
    assert layout.keys == keys and (layout.residual.sketch if layout.residual else None) == sketch
    t = codec.encode(torch.randn(1, 2, 5, 64)).tensors
    assert t[layout.norm_field].shape[-1] == 1
    assert t[layout.codes_field].shape[-1] == layout.codes.nbytes
    assert set(t) == {layout.norm_field, layout.codes_field} | (
        {layout.residual.bits_field, layout.residual.norm_field} if layout.residual else set())
    if layout.residual is not None:
        assert t[layout.residual.bits_field].shape[-1] * 8 >= layout.residual.m
        assert t[layout.residual.norm_field].dtype == torch.float16


def test_layout_checks_itself():
    rot = make_codec("octopus", 3, 64).fused_layout().rotation
    with pytest.raises(ValueError, match="octahedral keys take 2 bit width"):
        FusedLayout(KeyCodes.OCTAHEDRAL, rot, (3,), (torch.zeros(8),))
    with pytest.raises(ValueError, match="gaussian QJL sketch needs its matrix"):
        QJLResidual(Sketch.GAUSSIAN, 64, 1.0)


def test_kernels_read_the_layout_not_the_name():
    """A codec under another name with the same layout gets the fused path unchanged."""
    pytest.importorskip("triton")
    from kernels.triton.decode_attention import supports
    from kernels.triton.decode_plan import plan_for
    from kernels.triton.encoders import encoder_unsupported

    class Renamed(Octopus):
        name = "renamed-octahedral"

    class RenamedProd(TurboQuantProd):
        name = "renamed-prod"

    # the device the Triton kernels run on here: CUDA, or the CPU under TRITON_INTERPRET=1 (conftest)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    # built as the registered codec, then renamed: only the name differs from what the kernels know
    codec = make_codec("octopus", 3, 64, num_heads=2)
    codec.__class__ = Renamed
    assert supports(codec) is None and encoder_unsupported(codec, dev) is None
    plan = plan_for(codec, "cpu")
    assert plan.octa and not plan.qjl
    prod = make_codec("turboquant-prod", 3, 64, num_heads=2)
    prod.__class__ = RenamedProd
    assert supports(prod) is None and "QJL residual" in encoder_unsupported(prod, dev)
    plan = plan_for(prod, "cpu")
    assert not plan.octa and plan.qjl and plan.sketch_split
    assert "no fused layout" in supports(make_codec("kivi", 2, 64))


@pytest.mark.parametrize("name,bits", [("octopus", 2), ("octopus", 3), ("octopus", 4), ("turboquant-mse", 2),
                                       ("turboquant-mse", 3), ("turboquant-mse", 4)])
def test_code_groups_are_the_stored_codes(name, bits):
    """FusedLayout.groups reads the stored codes row as group codes: OCTOPUS's fused triplet codes,
    TurboQuant's 4 adjacent scalar codes (code 4g + i at bits [i b, (i + 1) b) of group g)."""
    from kernels.packing import BitField

    codec = make_codec(name, bits, 128, num_heads=2, backend="torch")
    layout = codec.fused_layout()
    row = codec.encode(torch.randn(1, 2, 9, 128, generator=torch.Generator().manual_seed(bits))).tensors[layout.codes_field]
    g = layout.groups
    got = BitField(g.count, g.width).unpack(row)
    if name == "octopus":
        assert (g.count, g.coords) == (43, 3) and torch.equal(got, layout.codes.fused(row))
    else:
        codes = layout.codes.unpack(row).unflatten(-1, (-1, 4))  # [..., 32, 4]
        want = sum(codes[..., i] << (bits * i) for i in range(4))
        assert (g.count, g.width, g.coords) == (32, 4 * bits, 4) and torch.equal(got, want)
