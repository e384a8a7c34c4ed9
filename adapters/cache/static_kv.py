"""A layer's cache laid out for graphed decode steps: :class:`StaticKV`, and the device counters
every layer of a step shares, :class:`StaticCounters`.

A CUDA graph replays fixed kernels on fixed addresses, so one captured decode step can stand for
every later step only if nothing it reads or writes moves and nothing it decides is read on the
host. The eager layer (:class:`adapters.cache.layer_kv.LayerKV`) grows its tensors and keeps its lengths
in Python lists. Here, for the next ``steps`` single-token steps of an equal-length batch:

- a codec layer's committed states stay in its store's buffers, reserved for every token the steps
  will commit (:meth:`adapters.cache.encoded_store.EncodedStore.reserve`) and read as one fixed view of
  that many tokens by per-sequence lengths held on the device. Its native window is a ring of R + 1
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
- a native layer's keys and values sit in [B, Hkv, T0 + steps, d] buffers, written at the step's
  column and read through SDPA with a mask built on the device from it.

Outputs equal the eager step's to float rounding, not bit for bit: the kernels read a longer view
(masked by lengths) and the window in ring order, which orders their reductions differently, and
SDPA reads a masked buffer rather than the exact history. :meth:`StaticKV.write_back` hands the layer
back to the eager cache as the same steps run eagerly would have left it (its tokens, lengths and window).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.attention import attend, decode_attention

from adapters.cache.layer_kv import LayerKV, trim_appends


class StaticCounters:
    """Where a step is, on the device (advanced in place by the step itself, so a replay moves on).

    ``lengths`` int32 [B]: committed tokens per sequence before the step's commit (the kernels'
    lengths); ``commit_at`` int64 [1]: the token index the step commits to; ``column`` int64 [1]: the
    step's token's column in a native layer; ``positions`` int64 [B, 1]: the model's position ids;
    ``slot`` int64 [1]: the window slot holding the oldest token (in rings of ``window`` + 1 slots, the
    codec layers' window of ``window`` tokens; the step's token goes into the slot before it)."""

    def __init__(self, batch: int, committed: int, columns: int, window: int, device):
        self.lengths = torch.full((batch,), committed, dtype=torch.int32, device=device)
        self.commit_at = torch.tensor([committed], dtype=torch.int64, device=device)
        self.column = torch.tensor([columns], dtype=torch.int64, device=device)
        self.positions = torch.full((batch, 1), columns, dtype=torch.int64, device=device)
        self.ring = window + 1
        self.slot = torch.zeros(1, dtype=torch.int64, device=device)
        self.new_slot = torch.full((1,), window, dtype=torch.int64, device=device)

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
    """One layer in the static layout for ``steps`` more single-token steps (module docstring).

    ``path``: the decode-attention path of a codec layer ('lut', 'triton' or 'torch'; see
    :func:`kernels.attention.decide_attention`), ignored for a native layer."""

    def __init__(self, kv: LayerKV, counters: StaticCounters, steps: int, path: str | None = None):
        why = why_not(kv)
        if why is not None:
            raise ValueError(f"this layer cannot take the static layout: {why}")
        self.kv, self.counters, self.path = kv, counters, path
        k, v = kv.window_k, kv.window_v
        B, H, W, d = k.shape
        if kv.codec is None:  # the whole history, with room for the steps
            self.keys = k.new_zeros(B, H, W + steps, d)
            self.values = v.new_zeros(B, H, W + steps, d)
            self.keys[:, :, :W], self.values[:, :, :W] = k, v
            kv.window_k, kv.window_v = self.keys[:, :, :W], self.values[:, :, :W]  # the old copies go
            self._columns = torch.arange(W + steps, device=k.device)
        else:
            n = kv.committed + steps
            kv.store_k.reserve(n)
            kv.store_v.reserve(n)
            self.keys, self.values = kv.store_k.view(n), kv.store_v.view(n)
            if W + 1 != counters.ring:
                raise ValueError(f"a window of {W} tokens in rings of {counters.ring} slots")
            self.wk, self.wv = k.new_empty(B, H, W + 1, d), v.new_empty(B, H, W + 1, d)
            self.wk[:, :, :W], self.wv[:, :, :W] = k, v  # oldest first: slot 0 is the oldest
            self.dk = self.dv = None
            if path == "torch":
                estimator = not (kv._uses_memo() or kv.config.attend == "reconstruct")
                dk, dv = (kv.codec.decode(kv.compressed_keys()).float(), kv.codec.decode_values(kv.compressed_values())
                          ) if estimator else kv.decoded()
                self.dk, self.dv = dk.new_zeros(B, H, n, d), dv.new_zeros(B, H, n, d)
                self.dk[:, :, :dk.shape[2]], self.dv[:, :, :dv.shape[2]] = dk, dv
                self._memo = not estimator
                if self._memo:  # the eager memo becomes a view: one copy of the decoded keys, not two
                    kv._dec_k, kv._dec_v = self.dk[:, :, :dk.shape[2]], self.dv[:, :, :dv.shape[2]]

    def step(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
             softcap: float | None = None) -> torch.Tensor:
        """q [B, Hq, 1, d], the step's k, v [B, Hkv, 1, d] -> attention output [B, Hq, 1, d]; then the
        token is stored (and the oldest window token committed). No host sync, no shape change."""
        if softcap is not None or q.shape[2] != 1 or k.shape[2] != 1:
            raise RuntimeError("a static layer takes single-token steps without soft-capping "
                               "(adapters.hf.graphed_decode.why_not refuses the rest)")
        c, kv = self.counters, self.kv
        if kv.codec is None:
            self.keys.index_copy_(2, c.column, k)
            self.values.index_copy_(2, c.column, v)
            keep = (self._columns <= c.column)[None, None, None]  # [1, 1, 1, T]: the history and this token
            return F.scaled_dot_product_attention(q, self.keys, self.values, attn_mask=keep, scale=scale,
                                                  enable_gqa=True)
        self.wk.index_copy_(2, c.new_slot, k)
        self.wv.index_copy_(2, c.new_slot, v)
        if self.dk is None:
            out = decode_attention(q, self.keys, self.values, kv.codec, self.wk, self.wv, scale=scale,
                                   backend=kv.config.backend, lengths=c.lengths, path=self.path)
        else:
            out = attend(q, decoded=(self.dk, self.dv), window_k=self.wk, window_v=self.wv, lengths=c.lengths,
                         scale=scale)
        # the eager commit: the oldest window token, encoded alone (noted on the device if not finite)
        sk = kv.codec.encode(self.wk.index_select(2, c.slot), kv.finite)
        sv = kv.codec.encode_values(self.wv.index_select(2, c.slot), kv.finite)
        kv.store_k.write_at(sk, c.commit_at)
        kv.store_v.write_at(sv, c.commit_at)
        if self.dk is not None:  # the eager memo decodes each committed token once, as here
            self.dk.index_copy_(2, c.commit_at, kv.codec.decode(sk).to(self.dk.dtype))
            self.dv.index_copy_(2, c.commit_at, kv.codec.decode_values(sv).to(self.dv.dtype))
        return out

    def write_back(self, steps: int) -> None:
        """Hand the layer back to the eager cache after ``steps`` steps ran here."""
        kv = self.kv
        if kv.codec is None:
            T = kv.seq_window[0] + steps
            kv.window_k, kv.window_v = self.keys[:, :, :T], self.values[:, :, :T]
            kv.seq_window = [w + steps for w in kv.seq_window]
            kv._append_sizes = kv._append_sizes + [1] * steps  # a native layer keeps every append's size
        else:
            kv.store_k.advance(steps)
            kv.store_v.advance(steps)
            R = self.wk.shape[2] - 1  # the window in token order: the R slots after the free one
            order = (torch.arange(1, R + 1, device=self.wk.device) + steps + R) % (R + 1)
            kv.window_k, kv.window_v = self.wk.index_select(2, order), self.wv.index_select(2, order)
            kv.seq_committed = [n + steps for n in kv.seq_committed]
            if self.dk is not None and self._memo:  # the memo of decoded tokens, current
                n = kv.committed
                kv._dec_k, kv._dec_v = self.dk[:, :, :n], self.dv[:, :, :n]
                kv._dec_valid, kv._dec_version = n, kv.store_k.version
            kv._append_sizes = trim_appends(kv._append_sizes + [1] * steps, kv.seq_window[0])
        kv._seen = [s + steps for s in kv._seen]
        kv.columns += steps
