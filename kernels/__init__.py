"""KV-cache codecs: PyTorch references (this package) and fused Triton kernels (``kernels.triton``).

Use ``make_codec(CodecConfig(name, bits, head_dim, ...))``, or the shorthands ``make_codec(options, bits,
head_dim, ...)`` (a codec's ``Options`` instance names its codec) and ``make_codec(name, bits, head_dim, ...)``;
``list_codecs()`` says what exists.
"""
from kernels.base import Codec
from kernels.config import CodecConfig, codec_options, make_codec
from kernels.encoded import Encoded
from kernels.registry import CODECS, REGISTRY, codec_class, codec_for, list_codecs, register_codec
from kernels.seeding import derive_seed, private_generator

# Every module of this package is imported, so a codec module registers itself by existing
# (no hand-kept list to forget it in); subpackages (triton) are imported where used.
REGISTRY.discover()

__all__ = ["Codec", "CodecConfig", "Encoded", "CODECS", "codec_class", "codec_for", "codec_options", "list_codecs",
           "make_codec", "register_codec", "derive_seed", "private_generator"]
