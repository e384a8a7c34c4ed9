"""An inference engine's KV-cache format as a codec: :class:`EnginePreset`, the base of the engines'
presets (one module per engine family in kernels/engines/), and what several share: the fp8 and fp4 casts, nibble
packing, C's rounding, per-tensor fp8 and NVFP4. A preset stores keys and values in the engine's format (values at the preset's bits: ``--value-bits``
does not apply) and reproduces the engine's arithmetic, so a report compares what runs today with the
research codecs on the same prompts.
"""
from __future__ import annotations

import inspect
import math
from dataclasses import dataclass

import torch

from kernels.base import Codec
from kernels.encoded import Encoded
from kernels.token_layout import BlockScale, Element, TokenCodes, TokenLayout
from registry.options import Allowed, option

FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
_FP32 = torch.finfo(torch.float32)
#: a per-layer scale (1.0 without a calibrated checkpoint's): float32 in the engines, so a normal float32 (zero,
#: a subnormal or one past float32 would divide every coordinate to inf or NaN)
SCALE = Allowed(lo=_FP32.tiny, hi=_FP32.max)


def fp8_saturate(x: torch.Tensor, kind: str) -> torch.Tensor:
    """float32 -> fp8 bit patterns (uint8), clamped to the largest finite value (SATFINITE), rounded
    to nearest even (torch's cast)."""
    dtype = FP8[kind]
    top = torch.finfo(dtype).max
    return x.float().clamp(-top, top).to(dtype).view(torch.uint8)


def fp8_value(codes: torch.Tensor, kind: str) -> torch.Tensor:
    return codes.view(FP8[kind]).float()


#: e2m1 magnitudes by their 3 low bits (bit 3 is the sign)
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_E2M1_EDGES = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)  # midpoints between neighbouring magnitudes


def e2m1_codes(y: torch.Tensor, ties: str) -> torch.Tensor:
    """float32 -> fp4 e2m1 codes (uint8, 0..15), saturating at 6; a tie between two magnitudes goes to
    the even code (``ties='even'``: round to nearest even, the hardware cast) or the larger magnitude
    (``'away'``). The sign bit is set for every negative input, zeros included."""
    a = y.abs()
    mag = torch.zeros_like(a, dtype=torch.uint8)
    for i, edge in enumerate(_E2M1_EDGES):  # at a tie the odd code i+1 loses under 'even'
        up = (a > edge) if (ties == "even" and i % 2 == 0) else (a >= edge)
        mag += up.to(torch.uint8)
    return mag | ((y < 0).to(torch.uint8) << 3)


_ON_DEVICE: dict[tuple, tuple[object, torch.Tensor]] = {}  # the source kept alive: its id() is never reused


def on_device(values, device, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A constant (a tuple of numbers, or a tensor kept for the process's life) on ``device``, made once: a
    graphed decode step captures the encoders, and a copy from the host inside a capture is refused."""
    key = (id(values) if isinstance(values, torch.Tensor) else values, str(torch.device(device)), dtype)
    hit = _ON_DEVICE.get(key)
    if hit is None:
        src = values if isinstance(values, torch.Tensor) else torch.tensor(values)
        hit = _ON_DEVICE[key] = (values, src.to(device=device, dtype=dtype))
    return hit[1]


def e2m1_value(codes: torch.Tensor) -> torch.Tensor:
    mag = on_device(tuple(E2M1), codes.device)[(codes & 7).long()]
    return torch.where((codes & 8) != 0, -mag, mag)


def round_half_away(x: torch.Tensor) -> torch.Tensor:
    """C's ``roundf`` (and Metal's ``round``): to the nearest integer, halfway cases away from zero; exact for every
    float (``floor(x + 0.5)`` is not: 0.49999997 + 0.5 rounds up to 1)."""
    t = x.trunc()
    return torch.where((x - t).abs() == 0.5, t + x.sign(), x.round())


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """uint8 [..., n] (values < 16) -> [..., n / 2]: element 2i in the low nibble, 2i + 1 in the high."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    return torch.stack([packed & 15, packed >> 4], dim=-1).flatten(-2)


def rate(cls: type, bits: int, head_dim: int = 128, dtype: torch.dtype = torch.float16) -> tuple[float, float]:
    """Bits an engine's cache stores per coordinate, (keys, values), counted from its byte formula at ``bits`` and
    ``head_dim``, with the scales that take the model's dtype in ``dtype`` (16-bit: how engines run)."""
    from kernels.base import make_codec

    codec = make_codec(cls.name, bits, head_dim)
    shape = (1, head_dim)
    if "dtype" in inspect.signature(codec.expected_nbytes).parameters:
        k, v = codec.expected_nbytes(shape, dtype), codec.expected_value_nbytes(shape, dtype)
    else:
        k, v = codec.expected_nbytes(shape), codec.expected_value_nbytes(shape)
    return 8 * k / head_dim, 8 * v / head_dim


class _PresetValues:
    """The value side of a preset, in the preset's format (what ``Codec.value_quantizer`` holds)."""

    def __init__(self, codec: "EnginePreset"):
        self.codec, self.bits, self.head_dim = codec, codec.value_bits, codec.head_dim

    def encode(self, v: torch.Tensor) -> Encoded:
        return Encoded(self.codec._quantize(v, "v"), tuple(v.shape), v.dtype)

    def decode(self, state: Encoded) -> torch.Tensor:
        return self.codec._dequantize(state.tensors, "v")

    def expected_nbytes(self, shape) -> int:
        return self.codec.expected_value_nbytes(shape)


class EnginePreset(Codec):
    """Keys and values in one engine's format; subclasses give ``_quantize`` and ``_dequantize`` over
    ``[..., T, d]`` (``side`` 'k' or 'v'), ``bytes_per_vector`` (keys) and, where values differ in size,
    ``expected_value_nbytes``."""
    engine_preset = True

    #: the preset's value bits (None: the key bits)
    preset_value_bits: int | None = None
    #: what its engine writes or scales at a time, ``{n}`` coordinates (:meth:`head_multiple`): a head dim must be a
    #: multiple of them (None: any head dim its own checks take)
    head_block_why: str | None = None
    head_block: int | None = None  # None: the preset's ``group``

    @classmethod
    def head_multiple(cls) -> int:
        """The coordinates the engine handles at a time (``head_block``, else the preset's ``group``)."""
        return cls.head_block or cls.group

    @classmethod
    def head_dim_unsupported(cls, head_dim):
        if cls.head_block_why is not None and head_dim % cls.head_multiple():
            why = cls.head_block_why.format(n=cls.head_multiple(), engine=cls.engine)
            return f"{why}: head dim {head_dim} is no multiple"
        return None

    def __init__(self, config, device="cpu"):
        super().__init__(config, device)
        self.value_bits = self.preset_value_bits or config.bits
        if config.value_bits not in (None, self.value_bits):
            raise ValueError(f"codec '{self.name}' stores values as its engine does, at {self.value_bits} bits: leave "
                             f"--value-bits out (got {config.value_bits})")
        self.value_quantizer = _PresetValues(self)

    def token_layout(self):
        # built once: the decode dispatch asks at every step, inside CUDA graph captures too
        if not hasattr(self, "_token_layout"):
            self._token_layout = self._build_token_layout()
        return self._token_layout

    def _build_token_layout(self):
        """The preset's :class:`TokenLayout` (tensors on the CPU), or None where no fused kernel reads it."""
        return None

    def _encode(self, keys):
        return Encoded(self._quantize(keys, "k"), tuple(keys.shape), keys.dtype)

    def _decode(self, state):
        return self._dequantize(state.tensors, "k")

    def expected_nbytes(self, shape):
        return math.prod(shape[:-1]) * self.bytes_per_vector

    def stores_before_attending(self, held):
        """Where the preset's ``new_tokens`` option (llama.cpp, ExLlama, LMDeploy) says 'stored'."""
        return getattr(self.opts, "new_tokens", "native") == "stored"

    def expected_value_nbytes(self, shape):
        return self.expected_nbytes(shape)

    def _quantize(self, x: torch.Tensor, side: str) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def _dequantize(self, t: dict[str, torch.Tensor], side: str) -> torch.Tensor:
        raise NotImplementedError


class PerTensorFp8(EnginePreset):
    """Keys and values in fp8 (``kind`` 'e4m3' or 'e5m2') after one scale per layer each (``k_scale``,
    ``v_scale``: 1.0 where the checkpoint has none); subclasses give the engine's ``_quantize``. The two
    float32 scales are per layer, not per token: one byte per coordinate."""
    kind = "e4m3"

    @dataclass(frozen=True)
    class Options:
        k_scale: float = option(1.0, "the per-layer key scale", SCALE)
        v_scale: float = option(1.0, "the per-layer value scale", SCALE)

    def __init__(self, config, device="cpu"):
        super().__init__(config, device)
        self.bytes_per_vector = self.head_dim

    def _scale(self, side: str) -> float:
        return self.opts.k_scale if side == "k" else self.opts.v_scale

    def _dequantize(self, t, side):
        return fp8_value(t["codes"], self.kind) * self._scale(side)

    def _build_token_layout(self):
        element = Element(self.kind)
        return TokenLayout(TokenCodes(element, scale=self.opts.k_scale), TokenCodes(element, scale=self.opts.v_scale))


class BlockFp4(EnginePreset):
    """fp4 e2m1 codes in blocks of 16 coordinates with one scale byte each (NVFP4, MX), two codes per byte
    (element 2i in the low nibble): ``codes`` uint8 [..., T, d/2] and ``scale`` uint8 [..., T, d/16],
    ``d / 2 + d / 16`` bytes a token-head. Subclasses give ``_quantize``, the engine's name (``engine``),
    how a scale byte reads (``block_scale``, :meth:`_block_scale`) and any per-layer scale
    (:meth:`_tensor_scale`), and ``bits_supported = (4,)``."""
    group = 16
    engine: str
    block_scale: BlockScale
    head_block_why = "{engine}'s fp4 cache scales blocks of {n} coordinates"

    def __init__(self, config, device="cpu"):
        super().__init__(config, device)
        self.bytes_per_vector = self.head_dim // 2 + self.head_dim // self.group

    def _tensor_scale(self, side: str) -> float:
        return 1.0

    def _block_scale(self, sf: torch.Tensor) -> torch.Tensor:
        """uint8 scale bytes -> float32 block scales."""
        raise NotImplementedError

    def _dequantize(self, t, side):
        y = e2m1_value(unpack_nibbles(t["codes"])).unflatten(-1, (-1, self.group))
        return (y * self._block_scale(t["scale"]).unsqueeze(-1)).flatten(-2) * self._tensor_scale(side)

    def _build_token_layout(self):
        def side(s):
            return TokenCodes(Element.E2M1, bits=4, scale_field="scale", scale=self._tensor_scale(s), group=self.group,
                              block_scale=self.block_scale)
        return TokenLayout(side("k"), side("v"))


class Nvfp4(BlockFp4, PerTensorFp8):
    """NVFP4 as TensorRT-LLM writes it (``cvt_warp_fp16_to_fp4``, which vLLM's ``nvfp4`` cache took over): per
    block of 16, ``sf = g * (amax * (1 / 6))`` stored as fp8 e4m3 (nearest even, saturating) with ``g = 1 /
    k_scale``, then each coordinate times ``1 / (sf * k_scale)`` rounded to e2m1 (``cvt.rn.satfinite.e2m1x2``:
    ties to even, saturating at 6); read back as ``e2m1 * sf * k_scale``. Subclasses give ``engine``."""
    block_scale = BlockScale.E4M3

    def _tensor_scale(self, side):
        return self._scale(side)

    def _block_scale(self, sf):
        return fp8_value(sf, "e4m3")

    def _quantize(self, x, side):
        xb = x.float().unflatten(-1, (-1, self.group))
        g = torch.tensor(1.0 / self._scale(side))  # float32 throughout, as the kernel
        sf = fp8_saturate(g * (xb.abs().amax(-1) * torch.tensor(1.0 / 6.0)), "e4m3")
        s = fp8_value(sf, "e4m3").unsqueeze(-1)
        inv = torch.where(s != 0, 1.0 / (s * (1.0 / g)), torch.zeros_like(s))
        return {"codes": pack_nibbles(e2m1_codes(xb * inv, "even").flatten(-2)), "scale": sf}
