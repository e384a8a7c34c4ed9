"""KV-cache codecs: PyTorch references (this package) and fused Triton kernels (``kernels.triton``).

Use ``make_codec(CodecConfig(name, bits, head_dim, ...))`` or the shorthand
``make_codec(name, bits, head_dim, ...)``; ``list_codecs()`` says what exists.
"""
import importlib
import pkgutil

from .base import Codec, derive_seed, private_generator
from .config import CodecConfig, parse_codec_options
from .encoded import Encoded
from .registry import CODECS, codec_class, list_codecs, make_codec, register_codec

# Every module of this package is imported, so a codec module registers itself by existing
# (no hand-kept list to forget it in); subpackages (triton) are imported where used.
for _info in pkgutil.iter_modules(__path__):
    if not _info.ispkg and not _info.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_info.name}")

__all__ = ["Codec", "CodecConfig", "Encoded", "CODECS", "codec_class", "list_codecs", "make_codec",
           "parse_codec_options", "register_codec", "derive_seed", "private_generator"]
