"""A layer's cache laid out for graphed decode steps: :class:`StaticKV`, and the device counters
every layer of a step shares, :class:`StaticCounters`.

A CUDA graph replays fixed kernels on fixed addresses, so one captured decode step can stand for
every later step only if nothing it reads or writes moves and nothing it decides is read on the
host. The eager layer (:class:`adapters.cache.layer_kv.LayerKV`) grows its tensors and keeps its lengths
in Python lists. A :class:`StaticKV` holds buffers of its own for up to ``capacity`` tokens of an
equal-length batch, made once and kept across rollouts (a graph captured over them serves every
rollout of its configuration and batch shape that fits: :mod:`adapters.hf.graphed_decode`): a rollout
copies its layer in (:meth:`StaticKV.load`), takes its single-token steps there, and takes the steps'
tokens back (:meth:`StaticKV.unload`), leaving its layer as the same steps run eagerly would have:

- a codec layer's committed states sit in a store of its own (:class:`adapters.cache.encoded_store.EncodedStore`
  of ``capacity`` tokens), read as one fixed view of that many tokens by per-sequence lengths held on
  the device. Its native window is a ring of R + 1
  slots: a step writes its token into the free slot, attends through the same decode kernel the
  eager step takes (``path``), and commits the oldest token (encoded by the codec exactly as the
  eager commit encodes it) at the device position, which frees its slot for the next step: the
  eager cache's steady state, where each step commits one token and the window stays R tokens. A
  codec no fused kernel reads keeps its decoded keys and values in [B, Hkv, T0 + steps, d] buffers
  instead, each step decoding the token it commits, and attends them with the PyTorch core: as the
  eager memo does for a codec read decoded (``memo_decoded``); for one read by its score estimator
  (QJL, TurboQuant-prod, OCTOPUS-QJL without a kernel) the keys are kept decoded in float32, whose
  dot products are the estimator's scores to float rounding (``<q, decode(k)>``: a test checks it),
  rather than unpacking every key's sketch again at each step;
- a native layer's keys and values sit in [B, Hkv, capacity, d] buffers, written at the step's
  column and read through SDPA with a mask built on the device from it.

Outputs equal the eager step's to float rounding, not bit for bit: the kernels read a longer view
(masked by lengths) and the window in ring order, which orders their reductions differently, and
SDPA reads a masked buffer rather than the exact history.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.attention import attend, decode_attention

from kernels.checks import DeferredFinite

from adapters.cache.encoded_store import EncodedStore, tail
from adapters.cache.layer_kv import LayerKV, trim_appends


class StaticCounters:
    """Where a step is, on the device (advanced in place by the step itself, so a replay moves on).

    ``lengths`` int32 [B]: committed tokens per sequence before the step's commit (the kernels'
    lengths); ``commit_at`` int64 [1]: the token index the step commits to; ``column`` int64 [1]: the
    step's token's column in a native layer; ``positions`` int64 [B, 1]: the model's position ids;
    ``slot`` int64 [1]: the window slot holding the oldest token (in rings of ``window`` + 1 slots, the
    codec layers' window of ``window`` tokens; the step's token goes into the slot before it)."""

    def __init__(self, batch: int, window: int, device):
        self.lengths = torch.zeros(batch, dtype=torch.int32, device=device)
        self.commit_at = torch.zeros(1, dtype=torch.int64, device=device)
        self.column = torch.zeros(1, dtype=torch.int64, device=device)
        self.positions = torch.zeros(batch, 1, dtype=torch.int64, device=device)
        self.window = window
        self.ring = window + 1
        self.slot = torch.zeros(1, dtype=torch.int64, device=device)
        self.new_slot = torch.full((1,), window, dtype=torch.int64, device=device)

    def load(self, committed: int, columns: int) -> None:
        """A rollout's start: ``committed`` tokens per sequence in the codec layers' stores, ``columns`` fed."""
        self.lengths.fill_(committed)
        self.commit_at.fill_(committed)
        self.column.fill_(columns)
        self.positions.fill_(columns)
        self.slot.zero_()
        self.new_slot.fill_(self.window)

    def advance(self) -> None:
        for t in (self.lengths, self.commit_at, self.column, self.positions):
            t.add_(1)
        self.new_slot.copy_(self.slot)  # the slot just freed takes the next token
        self.slot.add_(1).remainder_(self.ring)


def why_not(kv: LayerKV) -> str | None:
    """None when ``kv`` can take the static layout now, else why not (some reasons pass after more
    eager steps: a window not yet full, nothing committed yet)."""
    if not kv.seq_window:
        return "the layer holds nothing yet"
    if kv.padded or len(set(kv.seq_lengths)) > 1:
        return "the batch's sequences differ in length (a padded batch)"
    if kv.codec is None:
        return None
    if kv.library_bytes is not None:
        return "transformers' quantized cache stores this layer"
    if kv.config.residual_unit != "token":
        return f"residual_unit '{kv.config.residual_unit}' commits whole appends"
    if kv.codec.token_block != 1:
        return f"codec '{kv.codec.config.name}' commits blocks of {kv.codec.token_block} tokens"
    if kv.seq_window[0] != kv.config.residual:
        return f"the native window holds {kv.seq_window[0]} of its {kv.config.residual} tokens"
    if kv.store_k is None or not kv.store_k.one_row_per_token() or not kv.store_v.one_row_per_token():
        return "nothing committed yet" if kv.store_k is None else "the codec stores fields per token group"
    return None


class StaticKV:
    """One layer's buffers for graphed steps of rollouts of up to ``capacity`` tokens (module docstring),
    shaped like ``like`` (a layer of the first rollout). ``path``: the decode-attention path of a codec
    layer ('lut', 'triton' or 'torch'; see :func:`kernels.attention.decide_attention`), ignored for a
    native layer. The codec and its tables are ``like``'s, kept for the buffers' lifetime (a captured
    graph reads them)."""

    def __init__(self, like: LayerKV, counters: StaticCounters, capacity: int, path: str | None = None):
        why = why_not(like)
        if why is not None:
            raise ValueError(f"this layer cannot take the static layout: {why}")
        self.counters, self.path, self.codec, self.capacity = counters, path, like.codec, capacity
        self.finite = DeferredFinite()  # the steps' non-finite notes, handed to the rollout's layer on unload
        k, v = like.window_k, like.window_v
        B, H, W, d = k.shape
        if like.codec is None:
            self.keys = k.new_zeros(B, H, capacity, d)
            self.values = v.new_zeros(B, H, capacity, d)
            self._columns = torch.arange(capacity, device=k.device)
            return
        if W + 1 != counters.ring:
            raise ValueError(f"a window of {W} tokens in rings of {counters.ring} slots")
        self.store_k, self.store_v = EncodedStore(B), EncodedStore(B)
        self.store_k.allocate(capacity, like.store_k.view())
        self.store_v.allocate(capacity, like.store_v.view())
        self.keys, self.values = self.store_k.view(capacity), self.store_v.view(capacity)
        self.wk, self.wv = k.new_zeros(B, H, W + 1, d), v.new_zeros(B, H, W + 1, d)
        self.dk = self.dv = None
        if path == "torch":
            # a codec no fused kernel reads: its keys and values kept decoded; read by its score estimator,
            # the keys decoded in float32 (whose dot products are the estimator's scores to float rounding)
            self._memo = like._uses_memo() or like.config.attend == "reconstruct"
            dk, dv = self._decoded(like)
            self.dk, self.dv = dk.new_zeros(B, H, capacity, d), dv.new_zeros(B, H, capacity, d)

    def _decoded(self, kv: LayerKV) -> tuple[torch.Tensor, torch.Tensor]:
        if self._memo:
            return kv.decoded()
        return kv.codec.decode(kv.compressed_keys()).float(), kv.codec.decode_values(kv.compressed_values())

    def fits(self, kv: LayerKV, steps: int) -> bool:
        """Whether ``kv`` (a layer like the one these buffers were made for) and its next ``steps`` fit."""
        need = (kv.seq_window[0] if kv.codec is None else kv.committed) + steps
        return why_not(kv) is None and need <= self.capacity

    def load(self, kv: LayerKV) -> None:
        """Copy ``kv``'s tokens in (its committed states, its window), before its first step here."""
        self.finite.reset()
        W = kv.seq_window[0]
        if kv.codec is None:
            self.keys[:, :, :W].copy_(kv.window_k)
            self.values[:, :, :W].copy_(kv.window_v)
            return
        self.store_k.load(kv.store_k.view())
        self.store_v.load(kv.store_v.view())
        self.wk[:, :, :W].copy_(kv.window_k)  # oldest first: slot 0 is the oldest
        self.wv[:, :, :W].copy_(kv.window_v)
        if self.dk is not None:
            dk, dv = self._decoded(kv)
            self.dk[:, :, :dk.shape[2]].copy_(dk)
            self.dv[:, :, :dv.shape[2]].copy_(dv)

    def step(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
             softcap: float | None = None) -> torch.Tensor:
        """q [B, Hq, 1, d], the step's k, v [B, Hkv, 1, d] -> attention output [B, Hq, 1, d]; then the
        token is stored (and the oldest window token committed). No host sync, no shape change."""
        if softcap is not None or q.shape[2] != 1 or k.shape[2] != 1:
            raise RuntimeError("a static layer takes single-token steps without soft-capping "
                               "(adapters.hf.graphed_decode.why_not refuses the rest)")
        c, codec = self.counters, self.codec
        if codec is None:
            self.keys.index_copy_(2, c.column, k)
            self.values.index_copy_(2, c.column, v)
            keep = (self._columns <= c.column)[None, None, None]  # [1, 1, 1, T]: the history and this token
            return F.scaled_dot_product_attention(q, self.keys, self.values, attn_mask=keep, scale=scale,
                                                  enable_gqa=True)
        self.wk.index_copy_(2, c.new_slot, k)
        self.wv.index_copy_(2, c.new_slot, v)
        if self.dk is None:
            out = decode_attention(q, self.keys, self.values, codec, self.wk, self.wv, scale=scale,
                                   backend=codec.config.backend, lengths=c.lengths, path=self.path)
        else:
            out = attend(q, decoded=(self.dk, self.dv), window_k=self.wk, window_v=self.wv, lengths=c.lengths,
                         scale=scale)
        # the eager commit: the oldest window token, encoded alone (noted on the device if not finite)
        sk = codec.encode(self.wk.index_select(2, c.slot), self.finite)
        sv = codec.encode_values(self.wv.index_select(2, c.slot), self.finite)
        self.store_k.write_at(sk, c.commit_at)
        self.store_v.write_at(sv, c.commit_at)
        if self.dk is not None:  # the eager memo decodes each committed token once, as here
            self.dk.index_copy_(2, c.commit_at, codec.decode(sk).to(self.dk.dtype))
            self.dv.index_copy_(2, c.commit_at, codec.decode_values(sv).to(self.dv.dtype))
        return out

    def unload(self, kv: LayerKV, steps: int) -> None:
        """Hand ``steps`` steps' tokens back to ``kv``, which then holds what the same steps run eagerly
        would have left it (its tokens, lengths and window; a memo of decoded tokens read again)."""
        self.finite.merge_into(kv.finite)
        W = kv.seq_window[0]
        if kv.codec is None:
            kv.window_k = torch.cat([kv.window_k, self.keys[:, :, W:W + steps]], -2)
            kv.window_v = torch.cat([kv.window_v, self.values[:, :, W:W + steps]], -2)
            kv.seq_window = [w + steps for w in kv.seq_window]
            kv._append_sizes = kv._append_sizes + [1] * steps  # a native layer keeps every append's size
        else:
            n = kv.committed
            kv.store_k.append(tail(self.store_k.view(n + steps), n))
            kv.store_v.append(tail(self.store_v.view(n + steps), n))
            R = self.wk.shape[2] - 1  # the window in token order: the R slots after the free one
            order = (torch.arange(1, R + 1, device=self.wk.device) + steps + R) % (R + 1)
            kv.window_k, kv.window_v = self.wk.index_select(2, order), self.wv.index_select(2, order)
            kv.seq_committed = [c + steps for c in kv.seq_committed]
            kv._dec_k = kv._dec_v = None  # decoded again if an eager step reads them
            kv._dec_valid, kv._dec_version = 0, -1
            kv._append_sizes = trim_appends(kv._append_sizes + [1] * steps, kv.seq_window[0])
        kv._seen = [s + steps for s in kv._seen]
        kv.columns += steps
