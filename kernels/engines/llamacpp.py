"""llama.cpp's quantized KV-cache types (``--cache-type-k`` / ``--cache-type-v``, ``-ctk`` / ``-ctv``: q8_0, q4_0,
q4_1, q5_0, q5_1, iq4_nl; ``common/arg.cpp``'s list, f32 / f16 / bf16 being unquantized) as codecs, with the
arithmetic around them that llama.cpp runs on a GPU.

Read from ggml-org/ggml at d99724f (the ggml llama.cpp vendors): ``src/ggml-cuda/cpy-utils.cuh`` (the CUDA cache
writers, ``quantize_f32_*_block``), ``src/ggml-quants.c`` (``quantize_row_*_ref``, the same formulas),
``src/ggml-cuda/fattn.cu`` (kernel choice) and ``fattn-common.cuh`` (``quantize_q8_1_to_shared``); and from
ggml-org/llama.cpp (PR #21038, April 2026) ``src/llama-kv-cache.cpp`` (``ggml_gen_hadamard``, ``attn_rot_k`` /
``attn_rot_v``, ``build_input_k_rot`` / ``build_input_v_rot``, ``LLAMA_ATTN_ROT_DISABLE``) and
``src/llama-graph.cpp`` (``build_attn``: Q and K rotated before the cache write, V rotated and the attention
output rotated back).

Blocks of 32 coordinates along the head dim, each with an fp16 scale ``d`` (rounded to nearest even), computed in
float32 from the float32 key (llama.cpp's projections write f32 into the cache):

====================  ========================================================================  ==========
type                  codes                                                                     bytes / 32
====================  ========================================================================  ==========
q8_0                  d = amax / 127, q = roundf(x / d) (ties away from zero), int8             2 + 32
q4_0                  d = vmax / -8 (vmax: the largest-magnitude value, signed, first found),   2 + 16
                      q = min(15, trunc(x / d + 8.5)); x = (q - 8) d
q4_1                  d = (max - min) / 15, m = min (fp16), q = min(15, trunc((x - min) / d     2 + 2 + 16
                      + 0.5)); x = q d + m
q5_0                  as q4_0 with d = vmax / -16, q in 0..31, x = (q - 16) d                   2 + 4 + 16
q5_1                  as q4_1 with d = (max - min) / 31, q in 0..31                             2 + 2 + 4 + 16
iq4_nl                q = the nearest of 16 fixed levels (-127 ... 113; a tie to the upper) of  2 + 16
                      x / d0, d0 = vmax / -127; then d = sum(x^2 v x) / sum(x^2 v^2), the
                      x^2-weighted least-squares scale of those levels (the CUDA writer)
====================  ========================================================================  ==========

``x / d`` is ``x * (1 / d)`` as the kernels compute it (``id = d ? 1/d : 0``). The 4-bit codes pack two per
byte: element j in the low nibble of byte j, element j + 16 in the high one; the fifth bits of q5_* ride in a
little-endian uint32 ``qh``, element j at bit j. State per token-head: ``d`` (and ``m``) float16 [..., T, d / 32],
``qs`` uint8 (4-bit: [..., T, d / 2]; q8_0: int8 bits [..., T, d]) and ``qh`` uint8 [..., T, d / 8] (q5_*);
:func:`ggml_blocks` lays them out as ggml's blocks, byte for byte.

The CUDA writers are compiled with ``-use_fast_math``: ``1.0f / d`` is an approximate reciprocal and
``x * id + 8.5f`` may fuse into one FMA, so a code can differ from this float32 arithmetic where ``x / d`` lies
within a float32 rounding of a rounding boundary (about one code in a million); the formulas are the same as the
reference's (``ggml-quants.c``), which gguf's quantizers reproduce and the tests compare against. llama.cpp's
x86 CPU writer for q8_0 (``ggml-cpu/arch/x86/quants.c``) differs: ``127 / amax`` and ties to even.

What llama.cpp does around the bytes, each an option defaulting to what it does:

- ``rotate``: where the cache type is quantized and the head dim a multiple of 64, keys and queries are
  multiplied by the orthonormal Sylvester Hadamard matrix over blocks of the largest power of two dividing the
  head dim, and values over blocks of 64 (the output rotated back), before the cache write; the matrix is
  ``1 / sqrtf(n)`` doubled out (``ggml_gen_hadamard``). Decoding here rotates back, so the stored codes are
  llama.cpp's and the keys the cache returns are the model's. ``LLAMA_ATTN_ROT_DISABLE=1`` is ``rotate=False``.
- ``quantize_query``: with a quantized K cache the flash-attention vector kernel (on Ada and Hopper chosen for
  steps of at most 2 query tokens, head dims that are multiples of 64 up to 256) dots the keys with the query
  quantized to q8_1: per block of 32 (of the rotated query) ``d = amax / 127``, ``q = roundf(x / d)``. Longer
  steps run the tensor-core kernel on keys dequantized to fp16 and the query unquantized. 'decode' (the GPU's
  choice), 'always' (the CPU backend converts the query for every step), 'never'. ggml's q4_0 / q5_0 / q4_1 /
  q5_1 dot products add the block offset times the float sum of the query's block, not the quantized one; here
  the quantized query is dotted with the dequantized keys throughout (a difference below the query's rounding).
- ``new_tokens``: llama.cpp writes a step's keys and values to the cache, then attends the cache: the tokens in
  flight are attended as stored ('stored'), not in the model's precision ('native').
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal

import torch

from kernels.engines.preset import EnginePreset, on_device, round_half_away
from kernels.packing import BitField
from kernels.registry import register_codec
from kernels.rotation import hadamard_matrix
from kernels.token_layout import BlockScale, Element, Offset, TokenCodes, TokenLayout

QK = 32  # coordinates per block, every type here
IQ4NL_LEVELS = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)  # kvalues_iq4nl
_QH = BitField(QK, 1)


@functools.lru_cache(maxsize=None)
def ggml_hadamard(n: int) -> torch.Tensor:
    """``ggml_gen_hadamard``: the n x n Sylvester matrix times ``1.0 / sqrtf(n)`` (double, stored float32)."""
    c = 1.0 / float(torch.tensor(float(n)).sqrt())  # sqrtf in float32, the division in double
    return hadamard_matrix(n) * torch.tensor(c, dtype=torch.float32)


def rotation_blocks(head_dim: int, side: str) -> int:
    """Coordinates per Hadamard block llama.cpp rotates ``side`` ('k' | 'v') by (0: none): keys the largest power
    of two dividing the head dim, values 64, both only for head dims that are multiples of 64."""
    if head_dim % 64:
        return 0
    return head_dim & -head_dim if side == "k" else 64


def _rotate(x: torch.Tensor, n: int) -> torch.Tensor:
    """x [..., d] times the block-diagonal ggml Hadamard of blocks n (symmetric and orthonormal: its own inverse)."""
    if not n:
        return x
    return (x.unflatten(-1, (-1, n)) @ on_device(ggml_hadamard(n), x.device)).flatten(-2)


def _nibbles(q: torch.Tensor) -> torch.Tensor:
    """uint8 [..., nb, 32] (values < 16) -> [..., nb * 16]: element j low, element j + 16 high, byte j."""
    return (q[..., :16] | (q[..., 16:] << 4)).flatten(-2)


def _unnibble(qs: torch.Tensor) -> torch.Tensor:
    p = qs.unflatten(-1, (-1, 16))
    return torch.cat([p & 15, p >> 4], dim=-1)


def _signed_max(xb: torch.Tensor) -> torch.Tensor:
    """The block's value of largest magnitude, its sign kept, the first of equals (``amax < fabsf(v)``)."""
    return xb.gather(-1, xb.abs().argmax(-1, keepdim=True))


def _inverse(d: torch.Tensor) -> torch.Tensor:
    """``d ? 1.0f / d : 0.0f``."""
    return torch.where(d != 0, 1.0 / d, torch.zeros_like(d))


def quantize_q8(x: torch.Tensor) -> torch.Tensor:
    """Blocks of 32 along the last dim to q8 and back (float32): ``d = amax / 127``, ``roundf(x / d) * d``; the
    query's q8_1 in the flash-attention vector kernel (``quantize_q8_1_to_shared``: ``x / d``, d kept float)."""
    xb = x.float().unflatten(-1, (-1, QK))
    d = xb.abs().amax(-1, keepdim=True) / 127.0
    q = torch.where(d != 0, round_half_away(xb / torch.where(d != 0, d, 1.0)), torch.zeros_like(xb))
    return (q * d).flatten(-2)


class _Ggml(EnginePreset):
    """One ggml block type: subclasses give ``_blocks`` (float32 [..., nb, 32] -> fields) and ``_values`` (fields
    -> float32 [..., nb, 32]), ``block_bytes`` and ``bits_supported``."""
    engine = "llama.cpp"
    block_bytes: int

    @dataclass(frozen=True)
    class Options:
        rotate: bool = True  # PR #21038's Hadamard rotation, where llama.cpp's rule switches it on
        quantize_query: Literal["decode", "always", "never"] = "decode"  # when the query is dotted as q8_1
        new_tokens: Literal["stored", "native"] = "stored"  # tokens in flight attended from the cache

    @classmethod
    def head_dim_unsupported(cls, head_dim):
        if head_dim % QK:
            return f"llama.cpp's quantized cache needs a head dim that is a multiple of its {QK}-value blocks, got {head_dim}"
        return None

    def __init__(self, config, device="cpu"):
        super().__init__(config, device)
        self.bytes_per_vector = self.head_dim // QK * self.block_bytes
        self.rotation = {s: rotation_blocks(self.head_dim, s) if self.opts.rotate else 0 for s in ("k", "v")}

    def _quantize(self, x, side):
        y = _rotate(x.float(), self.rotation[side])
        return self._blocks(y.unflatten(-1, (-1, QK)))

    def _dequantize(self, t, side):
        return _rotate(self._values(t).flatten(-2), self.rotation[side])

    def prepare_query(self, q):
        mode = self.opts.quantize_query
        vector_kernel = q.shape[-2] <= 2 and self.head_dim % 64 == 0 and self.head_dim <= 256
        if mode == "never" or (mode == "decode" and not vector_kernel):
            return q
        n = self.rotation["k"]  # rotated, quantized in the rotated space, rotated back: q' . k = q8(H q) . (H k)
        return _rotate(quantize_q8(_rotate(q.float(), n)), n).to(q.dtype)

    #: the fused kernel's reading of the codes (TokenCodes' keywords; ``halves``: ggml's nibble order)
    fused_codes: dict

    def _build_token_layout(self):
        d = self.head_dim

        def side(s):
            n = self.rotation[s]  # the codes are of the rotated vector: x = y @ H (H its own inverse)
            rot = torch.block_diag(*[ggml_hadamard(n)] * (d // n)) if n else None
            return TokenCodes(scale_field="d", group=QK, block_scale=BlockScale.FIELD, rotation=rot,
                              **self.fused_codes)
        return TokenLayout(side("k"), side("v"))

    def _blocks(self, xb: torch.Tensor) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def _values(self, t: dict[str, torch.Tensor]) -> torch.Tensor:
        raise NotImplementedError


@register_codec("llamacpp-q8_0")
class LlamaCppQ8_0(_Ggml):
    """llama.cpp ``-ctk q8_0 -ctv q8_0``."""
    bits_supported, block_bytes = (8,), 2 + QK
    fused_codes = {"element": Element.INT8, "codes_field": "qs"}

    def _blocks(self, xb):
        d = xb.abs().amax(-1, keepdim=True) / 127.0
        q = round_half_away(xb * _inverse(d)).to(torch.int8)
        return {"d": d.squeeze(-1).to(torch.float16), "qs": q.flatten(-2).view(torch.uint8)}

    def _values(self, t):
        return t["qs"].view(torch.int8).float().unflatten(-1, (-1, QK)) * t["d"].float().unsqueeze(-1)


class _Symmetric4(_Ggml):
    """q4_0 and q5_0: ``d = vmax / -half``, ``q = min(top, trunc(x / d + half + 0.5))``, ``x = (q - half) d``."""
    half: int

    def _blocks(self, xb):
        d = _signed_max(xb) / -float(self.half)
        q = torch.trunc(xb * _inverse(d) + (self.half + 0.5)).clamp_max(2 * self.half - 1).to(torch.uint8)
        return {"d": d.squeeze(-1).to(torch.float16), **self._codes(q)}

    def _values(self, t):
        return (self._read(t).float() - self.half) * t["d"].float().unsqueeze(-1)


class _Affine(_Ggml):
    """q4_1 and q5_1: ``d = (max - min) / top``, ``m = min``, ``q = trunc((x - min) / d + 0.5)``, ``x = q d + m``."""
    top: int

    def _blocks(self, xb):
        lo, hi = xb.amin(-1, keepdim=True), xb.amax(-1, keepdim=True)
        d = (hi - lo) / float(self.top)
        q = torch.trunc((xb - lo) * _inverse(d) + 0.5)
        # q4_1 clamps at 15; q5_1 keeps the low 5 bits (its largest value, 31 + rounding, never reaches 32)
        q = q.clamp_max(15) if self.top == 15 else q.to(torch.int32) & 31
        return {"d": d.squeeze(-1).to(torch.float16), "m": lo.squeeze(-1).to(torch.float16),
                **self._codes(q.to(torch.uint8))}

    def _values(self, t):
        return self._read(t).float() * t["d"].float().unsqueeze(-1) + t["m"].float().unsqueeze(-1)


class _Four:
    """4-bit codes: two a byte, ggml's order."""

    @staticmethod
    def _codes(q):
        return {"qs": _nibbles(q)}

    @staticmethod
    def _read(t):
        return _unnibble(t["qs"])


class _Five:
    """5-bit codes: the low 4 as 4-bit ones, the fifth bits in ``qh`` (element j at bit j of a little-endian uint32)."""

    @staticmethod
    def _codes(q):
        return {"qh": _QH.pack((q >> 4) & 1).flatten(-2), "qs": _nibbles(q & 15)}

    @staticmethod
    def _read(t):
        high = _QH.unpack(t["qh"].unflatten(-1, (-1, 4))).to(torch.uint8)
        return _unnibble(t["qs"]) | (high << 4)


@register_codec("llamacpp-q4_0")
class LlamaCppQ4_0(_Four, _Symmetric4):
    """llama.cpp ``-ctk q4_0 -ctv q4_0``."""
    bits_supported, block_bytes, half = (4,), 2 + QK // 2, 8
    fused_codes = {"element": Element.UINT, "bits": 4, "codes_field": "qs", "zero_point": 8.0, "halves": True}


@register_codec("llamacpp-q5_0")
class LlamaCppQ5_0(_Five, _Symmetric4):
    """llama.cpp ``-ctk q5_0 -ctv q5_0``."""
    bits_supported, block_bytes, half = (5,), 2 + 4 + QK // 2, 16
    fused_codes = {"element": Element.UINT, "bits": 4, "codes_field": "qs", "zero_point": 16.0, "halves": True,
                   "high_field": "qh"}


@register_codec("llamacpp-q4_1")
class LlamaCppQ4_1(_Four, _Affine):
    """llama.cpp ``-ctk q4_1 -ctv q4_1``."""
    bits_supported, block_bytes, top = (4,), 2 + 2 + QK // 2, 15
    fused_codes = {"element": Element.UINT, "bits": 4, "codes_field": "qs", "offset": Offset.ZERO, "zero_field": "m",
                   "halves": True}


@register_codec("llamacpp-q5_1")
class LlamaCppQ5_1(_Five, _Affine):
    """llama.cpp ``-ctk q5_1 -ctv q5_1``."""
    bits_supported, block_bytes, top = (5,), 2 + 2 + 4 + QK // 2, 31
    fused_codes = {"element": Element.UINT, "bits": 4, "codes_field": "qs", "offset": Offset.ZERO, "zero_field": "m",
                   "halves": True, "high_field": "qh"}


@register_codec("llamacpp-iq4_nl")
class LlamaCppIq4Nl(_Four, _Ggml):
    """llama.cpp ``-ctk iq4_nl -ctv iq4_nl``: 16 non-uniform levels, a least-squares block scale (the CUDA writer,
    ``quantize_f32_iq4_nl_block``; the CPU reference searches more scales)."""
    bits_supported, block_bytes = (4,), 2 + QK // 2
    fused_codes = {"element": Element.CODEBOOK, "bits": 4, "codes_field": "qs", "halves": True,
                   "codebook": torch.tensor(IQ4NL_LEVELS, dtype=torch.float32)}

    def _blocks(self, xb):
        levels = on_device(tuple(IQ4NL_LEVELS), xb.device)
        d0 = _signed_max(xb) / levels[0]
        y = xb * _inverse(d0)
        # best_index_int8: the bracketing pair by binary search, the lower one only when strictly nearer
        upper = (levels <= y.unsqueeze(-1)).sum(-1).clamp(1, 15)
        lo, hi = levels[upper - 1], levels[upper]
        q = torch.where(y - lo < hi - y, upper - 1, upper)
        q = torch.where(y <= levels[0], 0, torch.where(y >= levels[-1], 15, q))
        v, w = levels[q], xb * xb
        # the CUDA writer's float32 sums, pair (j, j + 16) by pair, in its order
        sumqx = torch.zeros_like(d0.squeeze(-1))
        sumq2 = torch.zeros_like(sumqx)
        for j in range(QK // 2):
            a, b = j, j + QK // 2
            sumqx = sumqx + (w[..., a] * v[..., a] * xb[..., a] + w[..., b] * v[..., b] * xb[..., b])
            sumq2 = sumq2 + (w[..., a] * v[..., a] * v[..., a] + w[..., b] * v[..., b] * v[..., b])
        d = torch.where(sumq2 > 0, sumqx / torch.where(sumq2 > 0, sumq2, 1.0), d0.squeeze(-1))
        return {"d": d.to(torch.float16), **self._codes(q.to(torch.uint8))}

    def _values(self, t):
        levels = on_device(tuple(IQ4NL_LEVELS), t["qs"].device)
        return levels[self._read(t).long()] * t["d"].float().unsqueeze(-1)


#: each type's fields in ggml's block order (``block_q4_1``: d, m, qs; ``block_q5_0``: d, qh, qs; ...)
_BLOCK_ORDER = {"llamacpp-q8_0": ("d", "qs"), "llamacpp-q4_0": ("d", "qs"), "llamacpp-q4_1": ("d", "m", "qs"),
                "llamacpp-q5_0": ("d", "qh", "qs"), "llamacpp-q5_1": ("d", "m", "qh", "qs"),
                "llamacpp-iq4_nl": ("d", "qs")}


def ggml_blocks(name: str, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    """A state's fields as ggml's bytes: uint8 [..., T, d / 32 * block bytes], block after block, each field
    little-endian in its struct's order (what ``gguf.quants.quantize`` and the llama.cpp cache hold)."""
    parts = []
    for f in _BLOCK_ORDER[name]:
        t = tensors[f].contiguous()
        b = t.unsqueeze(-1).view(torch.uint8) if t.dtype == torch.float16 else t  # [..., nb, 2] little-endian
        parts.append(b.reshape(*t.shape[:-1], tensors["d"].shape[-1], -1))
    return torch.cat(parts, dim=-1).flatten(-2)

