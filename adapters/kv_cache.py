"""The compressed-cache interface every model adapter plugs into.

One :class:`CompressedKVCache` per rollout holds, per layer, a :class:`LayerKV`: the codec
states of committed tokens plus a native-precision residual window of the most recent
tokens. Tokens are encoded once, as they leave the window, and never re-encoded. Chosen
layers (by default none; ``protect='boundary-1'`` keeps the first and last) stay native.

Shapes: keys and values are ``[B, Hkv, T, d]``; queries ``[B, Hq, Tq, d]`` with Hq a
multiple of Hkv (GQA: query head h reads KV head h // (Hq // Hkv), as transformers'
``repeat_kv`` does).

Reading a layer (:meth:`LayerKV.attend`) sees, in token order: the committed tokens through
the codec (its ``score`` estimator, or decode-then-dot with ``attend='reconstruct'``), the
native window, and optionally extra native tokens in flight (``k_new``/``v_new``: a prefill
chunk, a video block) that are attended but not stored; the adapter appends them afterwards.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields

import torch

from kernels import Codec, CodecConfig, Encoded, codec_class, make_codec
from kernels.attention import attend, decode_attention
from kernels.backend import BACKENDS, fused_wanted
from kernels.config import check_options

#: Default residual window, in tokens (text). KIVI and the OCTOPUS paper keep a small
#: full-precision window of recent tokens; 32 is small next to the contexts we score.
DEFAULT_RESIDUAL = 32
CACHE_CONFIG_VERSION = 2
ATTENDS = ("score", "reconstruct")
RESIDUAL_UNITS = ("token", "append")
PROTECTS = ("none", "boundary-1")


@dataclass
class CacheConfig:
    """How a rollout's KV cache is compressed; round-trips to JSON."""

    codec: str = "none"
    bits: int = 16
    residual: int = DEFAULT_RESIDUAL  # native window size
    residual_unit: str = "token"  # "token": the last `residual` tokens; "append": the last `residual` appends (a frame, a scale)
    protect: str | list[int] = "none"  # PROTECTS: "none", "boundary-1" (first and last layer native), or layer indices
    value_bits: int | None = None  # default: the key bit width
    value_group: int = 32
    seed: int = 0
    attend: str = "score"  # ATTENDS: "score": codec score path; "reconstruct": decode keys then attend
    backend: str = "auto"  # BACKENDS: "auto" (fused kernels on CUDA), "lut", "triton", "torch"
    options: dict = field(default_factory=dict)  # the codec's options (its Options fields), checked
    #: keep the decoded committed keys/values of non-estimator codecs between reads (speed only:
    #: decoding is deterministic, so results are identical; not counted as cache bytes)
    memo_decoded: bool = True

    def __post_init__(self):
        for name, allowed in (("attend", ATTENDS), ("residual_unit", RESIDUAL_UNITS), ("backend", BACKENDS)):
            value = getattr(self, name)
            if value not in allowed:
                raise ValueError(f"Unknown {name} '{value}'. Available: {', '.join(allowed)}")
        if isinstance(self.protect, str) or self.protect is None:
            if self.protect not in (*PROTECTS, None):
                raise ValueError(f"Unknown protect '{self.protect}'. Available: {', '.join(PROTECTS)} "
                                 f"or a list of layer indices")
        elif not all(isinstance(i, int) and not isinstance(i, bool) for i in self.protect):
            raise ValueError(f"protect must be {', '.join(PROTECTS)} or a list of layer indices, got {self.protect!r}")
        # the options belong to the codec: checked against its Options (unknown codec -> its list)
        self.options = check_options(self.codec, codec_class(self.codec).Options, dict(self.options))

    def codec_config(self, head_dim: int, num_heads: int, layer: int = 0) -> CodecConfig:
        """The config of layer ``layer``'s codec for KV heads ``[B, num_heads, T, head_dim]``, every
        option resolved (what a report row embeds)."""
        return CodecConfig(self.codec, self.bits, head_dim, seed=self.seed, layer=layer, num_heads=num_heads,
                           value_bits=self.value_bits, value_group=self.value_group, backend=self.backend,
                           options=self.options).resolved()

    def to_json(self) -> dict:
        return {"version": CACHE_CONFIG_VERSION, **asdict(self)}

    @classmethod
    def from_json(cls, d: dict) -> "CacheConfig":
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known - {"version"}
        if unknown:
            raise ValueError(f"unknown CacheConfig field(s) {sorted(unknown)}; known: {sorted(known)}")
        return cls(**{k: v for k, v in d.items() if k in known})

    @property
    def label(self) -> str:
        return "none" if self.codec == "none" else f"{self.codec}@{self.bits}"

    def protected_layers(self, num_layers: int) -> set[int]:
        if self.protect in ("none", None, []):
            return set()
        if self.protect == "boundary-1":
            return {0, num_layers - 1}
        return {int(i) % num_layers for i in self.protect}


def _tail(state: Encoded, start: int) -> Encoded:
    """The tokens [start:] of a state (``start`` a multiple of the codec's token block): every field
    is [..., T, k] or, for token groups, [..., T // G, k], so rows are cut in proportion."""
    T = state.num_tokens
    if start == 0:
        return state
    tensors = {}
    for name, t in state.tensors.items():
        rows = t.shape[-2]
        if (start * rows) % T:
            raise ValueError(f"field '{name}' ({rows} rows for {T} tokens) cannot be cut at token {start}")
        tensors[name] = t[..., start * rows // T:, :]
    return Encoded(tensors, (*state.shape[:-2], T - start, state.shape[-1]), state.dtype)


def _keeps_everything(mask: torch.Tensor) -> bool:
    """True when an attention mask masks nothing (boolean all True, or additive all zero), as the
    masks transformers passes for a decode step without padding are. The answer is kept on the
    mask tensor itself (for its current version), so a model's layers, which share one mask per
    forward pass, pay for one device sync per step, not one per layer."""
    memo = getattr(mask, "_kvcodec_keeps_all", None)
    if memo is not None and memo[0] == mask._version:
        return memo[1]
    keeps = bool(mask.all()) if mask.dtype == torch.bool else bool((mask == 0).all())
    mask._kvcodec_keeps_all = (mask._version, keeps)
    return keeps


def _tensor_bytes(*ts) -> int:
    return sum(t.numel() * t.element_size() for t in ts if t is not None)


class LayerKV:
    """One layer's cache: compressed committed tokens + a native window.

    ``codec`` None means this layer is native (codec 'none' or a protected layer): it never
    commits, the window holds every token.
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
        # decoded committed tokens (memo_decoded): [B, Hkv, n, d] for the first n committed tokens
        self._dec_k: torch.Tensor | None = None
        self._dec_v: torch.Tensor | None = None

    def fork(self) -> "LayerKV":
        """An independent copy that shares the codec and the (immutable) encoded states."""
        other = LayerKV.__new__(LayerKV)
        other.__dict__.update(self.__dict__)
        other.key_states, other.value_states = list(self.key_states), list(self.value_states)
        other._append_sizes = list(self._append_sizes)
        return other

    # --- writing --------------------------------------------------------------------------
    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Add new tokens k, v [B, Hkv, t, d] (native), then commit what leaves the window."""
        self._uncompressed_bytes += _tensor_bytes(k, v)
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
        ks, vs = self.codec.encode(k_old), self.codec.encode_values(v_old)
        self.key_states.append(ks)
        self.value_states.append(vs)
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

    def _uses_memo(self) -> bool:
        return (self.config.memo_decoded and self.codec is not None
                and (self.config.attend == "reconstruct" or not self.codec.has_score_estimator))

    def decoded(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Committed keys and values decoded, [B, Hkv, committed, d] each (input dtype), or None.

        With ``memo_decoded`` each encoded state is decoded once and kept; otherwise every call decodes.
        """
        if self.codec is None or self.committed == 0:
            return None
        if not self.config.memo_decoded:
            return self.codec.decode(self.compressed_keys()), self.codec.decode_values(self.compressed_values())
        done = 0 if self._dec_k is None else self._dec_k.shape[-2]
        if done < self.committed:  # decode only the tokens committed since the last read
            k = self.codec.decode(_tail(self.compressed_keys(), done))
            v = self.codec.decode_values(_tail(self.compressed_values(), done))
            if self._dec_k is not None:
                k, v = torch.cat([self._dec_k, k], -2), torch.cat([self._dec_v, v], -2)
            self._dec_k, self._dec_v = k, v
        return self._dec_k, self._dec_v

    def reconstruct(self) -> tuple[torch.Tensor, torch.Tensor]:
        """All keys and values [B, Hkv, T, d], committed ones decoded (reconstruct-then-attend)."""
        ks, vs = [], []
        dec = self.decoded()
        if dec is not None:
            ks.append(dec[0])
            vs.append(dec[1])
        if self.window_k is not None:
            ks.append(self.window_k)
            vs.append(self.window_v)
        dtype = ks[-1].dtype
        return torch.cat([k.to(dtype) for k in ks], -2), torch.cat([v.to(dtype) for v in vs], -2)

    def attend(self, q: torch.Tensor, scale: float | None = None, mask: torch.Tensor | None = None,
               k_new: torch.Tensor | None = None, v_new: torch.Tensor | None = None,
               causal: bool = False, softcap: float | None = None) -> torch.Tensor:
        """softmax(q K^T * scale + mask) V over [committed, window, (k_new)] in token order.

        q: [B, Hq, Tq, d]; mask: additive or boolean, broadcastable to [B, Hq, Tq, T_total]
        (True = keep); k_new/v_new [B, Hkv, t, d]: extra native tokens attended but not stored
        (a prefill chunk, a video block in flight). ``causal``: the Tq queries are the last Tq
        positions of the T_total keys and see only keys up to their own position (applied on
        top of ``mask``). ``softcap``: attention logit soft-capping (Gemma 2; see
        :func:`kernels.attention.attend`). Returns [B, Hq, Tq, d] in q's dtype.

        A single-token step that masks nothing goes to :func:`kernels.attention.decode_attention`
        (the fused kernel where the backend asks for it and it covers the codec); everything else to
        the PyTorch core :func:`kernels.attention.attend`, with the committed tokens decoded once
        (``memo_decoded``, ``attend='reconstruct'``) or scored by the codec's estimator.
        """
        scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
        if self._decode_step(q, mask):
            wk, wv = self.window_k, self.window_v
            if k_new is not None:
                wk = k_new if wk is None else torch.cat([wk, k_new], -2)
                wv = v_new if wv is None else torch.cat([wv, v_new], -2)
            return decode_attention(q, self.compressed_keys(), self.compressed_values(), self.codec, wk, wv,
                                    scale=scale, backend=self.config.backend, softcap=softcap)
        prefix = {}
        if self.compressed_keys() is not None:
            if self._uses_memo() or self.config.attend == "reconstruct":
                prefix["decoded"] = self.decoded()
            else:
                prefix = {"codec": self.codec, "key_state": self.compressed_keys(),
                          "value_state": self.compressed_values()}
        return attend(q, **prefix, window_k=self.window_k, window_v=self.window_v, k_new=k_new, v_new=v_new,
                      mask=mask, causal=causal, scale=scale, softcap=softcap)

    def _decode_step(self, q, mask) -> bool:
        """Whether this read is a single-token step over committed tokens that the fused kernel could
        take: the backend wants the fused kernels here (:func:`kernels.backend.fused_wanted`; asked
        first, as the mask check may sync the device) and the mask masks nothing."""
        return (fused_wanted(self.config.backend, q.device) and q.shape[2] == 1 and self.codec is not None
                and (mask is None or _keeps_everything(mask)) and self.committed > 0)

    # --- accounting -----------------------------------------------------------------------
    def nbytes(self) -> dict[str, int]:
        kb = sum(s.nbytes() for s in self.key_states)
        vb = sum(s.nbytes() for s in self.value_states)
        win = _tensor_bytes(self.window_k, self.window_v)
        native = win if self.codec is None else 0
        return {"compressed": kb + vb, "compressed_keys": kb, "compressed_values": vb,
                "window": 0 if self.codec is None else win, "native_layers": native,
                "uncompressed": self._uncompressed_bytes}


class CompressedKVCache:
    """The per-rollout cache: one :class:`LayerKV` per layer, each with its own codec instance
    (rotation signs drawn from (seed, layer, head))."""

    def __init__(self, config: CacheConfig, num_layers: int, num_kv_heads: int, head_dim: int, device="cpu"):
        self.config = config
        self.num_layers = num_layers
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        protected = config.protected_layers(num_layers)
        self.layers: list[LayerKV] = []
        for i in range(num_layers):
            codec = None
            if config.codec != "none" and i not in protected:
                codec = make_codec(config.codec_config(head_dim, num_kv_heads, layer=i), device=device)
            self.layers.append(LayerKV(codec, config))

    def __getitem__(self, i: int) -> LayerKV:
        return self.layers[i]

    def __len__(self) -> int:
        return self.num_layers

    def fork(self) -> "CompressedKVCache":
        """An independent copy (e.g. to branch a rollout after a shared prefill); codecs are shared."""
        other = CompressedKVCache.__new__(CompressedKVCache)
        other.__dict__.update(self.__dict__)
        other.layers = [layer.fork() for layer in self.layers]
        return other

    def nbytes(self) -> dict[str, int]:
        tot: dict[str, int] = {}
        for layer in self.layers:
            for k, v in layer.nbytes().items():
                tot[k] = tot.get(k, 0) + v
        tot["total"] = tot["compressed"] + tot["window"] + tot["native_layers"]
        return tot

    def stats(self) -> dict[str, float | int]:
        """Rate figures for a report row, all from stored bytes.

        ``cache_bytes``: everything the cache holds (codec states + native windows + native
        layers); ``uncompressed_bytes``: what a native cache of the same tokens holds;
        ``bits_per_coord``: true bits per key coordinate of the committed (codec) tokens;
        ``value_bits_per_coord`` likewise for values; ``cache_bits_per_coord``: 8 * cache_bytes
        over every cached key and value coordinate (window and protected layers included).
        Codec 'none' reports the native dtype's bits.
        """
        b = self.nbytes()
        committed = sum(layer.committed for layer in self.layers if layer.codec is not None)
        tokens = sum(layer.length for layer in self.layers)
        coords = committed * self.num_kv_heads * self.head_dim * self.batch_size()
        all_coords = 2 * tokens * self.num_kv_heads * self.head_dim * self.batch_size()
        native_bits = 8.0 * b["uncompressed"] / max(all_coords, 1)
        return {
            "cache_bytes": b["total"],
            "uncompressed_bytes": b["uncompressed"],
            "compressed_bytes": b["compressed"],
            "committed_tokens": committed // max(1, sum(1 for l in self.layers if l.codec is not None)),
            "bits_per_coord": 8.0 * b["compressed_keys"] / coords if coords else native_bits,
            "value_bits_per_coord": 8.0 * b["compressed_values"] / coords if coords else native_bits,
            "cache_bits_per_coord": 8.0 * b["total"] / max(all_coords, 1),
        }

    def batch_size(self) -> int:
        """B of the cached [B, Hkv, T, d] (1 while empty)."""
        for layer in self.layers:
            if layer.window_k is not None:
                return layer.window_k.shape[0]
            if layer.key_states:
                return layer.key_states[0].shape[0]
        return 1

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
