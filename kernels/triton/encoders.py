"""Which fused key encoder writes which key layout (:class:`kernels.fused_layout.KeyCodes`), and which
codecs a decode step commits in one launch (:mod:`kernels.triton.commit`).

An encoder ``fn(codec, keys [..., T, d]) -> Encoded`` writes the key codes of
``codec.fused_layout()`` (norm and packed codes, byte for byte the reference's up to the stated
rounding tolerance); its module's ``supports(layout) -> reason | None`` says what it covers.
Importing this module does not import triton; the encoder modules are imported on first use.
"""
from __future__ import annotations

import importlib

from kernels.triton import unavailable as triton_unavailable
from kernels.fused_layout import FusedLayout, KeyCodes

#: key layout -> (module in kernels.triton, function)
ENCODERS = {
    KeyCodes.OCTAHEDRAL: ("octopus_encode", "octopus_encode"),
    KeyCodes.SCALAR: ("turboquant_encode", "turboquant_mse_encode"),
}


def _module(layout: FusedLayout):
    return importlib.import_module(f"{__package__}.{ENCODERS[layout.keys][0]}")


def encoder_unsupported(codec, device) -> str | None:
    """None when a fused encoder writes ``codec``'s whole key state on ``device``, else why not."""
    layout = codec.fused_layout()
    if layout is None:
        return f"codec '{codec.name}' has no fused encoder (it declares no fused layout)"
    if layout.residual is not None:
        return (f"codec '{codec.name}' has no fused encoder for its whole state (the encoders write the key "
                f"codes, not the QJL residual)")
    why = triton_unavailable(device)
    return why if why is not None else _module(layout).supports(layout)


def fused_encoder(layout: FusedLayout):
    """The encoder function for ``layout``'s key codes."""
    return getattr(_module(layout), ENCODERS[layout.keys][1])


def commit_unsupported(codec, device) -> str | None:
    """None when a graphed decode step's commit of ``codec`` runs as one launch on ``device``
    (:class:`kernels.triton.commit.FusedCommit`): a fused encoder writes its whole key state and the fused
    value encoder its values (what its ``fused_layout()`` and value quantizer declare), else why not."""
    why = encoder_unsupported(codec, device)
    if why is not None:
        return why
    from kernels.triton.value_encode import value_encoder_unsupported

    return value_encoder_unsupported(codec.value_quantizer, device)


def fused_commit():
    """The class of the fused commit (:class:`kernels.triton.commit.FusedCommit`)."""
    return importlib.import_module(f"{__package__}.commit").FusedCommit
