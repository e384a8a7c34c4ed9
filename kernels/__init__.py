"""KV-cache codecs: the research codecs (``kernels.codecs``) and the engines' deployed caches
(``kernels.engines``), each a PyTorch reference on the shared base of this package, with fused Triton
(``kernels.triton``) and CUDA (``kernels.cuda``) kernels.

Use ``make_codec(CodecConfig(name, bits, head_dim, ...))``, or the shorthands ``make_codec(options, bits,
head_dim, ...)`` (a codec's ``Options`` instance names its codec) and ``make_codec(name, bits, head_dim, ...)``;
``list_codecs()`` says what exists.
"""
from kernels.base import Codec, make_codec
from kernels.config import CodecConfig, codec_options
from kernels.encoded import Encoded
from kernels.registry import CODECS, REGISTRY, codec_class, codec_for, list_codecs, register_codec
from kernels.seeding import derive_seed, private_generator

# Every module of kernels/codecs/ and kernels/engines/ is imported, so a codec registers itself by
# existing (no hand-kept list to forget it in); the kernels' subpackages are imported where used.
REGISTRY.discover()

__all__ = ["Codec", "CodecConfig", "Encoded", "CODECS", "codec_class", "codec_for", "codec_options", "list_codecs",
           "make_codec", "register_codec", "derive_seed", "private_generator"]
