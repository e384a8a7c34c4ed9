"""KV-cache codecs: PyTorch references (this package) and fused Triton kernels (``kernels.triton``).

Use ``make_codec(name, bits, head_dim, ...)``; ``list_codecs()`` says what exists.
"""
import importlib

from .base import Codec, CodecConfig, Encoded, derive_seed, private_generator
from .registry import CODECS, codec_class, list_codecs, make_codec, register_codec

# One module per codec; importing it registers it. A module that is not written yet is skipped
# so that the registry lists exactly what exists.
for _mod in ("native", "turboquant", "qjl", "octopus", "polarquant", "polar2d", "quarot", "kivi"):
    try:
        importlib.import_module(f"{__name__}.{_mod}")
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.{_mod}":
            raise

__all__ = ["Codec", "CodecConfig", "Encoded", "CODECS", "codec_class", "list_codecs", "make_codec",
           "register_codec", "derive_seed", "private_generator"]
