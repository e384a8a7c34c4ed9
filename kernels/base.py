"""The one codec interface every KV-cache codec implements.

A codec turns keys ``[..., T, d]`` into an :class:`Encoded` state that holds only
packed integer codes and the side information the method needs (norms, scales,
zero points), and back. Rate is counted from the bytes of that state, never from a
formula alone, so a codec cannot under-report what it stores.
"""
from __future__ import annotations

from typing import Any, ClassVar

import torch

from kernels.backend import decide_commit, fused_wanted, resolve_backend, triton_unavailable, use_fused
from kernels.encoded import Encoded
from kernels.packing import BitField
from kernels.registry import codec_for
from kernels.checks import DeferredFinite, check_input
from kernels.config import CodecConfig
from kernels.triton.encoders import commit_unsupported, encoder_unsupported, fused_commit, fused_encoder
from kernels.values import ValueQuantizer
from registry.options import NoOptions

class Codec:
    """Base class. Subclasses set ``name`` (by ``@register_codec``), ``bits_supported`` and
    ``Options``, and implement encode/decode.

    Construction: ``Codec(config: CodecConfig, device='cpu')``, or ``make_codec(...)``; a subclass
    reads ``self.config`` and ``self.opts`` (its ``Options`` instance, every option present).
    ``num_heads`` > 1 means inputs are ``[..., H, T, d]`` and each head gets its own
    rotation signs (drawn from (seed, layer, head)); with 1 every vector shares them.
    """

    name: ClassVar[str] = "base"
    bits_supported: ClassVar[tuple[int, ...]] = ()
    #: tokens per encode unit: the cache only encodes multiples of this (KIVI groups tokens).
    token_block: int = 1
    #: True where ``score`` uses an estimator that differs from <q, decode(k)> (QJL-corrected).
    has_score_estimator: ClassVar[bool] = False
    #: True where the codec draws anything at random from its seed (rotation signs, projections):
    #: a run then repeats it for every codec seed; a deterministic codec runs once (tests check
    #: that this matches what the seed really changes)
    randomized: ClassVar[bool] = False
    #: True where the codec reproduces an inference engine's KV-cache format (kernels/engines/vllm_kv.py): values in the
    #: keys' format (``value_bits`` other than ``bits`` refused, ``value_group`` does not apply) and the engine's
    #: own arithmetic, which may round through the input's dtype
    engine_preset: ClassVar[bool] = False
    #: the engine whose cache the codec reproduces ('llama.cpp', 'vLLM', ...; kernels/engines/), None for a research
    #: codec: the report groups the deployed caches by it
    engine: ClassVar[str | None] = None
    #: the codec's options: a frozen dataclass with typed fields and defaults (kernels.config checks them)
    Options: ClassVar[type] = NoOptions

    def __init__(self, config: CodecConfig, device="cpu"):
        if config.name != self.name:
            raise ValueError(f"a '{config.name}' config cannot build codec '{self.name}'")
        why = self.head_dim_unsupported(config.head_dim)
        if why is not None:
            raise ValueError(f"codec '{self.name}': {why}")
        self.config = config  # checked when it was made; every option named
        self.opts = config.options  # the codec's Options instance
        self.bits = config.bits
        self.head_dim = config.head_dim
        self.seed = config.seed
        self.layer = config.layer
        self.num_heads = config.num_heads
        self.device = torch.device(device)
        self.backend = resolve_backend(config.backend)  # validated now, re-read (env) at each encode
        self._backend_arg = config.backend
        self.value_quantizer = ValueQuantizer(config.value_bits if config.value_bits is not None else config.bits,
                                              config.head_dim, group_size=config.value_group)

    @classmethod
    def engine_skipped_layers(cls, num_layers: int, options) -> set[int]:
        """Layers an engine's preset keeps uncompressed by itself (vLLM's TurboQuant: the first and last
        two), given the codec's ``Options`` instance; the cache keeps them native as it keeps ``--protect``'s."""
        return set()

    # --- the engine's behaviour around its bytes (kernels/attention.py and adapters/cache/layer_kv.py ask) ---
    def prepare_query(self, q: torch.Tensor) -> torch.Tensor:
        """The query [..., Tq, d] as the engine dots it with the stored keys (llama.cpp quantizes it to 8 bits
        per block of 32); the identity for every codec that leaves it alone. Native tokens see the query as given."""
        return q

    def stores_before_attending(self, held: int) -> bool:
        """True where the engine writes the tokens in flight to its cache before attending them, so they are
        attended as stored; False where it attends them in the model's precision (the cache's default).
        ``held``: tokens the layer holds before them."""
        return False

    def native_tokens(self, held: int) -> int | None:
        """How many of the ``held`` most recent tokens the engine keeps unquantized (MLX: every token until its
        ``quantized_kv_start``), or None: the run's ``--residual`` window decides."""
        return None

    @classmethod
    def head_dim_unsupported(cls, head_dim: int) -> str | None:
        """None where the codec takes keys of ``head_dim``, else why not (construction raises it)."""
        return None

    # --- keys -------------------------------------------------------------------------
    def encode(self, keys: torch.Tensor, defer: DeferredFinite | None = None) -> Encoded:
        """keys: [..., T, d] float -> Encoded (packed codes + side information). Non-finite keys
        raise a ValueError, or on CUDA are noted in ``defer`` (:class:`DeferredFinite`)."""
        fused = self._fused_encode_fn(keys)
        if fused is not None:
            return fused(self, keys, defer=defer)  # checks its input the same way
        check_input(keys, self.head_dim, defer=defer)
        return self._encode(keys)

    def _fused_encode_fn(self, keys: torch.Tensor):
        """The fused encoder for this call (``fn(codec, keys) -> Encoded``), or None for the PyTorch
        reference; the decision is :func:`kernels.backend.use_fused`'s."""
        if use_fused(self._backend_arg, keys.device, lambda: encoder_unsupported(self, keys.device),
                     f"encode with {self.describe()}"):
            return fused_encoder(self.fused_layout())
        return None

    def decode(self, state: Encoded) -> torch.Tensor:
        """Encoded -> reconstructed keys [..., T, d] in the input dtype."""
        return self._decode(state).to(state.dtype)

    def score(self, q: torch.Tensor, state: Encoded) -> torch.Tensor:
        """q: [..., Tq, d] (same leading dims as the keys) -> q·k estimates [..., Tq, T], float32.

        The default is <q, decode(k)>; codecs with a QJL residual override it with the
        unbiased corrected estimator.
        """
        k = self._decode(state).float()
        return q.float() @ k.transpose(-1, -2)

    def _encode(self, keys: torch.Tensor) -> Encoded:
        raise NotImplementedError

    def _decode(self, state: Encoded) -> torch.Tensor:
        raise NotImplementedError

    # --- values -------------------------------------------------------------------------
    def encode_values(self, values: torch.Tensor, defer: DeferredFinite | None = None) -> Encoded:
        """values: [..., T, d] float -> the value quantizer's state; on the fused path (backend
        'auto' on CUDA, or 'triton') one Triton launch writes the same bytes
        (:mod:`kernels.triton.value_encode`), else the PyTorch reference. ``defer`` as :meth:`encode`."""
        check_input(values, self.head_dim, "values", defer)
        if fused_wanted(self._backend_arg, values.device) and triton_unavailable(values.device) is None:
            from kernels.triton.value_encode import value_encode, value_encoder_unsupported

            if value_encoder_unsupported(self.value_quantizer, values.device) is None:
                return value_encode(self.value_quantizer, values)
        return self.value_quantizer.encode(values)

    def decode_values(self, state: Encoded) -> torch.Tensor:
        return self.value_quantizer.decode(state).to(state.dtype)

    # --- rate ---------------------------------------------------------------------------
    def expected_nbytes(self, shape: tuple[int, ...]) -> int:
        """Bytes of ``encode`` for keys of ``shape``, from the codec's own formula (tests compare)."""
        raise NotImplementedError

    # --- fused kernels ------------------------------------------------------------------
    def fused_layout(self):
        """The key layout the fused kernels read and write (:class:`kernels.fused_layout.FusedLayout`),
        or None: this codec has no fused path."""
        return None

    def fused_commit(self, device):
        """The class that commits a graphed decode step's token of this codec in one launch on ``device``
        (:class:`kernels.triton.commit.FusedCommit`), or None: where both of its encoders would run fused
        (its ``fused_layout()`` and value quantizer say so; :func:`kernels.backend.decide_commit` decides)."""
        if decide_commit(self._backend_arg, device, lambda: commit_unsupported(self, device)).fused:
            return fused_commit()
        return None

    def token_layout(self):
        """Keys and values as per-token scalar codes, as the per-token fused decode kernel reads them
        (:class:`kernels.token_layout.TokenLayout`: the engines' presets), or None."""
        return None

    def describe(self) -> str:
        return f"{self.name}@{self.bits}b"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(bits={self.bits}, head_dim={self.head_dim}, seed={self.seed}, layer={self.layer})"


def bitfield_bytes(shape: tuple[int, ...], n: int, bits: int) -> int:
    """Bytes of a per-token packed field of ``n`` codes of ``bits`` bits for vectors of ``shape``."""
    lead = 1
    for s in shape[:-1]:
        lead *= s
    return lead * BitField(n, bits).nbytes


_CONFIG_FIELDS = {"seed", "layer", "num_heads", "value_bits", "value_group", "backend"}


def make_codec(config: CodecConfig | Any, bits: int | None = None, head_dim: int | None = None, *,
               device="cpu", **kwargs) -> Codec:
    """Build a codec: ``make_codec(config, device=...)``, the codec chosen by the class of
    ``config.options`` (:func:`kernels.registry.codec_for`).

    Shorthands build the :class:`CodecConfig` first: ``make_codec(options, bits, head_dim, seed=.., layer=..,
    num_heads=.., value_bits=.., value_group=.., backend=.., device=..)`` from a codec's ``Options`` instance,
    and ``make_codec(name, bits, head_dim, ..., **options)`` from its name (keywords that are not config
    fields are the codec's options).
    """
    if not isinstance(config, CodecConfig):
        settings = {k: v for k, v in kwargs.items() if k in _CONFIG_FIELDS}
        if isinstance(config, str):
            options = {k: v for k, v in kwargs.items() if k not in _CONFIG_FIELDS}
            config = CodecConfig(name=config, bits=bits, head_dim=head_dim, options=options, **settings)
        else:
            if set(kwargs) - _CONFIG_FIELDS:
                raise TypeError(f"make_codec(options, ...) takes the options in the instance, not as keywords "
                                f"{sorted(set(kwargs) - _CONFIG_FIELDS)}")
            config = CodecConfig(name=codec_for(config).name, bits=bits, head_dim=head_dim, options=config,
                                 **settings)
    elif bits is not None or head_dim is not None or kwargs:
        raise TypeError("make_codec(config) takes only device=...; bits, head_dim and options live in the config")
    return codec_for(config.options)(config, device=device)
