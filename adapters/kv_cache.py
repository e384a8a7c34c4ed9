"""The compressed-cache interface every model adapter plugs into.

One :class:`CompressedKVCache` per rollout holds, per layer, a :class:`LayerKV`: the codec
states of committed tokens plus a native-precision residual window of the most recent
tokens. Tokens are encoded once, as they leave the window, and never re-encoded. Chosen
layers (by default none; ``protect='boundary-1'`` keeps the first and last) stay native.

Shapes: keys and values are ``[B, Hkv, T, d]``; queries ``[B, Hq, Tq, d]`` with Hq a
multiple of Hkv (GQA: query head h reads KV head h // (Hq // Hkv), as transformers'
``repeat_kv`` does).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import torch

from kernels import Codec, Encoded, make_codec

#: Default residual window, in tokens (text). KIVI and the OCTOPUS paper keep a small
#: full-precision window of recent tokens; 32 is small next to the contexts we score.
DEFAULT_RESIDUAL = 32


@dataclass
class CacheConfig:
    """How a rollout's KV cache is compressed; round-trips to JSON."""

    codec: str = "none"
    bits: int = 16
    residual: int = DEFAULT_RESIDUAL  # native window size
    residual_unit: str = "token"  # "token": the last `residual` tokens; "append": the last `residual` appends (a frame, a scale)
    protect: str | list[int] = "none"  # "none", "boundary-1" (first and last layer native), or layer indices
    value_bits: int | None = None  # default: the key bit width
    value_group: int = 32
    seed: int = 0
    attend: str = "score"  # "score": codec score path; "reconstruct": decode keys then attend
    backend: str = "auto"  # "auto" (fused kernel on CUDA), "triton", "torch"
    options: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return asdict(self)

    @property
    def label(self) -> str:
        return "none" if self.codec == "none" else f"{self.codec}@{self.bits}"

    def protected_layers(self, num_layers: int) -> set[int]:
        if self.protect in ("none", None, []):
            return set()
        if self.protect == "boundary-1":
            return {0, num_layers - 1}
        if isinstance(self.protect, str):
            raise ValueError(f"protect must be 'none', 'boundary-1' or a list of layer indices, got {self.protect!r}")
        return {int(i) % num_layers for i in self.protect}


class LayerKV:
    """One layer's cache: compressed committed tokens + a native window.

    ``codec`` None means this layer is native (codec 'none' or a protected layer).
    """

    def __init__(self, codec: Codec | None, config: CacheConfig):
        self.codec = codec
        self.config = config
        self.key_states: list[Encoded] = []  # committed, encoded once, in token order
        self.value_states: list[Encoded] = []
        self.window_k: torch.Tensor | None = None  # [B, Hkv, W, d] native
        self.window_v: torch.Tensor | None = None
        self._append_sizes: list[int] = []  # sizes of the appends still in the window
        self.committed = 0
        self._uncompressed_bytes = 0  # what the native cache would hold

    # --- writing --------------------------------------------------------------------------
    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Add new tokens k, v [B, Hkv, t, d] (native), then commit what leaves the window."""
        self._uncompressed_bytes += k.numel() * k.element_size() + v.numel() * v.element_size()
        if self.window_k is None:
            self.window_k, self.window_v = k, v
        else:
            self.window_k = torch.cat([self.window_k, k], dim=-2)
            self.window_v = torch.cat([self.window_v, v], dim=-2)
        self._append_sizes.append(k.shape[-2])
        self._flush()

    def _flush(self) -> None:
        if self.codec is None or self.window_k is None:
            return
        W = self.window_k.shape[-2]
        if self.config.residual_unit == "append":
            keep_appends = self._append_sizes[-self.config.residual:] if self.config.residual > 0 else []
            keep = sum(keep_appends)
        else:
            keep = self.config.residual
        block = self.codec.token_block
        n = max(W - keep, 0) // block * block
        if n == 0:
            return
        k_old, v_old = self.window_k[..., :n, :], self.window_v[..., :n, :]
        self.key_states.append(self.codec.encode(k_old))
        self.value_states.append(self.codec.encode_values(v_old))
        self.window_k = self.window_k[..., n:, :].clone()  # clone: drop the native storage of committed tokens
        self.window_v = self.window_v[..., n:, :].clone()
        self.committed += n
        # keep the append bookkeeping consistent with what is left
        left, sizes = self.window_k.shape[-2], []
        for s in reversed(self._append_sizes):
            if left <= 0:
                break
            sizes.append(min(s, left))
            left -= s
        self._append_sizes = sizes[::-1]

    # --- reading --------------------------------------------------------------------------
    @property
    def length(self) -> int:
        w = 0 if self.window_k is None else self.window_k.shape[-2]
        return self.committed + w

    def compressed_keys(self) -> Encoded | None:
        if not self.key_states:
            return None
        if len(self.key_states) > 1:  # merge once so later reads are one state
            self.key_states = [Encoded.cat(self.key_states)]
            self.value_states = [Encoded.cat(self.value_states)]
        return self.key_states[0]

    def compressed_values(self) -> Encoded | None:
        self.compressed_keys()
        return self.value_states[0] if self.value_states else None

    def reconstruct(self) -> tuple[torch.Tensor, torch.Tensor]:
        """All keys and values [B, Hkv, T, d], committed ones decoded (reconstruct-then-attend)."""
        ks, vs = [], []
        kc = self.compressed_keys()
        if kc is not None:
            ks.append(self.codec.decode(kc))
            vs.append(self.codec.decode_values(self.compressed_values()))
        if self.window_k is not None:
            ks.append(self.window_k)
            vs.append(self.window_v)
        dtype = ks[-1].dtype
        return torch.cat([k.to(dtype) for k in ks], -2), torch.cat([v.to(dtype) for v in vs], -2)

    def attend(self, q: torch.Tensor, scale: float | None = None, mask: torch.Tensor | None = None,
               k_new: torch.Tensor | None = None, v_new: torch.Tensor | None = None) -> torch.Tensor:
        """softmax(q K^T * scale + mask) V over [committed, window, (k_new)] in token order.

        q: [B, Hq, Tq, d]; mask: additive or boolean, broadcastable to [B, Hq, Tq, T_total]
        (True = keep); k_new/v_new [B, Hkv, t, d]: extra native tokens attended but not stored
        (a video block in flight). Returns [B, Hq, Tq, d] in q's dtype.
        """
        B, Hq, Tq, d = q.shape
        scale = 1.0 / math.sqrt(d) if scale is None else scale
        parts_s, parts_v = [], []
        kc = self.compressed_keys()
        Hkv = (kc.shape[-3] if kc is not None else (self.window_k if self.window_k is not None else k_new).shape[1])
        G = Hq // Hkv
        qg = q.reshape(B, Hkv, G * Tq, d)  # query heads grouped by the KV head they read
        if kc is not None:
            if self.config.attend == "reconstruct":
                kd = self.codec.decode(kc).float()
                s = qg.float() @ kd.transpose(-1, -2)
            else:
                s = self.codec.score(qg, kc)
            parts_s.append(s)
            parts_v.append(self.codec.decode_values(self.compressed_values()).float())
        for k, v in ((self.window_k, self.window_v), (k_new, v_new)):
            if k is not None and k.shape[-2] > 0:
                parts_s.append(qg.float() @ k.float().transpose(-1, -2))
                parts_v.append(v.float())
        s = torch.cat(parts_s, -1).reshape(B, Hq, Tq, -1) * scale
        if mask is not None:
            if mask.dtype == torch.bool:
                s = s.masked_fill(~mask, float("-inf"))
            else:
                s = s + mask.float()
        p = torch.softmax(s, dim=-1).reshape(B, Hkv, G * Tq, -1)
        out = p @ torch.cat(parts_v, -2)
        return out.reshape(B, Hq, Tq, d).to(q.dtype)

    # --- accounting -----------------------------------------------------------------------
    def nbytes(self) -> dict[str, int]:
        comp = sum(s.nbytes() for s in self.key_states) + sum(s.nbytes() for s in self.value_states)
        win = 0 if self.window_k is None else (self.window_k.numel() * self.window_k.element_size()
                                              + self.window_v.numel() * self.window_v.element_size())
        native = win if self.codec is None else 0
        return {"compressed": comp, "window": 0 if self.codec is None else win, "native_layers": native,
                "uncompressed": self._uncompressed_bytes}


class CompressedKVCache:
    """The per-rollout cache: one :class:`LayerKV` per layer, each with its own codec instance
    (rotation signs drawn from (seed, layer, head))."""

    def __init__(self, config: CacheConfig, num_layers: int, num_kv_heads: int, head_dim: int, device="cpu"):
        self.config = config
        self.num_layers = num_layers
        protected = config.protected_layers(num_layers)
        self.layers: list[LayerKV] = []
        for i in range(num_layers):
            codec = None
            if config.codec != "none" and i not in protected:
                codec = make_codec(config.codec, config.bits, head_dim, seed=config.seed, layer=i,
                                   num_heads=num_kv_heads, device=device, value_bits=config.value_bits,
                                   value_group=config.value_group, **config.options)
            self.layers.append(LayerKV(codec, config))

    def __getitem__(self, i: int) -> LayerKV:
        return self.layers[i]

    def __len__(self) -> int:
        return self.num_layers

    def nbytes(self) -> dict[str, int]:
        tot: dict[str, int] = {}
        for layer in self.layers:
            for k, v in layer.nbytes().items():
                tot[k] = tot.get(k, 0) + v
        tot["total"] = tot["compressed"] + tot["window"] + tot["native_layers"]
        return tot

    def assert_compressed(self) -> None:
        """Fail loudly if a compressing codec did not actually shrink what the cache holds."""
        if self.config.codec == "none":
            return
        b = self.nbytes()
        if not any(layer.committed for layer in self.layers if layer.codec is not None):
            raise RuntimeError(
                f"cache for {self.config.label} committed no token to the codec (window {self.config.residual} "
                f"{self.config.residual_unit}s covers the whole sequence): lower --residual or use a longer context"
            )
        if b["total"] >= b["uncompressed"]:
            raise RuntimeError(f"cache for {self.config.label} holds {b['total']} bytes, not fewer than the "
                               f"{b['uncompressed']} bytes of the native cache: compression did not happen")
