"""The one codec interface every KV-cache codec implements.

A codec turns keys ``[..., T, d]`` into an :class:`Encoded` state that holds only
packed integer codes and the side information the method needs (norms, scales,
zero points), and back. Rate is counted from the bytes of that state, never from a
formula alone, so a codec cannot under-report what it stores.
"""
from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from typing import ClassVar

import torch

from .backend import resolve_backend, use_fused
from .packing import BitField

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def derive_seed(*parts) -> int:
    """A stable 63-bit seed from any parts (seed, layer, purpose, ...); independent of Python's hash salt."""
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def private_generator(*parts, device="cpu") -> torch.Generator:
    """A torch.Generator seeded from ``parts``: every random draw in the project goes through one of these."""
    g = torch.Generator(device=device)
    g.manual_seed(derive_seed(*parts))
    return g


def check_finite(x: torch.Tensor, what: str = "keys") -> None:
    """Raise a ValueError that names the first non-finite entry of ``x``."""
    bad = ~torch.isfinite(x)
    if bool(bad.any()):
        idx = tuple(int(i) for i in bad.nonzero()[0].tolist())
        value = x[idx].item()
        raise ValueError(
            f"{what} contain {int(bad.sum())} non-finite value(s); the first is {value} at index {idx} "
            f"of a tensor of shape {tuple(x.shape)}. Check the model's activations (fp16 overflow?) "
            f"before compressing them."
        )


def check_input(x: torch.Tensor, head_dim: int, what: str = "keys") -> None:
    if not torch.is_floating_point(x) or x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{what} must be float32, float16 or bfloat16, got {x.dtype}")
    if x.dim() < 2:
        raise ValueError(f"{what} must have shape [..., T, d], got {tuple(x.shape)}")
    if x.shape[-1] != head_dim:
        raise ValueError(
            f"{what} have head dim {x.shape[-1]} but the codec was built for head_dim={head_dim}; "
            f"build it with head_dim={x.shape[-1]}"
        )
    check_finite(x, what)


def reject_unknown_options(codec: Codec, allowed: tuple[str, ...]) -> None:
    """Raise on an option the codec does not read (a typo must not silently give the default)."""
    unknown = sorted(set(codec.options) - set(allowed))
    if unknown:
        raise ValueError(f"codec '{codec.name}' got unknown option(s) {unknown}; "
                         f"it takes {list(allowed) or 'none'}")


@dataclass
class Encoded:
    """A compressed block of vectors ``[..., T, d]``.

    ``tensors`` maps a field name to a tensor whose shape is ``[..., T, k]`` (per-token
    fields) or ``[..., T // G, k]`` (per-token-group fields, KIVI): concatenating two
    states along the token axis is concatenating every field along dim -2.
    Float side information (norms, scales) is stored at the dtype the method stores it
    in, and counted as such.
    """

    tensors: dict[str, torch.Tensor]
    shape: tuple[int, ...]  # original [..., T, d]
    dtype: torch.dtype  # dtype decode returns

    @property
    def num_tokens(self) -> int:
        return self.shape[-2]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    def num_coords(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    def bits_per_coord(self) -> float:
        """True bits per original coordinate, from the bytes actually stored."""
        return 8.0 * self.nbytes() / max(self.num_coords(), 1)

    def to(self, device) -> "Encoded":
        return Encoded({k: v.to(device) for k, v in self.tensors.items()}, self.shape, self.dtype)

    @staticmethod
    def cat(states: list["Encoded"]) -> "Encoded":
        """Concatenate states along the token axis (each must cover whole token groups)."""
        first = states[0]
        tensors = {k: torch.cat([s.tensors[k] for s in states], dim=-2) for k in first.tensors}
        T = sum(s.shape[-2] for s in states)
        return Encoded(tensors, (*first.shape[:-2], T, first.shape[-1]), first.dtype)


@dataclass
class CodecConfig:
    """What builds a codec; round-trips to JSON and is embedded in every report."""

    name: str
    bits: int
    head_dim: int
    seed: int = 0
    layer: int = 0
    num_heads: int = 1
    options: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return asdict(self)


class Codec:
    """Base class. Subclasses set ``name``, ``bits_supported`` and implement encode/decode.

    Construction: ``Codec(bits, head_dim, seed=0, layer=0, num_heads=1, device='cpu', **options)``.
    ``num_heads`` > 1 means inputs are ``[..., H, T, d]`` and each head gets its own
    rotation signs (drawn from (seed, layer, head)); with 1 every vector shares them.
    """

    name: ClassVar[str] = "base"
    bits_supported: ClassVar[tuple[int, ...]] = ()
    #: tokens per encode unit: the cache only encodes multiples of this (KIVI groups tokens).
    token_block: int = 1
    #: True where ``score`` uses an estimator that differs from <q, decode(k)> (QJL-corrected).
    has_score_estimator: ClassVar[bool] = False

    def __init__(self, bits: int, head_dim: int, seed: int = 0, layer: int = 0, num_heads: int = 1,
                 device="cpu", value_bits: int | None = None, value_group: int = 32, backend: str = "auto",
                 **options):
        if bits not in self.bits_supported:
            raise ValueError(
                f"codec '{self.name}' does not support bits={bits}; supported: {list(self.bits_supported)}"
            )
        if head_dim < 2:
            raise ValueError(f"head_dim must be >= 2, got {head_dim}")
        self.bits = bits
        self.head_dim = head_dim
        self.seed = seed
        self.layer = layer
        self.num_heads = num_heads
        self.device = torch.device(device)
        self.backend = resolve_backend(backend)  # validated now, re-read (env) at each encode
        self._backend_arg = backend
        self.options = options
        from .values import ValueQuantizer  # local: values imports base

        self.value_quantizer = ValueQuantizer(value_bits if value_bits is not None else bits,
                                              head_dim, group_size=value_group)
        self.config = CodecConfig(self.name, bits, head_dim, seed, layer, num_heads,
                                  {"value_bits": self.value_quantizer.bits, "value_group": value_group, **options})

    # --- keys -------------------------------------------------------------------------
    def encode(self, keys: torch.Tensor) -> Encoded:
        """keys: [..., T, d] float -> Encoded (packed codes + side information)."""
        fused = self._fused_encode_fn(keys)
        if fused is not None:
            return fused(self, keys)  # checks its input the same way
        check_input(keys, self.head_dim)
        return self._encode(keys)

    def _fused_encode_fn(self, keys: torch.Tensor):
        """The fused encoder for this call (``fn(codec, keys) -> Encoded``), or None for the PyTorch
        reference; the decision is :func:`kernels.backend.use_fused`'s."""
        from .triton.encoders import encoder_unsupported, fused_encoder

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
    def encode_values(self, values: torch.Tensor) -> Encoded:
        check_input(values, self.head_dim, "values")
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
