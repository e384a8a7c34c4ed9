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
  the device. A codec that commits single tokens keeps its native window in a ring of R + 1
  slots: a step writes its token into the free slot, attends through the same decode kernel the
  eager step takes (``path``), and commits the oldest token (encoded by the codec exactly as the
  eager commit encodes it) at the device position, which frees its slot for the next step: the
  eager cache's steady state, where each step commits one token and the window stays R tokens. Where
  both of the codec's encoders run fused, the window write and the commit are one launch
  (:class:`kernels.triton.commit.FusedCommit`, the same bytes; :meth:`kernels.base.Codec.fused_commit`
  says where), else a sequence of the encoders and indexed writes. A codec that commits blocks of G
  tokens (KIVI: ``token_block``) keeps its window in token order in R + G slots, its fill on the device:
  each step writes its token after the window's, attends the filled slots (``window_lengths``), encodes
  the oldest G slots and writes them at the device position, and moves the window down G slots; all of
  it every step, shape-static, but only the step that fills the block commits (it encodes its tokens,
  counts them and moves the window; the others encode zeros into rows the lengths do not reach yet and
  move nothing), so the host reads no branch. A codec no fused kernel reads keeps its decoded keys and
  values in float32 [B, Hkv, capacity + window slots, d] buffers instead, each step decoding the tokens it
  commits, and attends them and a copy of its window after them in one SDPA (the eager PyTorch core's float32
  softmax to float rounding, no key repeated per query head): as the eager memo does for a codec read decoded
  (``memo_decoded``); for
  one read by its score estimator (QJL, TurboQuant-prod, OCTOPUS-QJL without a kernel) the keys are kept
  decoded in float32, whose dot products are the estimator's scores to float rounding
  (``<q, decode(k)>``: a test checks it), rather than unpacking every key's sketch again at each step;
- a native layer's keys and values sit in [B, Hkv, capacity, d] buffers, written at the step's
  column and read through SDPA with a mask built on the device from it.

Outputs equal the eager step's to float rounding, not bit for bit: the kernels read a longer view
(masked by lengths) and the window in ring order, which orders their reductions differently, and
SDPA reads a masked buffer rather than the exact history.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.attention import decode_attention

from kernels.checks import DeferredFinite

from adapters.cache.encoded_store import EncodedStore, tail
from adapters.cache.layer_kv import LayerKV, trim_appends


class StaticCounters:
    """Where a step is, on the device (advanced in place by the step itself, so a replay moves on).

    ``lengths`` int32 [B]: committed tokens per sequence before the step's commit (the kernels'
    lengths); ``commit_at`` int64 [1]: the token index the step commits to; ``column`` int64 [1]: the
    step's token's column in a native layer; ``positions`` int64 [B, 1]: the model's position ids.

    Codec layers of single-token commits (``block`` 1): ``slot`` int64 [1], the window slot holding the
    oldest token, in rings of ``window`` + 1 slots (the codec layers' window of ``window`` tokens); the
    step's token goes into ``new_slot``, the slot before it.

    Codec layers that commit blocks of ``block`` tokens: ``window`` + ``block`` slots in token order;
    ``fill`` int64 [1]: the window's tokens before the step (the slot the step's token takes);
    ``fill_lengths`` int32 [B]: the slots the step attends (``fill`` + 1); ``full`` bool [1]: the step's
    token completes a block, so its commit is real; ``rows`` int64 [block]: the block's token rows in the
    store (``commit_at`` onwards) and ``group`` int64 [1]: its row of per-block fields; ``shift`` int64
    [slots]: the slot each slot takes its token from after the step (down a block where ``full``)."""

    def __init__(self, batch: int, window: int, device, block: int = 1):
        self.lengths = torch.zeros(batch, dtype=torch.int32, device=device)
        self.commit_at = torch.zeros(1, dtype=torch.int64, device=device)
        self.column = torch.zeros(1, dtype=torch.int64, device=device)
        self.positions = torch.zeros(batch, 1, dtype=torch.int64, device=device)
        self.window, self.block = window, block
        self.ring = window + block
        if block == 1:
            self.slot = torch.zeros(1, dtype=torch.int64, device=device)
            self.new_slot = torch.full((1,), window, dtype=torch.int64, device=device)
            return
        self.fill = torch.zeros(1, dtype=torch.int64, device=device)
        self.fill_lengths = torch.zeros(batch, dtype=torch.int32, device=device)
        self.full = torch.zeros(1, dtype=torch.bool, device=device)
        self._step = torch.zeros(1, dtype=torch.int64, device=device)  # tokens the step commits: block * full
        self.rows = torch.zeros(block, dtype=torch.int64, device=device)
        self.group = torch.zeros(1, dtype=torch.int64, device=device)
        self._slots = torch.arange(self.ring, device=device)
        self._kept = self._slots < window  # the slots the window keeps after a commit
        self.shift = self._slots.clone()

    def load(self, committed: int, columns: int, fill: int | None = None) -> None:
        """A rollout's start: ``committed`` tokens per sequence in the codec layers' stores, ``columns`` fed,
        ``fill`` tokens in their windows (block codecs: from ``window`` to ``window`` + ``block`` - 1)."""
        self.lengths.fill_(committed)
        self.commit_at.fill_(committed)
        self.column.fill_(columns)
        self.positions.fill_(columns)
        if self.block == 1:
            self.slot.zero_()
            self.new_slot.fill_(self.window)
            return
        if committed % self.block or not self.window <= fill < self.ring:
            raise ValueError(f"a window of {fill} tokens after {committed} committed, in blocks of {self.block}")
        self.fill.fill_(fill)
        self.rows.copy_(self._slots[:self.block] + committed)
        self.group.fill_(committed // self.block)
        self._derive()

    def _derive(self) -> None:
        """What the step reads of ``fill``, in place."""
        self.fill_lengths.copy_(self.fill + 1)
        torch.eq(self.fill, self.ring - 1, out=self.full)
        torch.mul(self.full, self.block, out=self._step)
        torch.add(self._slots, self._kept * self._step, out=self.shift)

    def advance(self) -> None:
        for t in (self.column, self.positions):
            t.add_(1)
        if self.block == 1:
            self.lengths.add_(1)
            self.commit_at.add_(1)
            self.new_slot.copy_(self.slot)  # the slot just freed takes the next token
            self.slot.add_(1).remainder_(self.ring)
            return
        self.lengths.add_(self._step.to(torch.int32))
        for t in (self.commit_at, self.rows):
            t.add_(self._step)
        self.group.add_(self.full.to(torch.int64))
        self.fill.add_(1).sub_(self._step)
        self._derive()


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
        return ("transformers' own quantized cache stores this layer (hf-quanto, hf-hqq: in transformers' layer "
                "objects, which grow on the host: these codecs decode eagerly)")
    if kv.config.residual_unit != "token":
        return f"residual_unit '{kv.config.residual_unit}' commits whole appends"
    if kv.seq_window[0] < kv.config.residual:
        return f"the native window holds {kv.seq_window[0]} of its {kv.config.residual} tokens"
    block = kv.codec.token_block
    if kv.store_k is None or not kv.store_k.rows_in_blocks(block) or not kv.store_v.rows_in_blocks(block):
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
        G = self.block = like.codec.token_block
        if counters.block != G or counters.window != like.config.residual:
            raise ValueError(f"a window of {like.config.residual} tokens in blocks of {G}, counted in windows of "
                             f"{counters.window} in blocks of {counters.block}")
        # block codecs: the views hold whole blocks, and the rows after them the block a step writes before
        # it fills (the rows the lengths do not reach yet)
        span = -(-capacity // G) * G
        rows = span if G == 1 else span + G
        self.store_k, self.store_v = EncodedStore(B), EncodedStore(B)
        self.store_k.allocate(rows, like.store_k.view())
        self.store_v.allocate(rows, like.store_v.view())
        self.keys, self.values = self.store_k.view(span), self.store_v.view(span)
        self.wk, self.wv = k.new_zeros(B, H, counters.ring, d), v.new_zeros(B, H, counters.ring, d)
        self.dk = self.dv = None
        self._commit = None
        if path == "torch":
            # a codec no fused kernel reads: its keys and values kept decoded in float32 (read by its score
            # estimator, the keys' dot products are the estimator's scores to float rounding), with the window's
            # ring slots after them, so that one SDPA reads them all (_attend)
            self._memo = like._uses_memo() or like.config.attend == "reconstruct"
            self.dk = k.new_zeros(B, H, rows + counters.ring, d, dtype=torch.float32)
            self.dv = torch.zeros_like(self.dk)
            self._rows = torch.arange(rows + counters.ring, device=k.device)
            self._ring = self._rows[:counters.ring]
        elif G == 1:  # the window write and the commit in one launch, where the codec has one
            fused = like.codec.fused_commit(k.device)
            if fused is not None:
                c, flags = counters, (self.finite.flag("keys", k.device), self.finite.flag("values", k.device))
                self._commit = fused(like.codec, self.wk, self.wv, self.store_k.buffers(), self.store_v.buffers(),
                                     c.new_slot, c.slot, c.commit_at, flags)

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
            del dk, dv
            kv._dec_k = kv._dec_v = None  # the eager memo's copy goes (unload drops it too): one decoded copy held
            kv._dec_valid, kv._dec_version = 0, -1

    def step(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
             softcap: float | None = None) -> torch.Tensor:
        """q [B, Hq, 1, d], the step's k, v [B, Hkv, 1, d] -> attention output [B, Hq, 1, d]; then the
        token is stored (and the oldest window token, or block, committed). No host sync, no shape change."""
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
        window_lengths = self._before(k, v)
        out = self._attend(q, scale, window_lengths)
        self._after()
        return out

    def codec_work(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """A codec layer's step without its attention (its window write and commit, as :meth:`step` runs
        them; the counters do not move): what scripts/gpu_profile_generate.py times on its own."""
        self._before(k, v)
        self._after()

    def _before(self, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor | None:
        """The step's token into the window (fused: and the commit, before the attention: module docstring);
        -> the window's per-sequence lengths for the attention (None: every slot)."""
        c = self.counters
        if self._commit is not None:
            self._commit(k, v)
            return None
        at = c.new_slot if self.block == 1 else c.fill
        self.wk.index_copy_(2, at, k)
        self.wv.index_copy_(2, at, v)
        return None if self.block == 1 else c.fill_lengths

    def _after(self) -> None:
        """The eager commit after the attention, unless fused: the oldest window token, encoded alone (noted
        on the device if not finite), or the oldest block where the step fills it (else zeros, finite so
        nothing noted, into the rows the lengths reach only once the block commits) and the window moved."""
        c, G = self.counters, self.block
        if self._commit is not None:
            return
        if G == 1:
            self._write(self.wk.index_select(2, c.slot), self.wv.index_select(2, c.slot), c.commit_at)
            return
        self._write(torch.where(c.full, self.wk[:, :, :G], 0), torch.where(c.full, self.wv[:, :, :G], 0), c.rows,
                    c.group)
        self.wk.copy_(self.wk.index_select(2, c.shift))
        self.wv.copy_(self.wv.index_select(2, c.shift))

    def _attend(self, q: torch.Tensor, scale: float, window_lengths=None) -> torch.Tensor:
        c = self.counters
        if self.dk is None:
            return decode_attention(q, self.keys, self.values, self.codec, self.wk, self.wv, scale=scale,
                                    backend=self.codec.config.backend, lengths=c.lengths,
                                    window_lengths=window_lengths, path=self.path)
        # the window's ring slots copied after the committed rows (a later commit writes its decoded rows over
        # them), then one SDPA over the rows up to the window's last filled slot: the PyTorch core's float32
        # softmax over [committed, window] (eager), to float rounding, with no key repeated per query head
        at = c.commit_at + self._ring
        self.dk.index_copy_(2, at, self.wk.to(self.dk.dtype))
        self.dv.index_copy_(2, at, self.wv.to(self.dv.dtype))
        filled = self._ring.numel() if window_lengths is None else c.fill + 1  # G = 1: every slot
        keep = (self._rows < c.commit_at + filled)[None, None, None]  # [1, 1, 1, rows]
        # the G query heads of a key head as G query rows of it (query head i reads key head i // G): SDPA's kernels
        # for float32 and a mask take no grouped heads, and its fallback would copy every key G times
        B, Hq, _, d = q.shape
        Hkv = self.dk.shape[1]
        out = F.scaled_dot_product_attention(q.to(self.dk.dtype).reshape(B, Hkv, Hq // Hkv, d), self.dk, self.dv,
                                             attn_mask=keep, scale=scale)
        return out.reshape(B, Hq, 1, d).to(q.dtype)

    def _write(self, k: torch.Tensor, v: torch.Tensor, rows: torch.Tensor, group: torch.Tensor | None = None) -> None:
        """Encode k, v [B, H, n, d] and write them at token rows ``rows`` (per-block fields at ``group``)."""
        sk, sv = self.codec.encode(k, self.finite), self.codec.encode_values(v, self.finite)
        self.store_k.write_at(sk, rows, group)
        self.store_v.write_at(sv, rows, group)
        if self.dk is not None:  # the eager memo decodes each committed token once, as here
            self.dk.index_copy_(2, rows, self.codec.decode(sk).to(self.dk.dtype))
            self.dv.index_copy_(2, rows, self.codec.decode_values(sv).to(self.dv.dtype))

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
            n, G, R = kv.committed, self.block, self.counters.window
            done = (W - R + steps) // G * G  # tokens committed by the steps: every step's (G = 1), or whole blocks
            kv.store_k.append(tail(self.store_k.view(n + done), n))
            kv.store_v.append(tail(self.store_v.view(n + done), n))
            if G == 1:  # the window in token order: the R slots after the free one
                order = (torch.arange(1, R + 1, device=self.wk.device) + steps + R) % (R + 1)
                kv.window_k, kv.window_v = self.wk.index_select(2, order), self.wv.index_select(2, order)
            else:  # in token order already
                left = W + steps - done
                kv.window_k, kv.window_v = self.wk[:, :, :left].clone(), self.wv[:, :, :left].clone()
            kv.seq_committed = [c + done for c in kv.seq_committed]
            kv.seq_window = [W + steps - done] * len(kv.seq_window)
            kv._dec_k = kv._dec_v = None  # decoded again if an eager step reads them
            kv._dec_valid, kv._dec_version = 0, -1
            kv._append_sizes = trim_appends(kv._append_sizes + [1] * steps, kv.seq_window[0])
        kv._seen = [s + steps for s in kv._seen]
        kv.columns += steps
