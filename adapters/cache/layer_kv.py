"""One layer of the compressed KV cache: :class:`LayerKV`, the codec states of its committed tokens
(in an append-only store) plus a native window of the most recent tokens; how it appends, commits,
reads (attends) and counts its bytes. :mod:`adapters.cache.kv_cache` holds the per-rollout cache of
these layers; its docstring gives the shapes.
"""
from __future__ import annotations

import math

import torch

from kernels import Codec, Encoded
from kernels.checks import DeferredFinite
from kernels.attention import attend, decide_attention, decode_attention
from kernels.backend import fused_wanted

from adapters.cache import ragged
from adapters.cache.config import CacheConfig
from adapters.cache.encoded_store import EncodedStore, tail


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


def trim_appends(sizes: list[int], left: int) -> list[int]:
    """The sizes of the last appends that cover the ``left`` tokens still in the window (the
    oldest of them cut to what is left of it)."""
    out = []
    for s in reversed(sizes):
        if left <= 0:
            break
        out.append(min(s, left))
        left -= s
    return out[::-1]


class LayerKV:
    """One layer's cache: compressed committed tokens + a native window.

    ``codec`` None means this layer is native (codec 'none' or a protected layer): it never
    commits, the window holds every token.

    Batches of different lengths (a left-padded batch, :meth:`append` with ``pads``): a codec
    layer drops the pads and keeps each sequence left-aligned, its committed tokens in the store
    (``seq_committed[b]`` each) and its window in ``window_k[b, :, :seq_window[b]]``; every commit
    decision is made per sequence exactly as for that sequence alone. A native layer keeps the
    padded columns as the model's own cache would (it is read with the model's padding mask) and
    counts only real tokens. ``columns``: the columns appended, pads included (what the model's
    masks and positions count).
    """

    def __init__(self, codec: Codec | None, config: CacheConfig):
        self.codec = codec
        self.config = config
        self.store_k: EncodedStore | None = None  # committed, encoded once, in token order
        self.store_v: EncodedStore | None = None
        self.window_k: torch.Tensor | None = None  # [B, Hkv, W, d] native
        self.window_v: torch.Tensor | None = None
        self._append_sizes: list[int] = []  # sizes of the appends still in the window
        self.seq_committed: list[int] = []  # per sequence (empty until the first append)
        self.seq_window: list[int] = []  # real tokens in the window, per sequence
        self._seen: list[int] = []  # real tokens appended, per sequence (the native cache's size)
        self._token_bytes = 0  # bytes of one token's native key + value
        self.columns = 0
        self.padded = False  # some append carried padding: sequences may differ in length
        # decoded committed tokens (memo_decoded): [B, Hkv, n, d]; rows [0, _dec_valid) of every
        # sequence are current as long as the store's version is _dec_version
        self._dec_k: torch.Tensor | None = None
        self._dec_v: torch.Tensor | None = None
        self._dec_valid, self._dec_version = 0, -1
        # non-finite keys/values of single-token (decode) steps, raised at the next chunk or stats()
        self.finite = DeferredFinite()
        # (key bytes, value bytes) of the whole batch where a library's layer stores this one (hold_library)
        self.library_bytes: tuple[int, int] | None = None
        self._commit_room = 0  # tokens per sequence the store makes room for at once (reserve_commits)

    def fork(self) -> "LayerKV":
        """An independent copy that shares the codec and the encoded states (copied on write)."""
        other = LayerKV.__new__(LayerKV)
        other.__dict__.update(self.__dict__)
        if self.store_k is not None:
            other.store_k, other.store_v = self.store_k.fork(), self.store_v.fork()
        for name in ("_append_sizes", "seq_committed", "seq_window", "_seen"):
            setattr(other, name, list(getattr(self, name)))
        other.finite = self.finite.fork()
        return other

    # --- writing --------------------------------------------------------------------------
    def append(self, k: torch.Tensor, v: torch.Tensor, pads: list[int] | None = None) -> None:
        """Add new tokens k, v [B, Hkv, t, d] (native), then commit what leaves the window.

        ``pads``: sequence b's first ``pads[b]`` tokens are padding (left padding), dropped by a
        codec layer; None: every token is real."""
        B, t = k.shape[0], k.shape[-2]
        if pads is not None and (len(pads) != B or any(not 0 <= p <= t for p in pads)):
            raise ValueError(f"pads must give 0..{t} pad tokens for each of the {B} sequences, got {pads}")
        pads = pads if pads is not None and any(pads) else None
        if not self.seq_window:
            self.seq_committed, self.seq_window, self._seen = [0] * B, [0] * B, [0] * B
            self._token_bytes = (k[0, ..., 0, :].numel() * k.element_size() + v[0, ..., 0, :].numel() * v.element_size())
        elif B != len(self.seq_window):
            raise ValueError(f"{B} sequences appended to a cache of {len(self.seq_window)}")
        if pads is not None:
            self.padded = True
            if self.config.residual_unit == "append" and self.codec is not None:
                raise NotImplementedError("residual_unit='append' keeps whole appends native; a padded batch "
                                          "needs residual_unit='token'")
        self.columns += t
        real = [t - p for p in pads] if pads else [t] * B
        self._seen = [s + n for s, n in zip(self._seen, real)]
        if self.codec is None:  # native: every column, as the model's own cache holds it
            self.window_k = k if self.window_k is None else torch.cat([self.window_k, k], dim=-2)
            self.window_v = v if self.window_v is None else torch.cat([self.window_v, v], dim=-2)
            self.seq_window = [w + n for w, n in zip(self.seq_window, real)]
        else:
            lens = self.seq_window
            self.window_k, self.seq_window = ragged.append(self.window_k, lens, k, pads)
            self.window_v, _ = ragged.append(self.window_v, lens, v, pads)
        self._append_sizes.append(t)
        # a decode step's tokens are checked on the device with no sync (the step stays host-free);
        # a chunk of several tokens syncs for what it and the steps before it encoded
        self._flush(self.finite if t == 1 else None)
        if t > 1:
            self.finite.raise_if_any()

    def _flush(self, defer: DeferredFinite | None = None) -> None:
        if self.codec is None or self.window_k is None:
            return
        if self.config.residual_unit == "append":
            keep_appends = self._append_sizes[-self.config.residual:] if self.config.residual > 0 else []
            keep = sum(keep_appends)
        else:
            keep = self.config.residual
        block = self.codec.token_block
        counts = []  # per sequence, as alone; an engine may keep more of them native (MLX before quantized_kv_start)
        for c, w in zip(self.seq_committed, self.seq_window):
            engine = self.codec.native_tokens(c + w)
            counts.append(max(w - (keep if engine is None else engine), 0) // block * block)
        if not any(counts):
            return
        if self.store_k is None:
            self.store_k, self.store_v = EncodedStore(len(counts)), EncodedStore(len(counts))
        for n in sorted(set(counts) - {0}):  # sequences that commit the same count are encoded together
            seqs = [b for b, c in enumerate(counts) if c == n]
            every = len(seqs) == len(counts)
            k_old = self.window_k[..., :n, :] if every else self.window_k[seqs, :, :n]
            v_old = self.window_v[..., :n, :] if every else self.window_v[seqs, :, :n]
            self.store_k.append(self.codec.encode(k_old, defer), None if every else seqs)
            self.store_v.append(self.codec.encode_values(v_old, defer), None if every else seqs)
        # drop the committed tokens (a copy: their native storage is released)
        lens = self.seq_window
        self.window_k, self.seq_window = ragged.drop_front(self.window_k, lens, counts)
        self.window_v, _ = ragged.drop_front(self.window_v, lens, counts)
        self.seq_committed = [c + n for c, n in zip(self.seq_committed, counts)]
        self._append_sizes = trim_appends(self._append_sizes, max(self.seq_window))
        self._reserve_room()

    def reserve_commits(self, seen: list[int]) -> None:
        """Room in the store for what this codec layer commits once sequence b has ``seen[b]`` real tokens
        (a replay in pieces: its buffers grow once to their final size, not by doublings)."""
        if self.codec is None or self.config.residual_unit != "token":
            return
        block = self.codec.token_block
        self._commit_room = max(max(n - self.config.residual, 0) // block * block for n in seen)
        self._reserve_room()

    def _reserve_room(self) -> None:
        if self._commit_room and self.store_k is not None:  # once the store exists (its first commit)
            self.store_k.reserve(self._commit_room)
            self.store_v.reserve(self._commit_room)
            self._commit_room = 0

    def hold_native(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Make this native layer hold exactly k, v [B, Hkv, T, d] (a sliding-window layer's cache,
        kept by transformers' own layer and mirrored here so the byte counts include it: what it
        holds is also what a native cache of the same model holds)."""
        if self.codec is not None:
            raise RuntimeError("hold_native is for a native layer (no codec)")
        B, T = k.shape[0], k.shape[-2]
        self.window_k, self.window_v = k, v
        self.seq_window, self._seen, self.seq_committed = [T] * B, [T] * B, [0] * B
        self._token_bytes = k[0, ..., 0, :].numel() * k.element_size() + v[0, ..., 0, :].numel() * v.element_size()

    def hold_library(self, nbytes: tuple[int, int], batch: int, quantized: int, residual: int,
                     token_bytes: int) -> None:
        """Mirror a layer that transformers' quantized cache stores (:mod:`adapters.hf.library_layer`):
        ``nbytes`` (key bytes, value bytes) of its quantized tensors for the whole batch, ``quantized``
        tokens in them and ``residual`` tokens in the model's dtype (``token_bytes`` a native token's key
        and value), the same for every sequence (the library keeps a padded batch's columns)."""
        self.library_bytes = nbytes
        self.seq_committed, self.seq_window = [quantized] * batch, [residual] * batch
        self._seen = [quantized + residual] * batch
        self._token_bytes = token_bytes
        self.columns = quantized + residual

    def repeat_batch(self, n: int) -> None:
        """Each sequence repeated ``n`` times in place (b -> b*n .. b*n + n-1): a batch-1 cache made a batch."""
        def rep(xs):
            return [x for x in xs for _ in range(n)]

        if self.store_k is not None:
            self.store_k.repeat_batch(n)
            self.store_v.repeat_batch(n)
        if self.window_k is not None:
            self.window_k, self.window_v = (t.repeat_interleave(n, 0) for t in (self.window_k, self.window_v))
        self.seq_committed, self.seq_window, self._seen = rep(self.seq_committed), rep(self.seq_window), rep(self._seen)
        self._dec_k = self._dec_v = None
        self._dec_valid, self._dec_version = 0, -1

    # --- reading --------------------------------------------------------------------------
    @property
    def committed(self) -> int:
        """Committed tokens (of the longest sequence, where a padded batch's sequences differ)."""
        return max(self.seq_committed, default=0)

    @property
    def seq_lengths(self) -> list[int]:
        """Real tokens held per sequence (committed + window)."""
        return [c + w for c, w in zip(self.seq_committed, self.seq_window)]

    @property
    def length(self) -> int:
        """Tokens held (of the longest sequence, where a padded batch's sequences differ)."""
        return max(self.seq_lengths, default=0)

    @property
    def key_states(self) -> list[Encoded]:
        """The committed key states as one state (a list, empty while nothing is committed)."""
        state = self.compressed_keys()
        return [] if state is None else [state]

    @property
    def value_states(self) -> list[Encoded]:
        state = self.compressed_values()
        return [] if state is None else [state]

    def compressed_keys(self) -> Encoded | None:
        """Every sequence's committed keys: fields [B, Hkv, rows(T), k] (views of the store; a
        sequence's first ``seq_committed[b]`` tokens are its own), or None."""
        return None if self.store_k is None else self.store_k.view()

    def compressed_values(self) -> Encoded | None:
        return None if self.store_v is None else self.store_v.view()

    def _uses_memo(self) -> bool:
        return (self.config.memo_decoded and self.codec is not None
                and (self.config.attend == "reconstruct" or not self.codec.has_score_estimator))

    def decoded(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Committed keys and values decoded, [B, Hkv, committed, d] each (input dtype), or None.

        With ``memo_decoded`` each encoded token is decoded once and kept (where a padded batch's
        sequences differ, the tokens after the shortest sequence's are decoded again when the
        longer ones commit); otherwise every call decodes.
        """
        if self.codec is None or self.committed == 0:
            return None
        if not self.config.memo_decoded:
            return self.codec.decode(self.compressed_keys()), self.codec.decode_values(self.compressed_values())
        if self._dec_version != self.store_k.version:  # decode only what changed since the last read
            done = self._dec_valid
            k = self.codec.decode(tail(self.compressed_keys(), done))
            v = self.codec.decode_values(tail(self.compressed_values(), done))
            if done:
                k = torch.cat([self._dec_k[..., :done, :], k], -2)
                v = torch.cat([self._dec_v[..., :done, :], v], -2)
            self._dec_k, self._dec_v = k, v
            self._dec_valid, self._dec_version = min(self.seq_committed), self.store_k.version
        return self._dec_k, self._dec_v

    def reconstruct(self) -> tuple[torch.Tensor, torch.Tensor]:
        """All keys and values [B, Hkv, T, d], committed ones decoded (reconstruct-then-attend)."""
        self._check_even("reconstruct")
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

    def _check_even(self, what: str) -> None:
        if self.padded and len(set(self.seq_lengths)) > 1:
            raise NotImplementedError(f"{what} needs sequences of one length; this padded batch's differ "
                                      f"({self.seq_lengths})")

    @staticmethod
    def _lengths(counts: list[int], width: int, device) -> torch.Tensor | None:
        """Per-sequence lengths for the attention kernels (int32 [B] on ``device``), or None where
        every sequence fills ``width``."""
        return None if all(c == width for c in counts) else ragged.as_tensor(tuple(counts), str(device))

    def attend(self, q: torch.Tensor, scale: float | None = None, mask: torch.Tensor | None = None,
               k_new: torch.Tensor | None = None, v_new: torch.Tensor | None = None,
               causal: bool = False, softcap: float | None = None, pads: list[int] | None = None) -> torch.Tensor:
        """softmax(q K^T * scale + mask) V over [committed, window, (k_new)] in token order.

        q: [B, Hq, Tq, d]; mask: additive or boolean, broadcastable to [B, Hq, Tq, T_total]
        (True = keep); k_new/v_new [B, Hkv, t, d]: extra native tokens attended but not stored
        (a prefill chunk, a video block in flight). ``causal``: the Tq queries are the last Tq
        positions of the T_total keys and see only keys up to their own position (applied on
        top of ``mask``). ``softcap``: attention logit soft-capping (Gemma 2; see
        :func:`kernels.attention.attend`). Returns [B, Hq, Tq, d] in q's dtype.

        Sequences of different lengths (a padded batch, or ``pads``: sequence b's first
        ``pads[b]`` new tokens are padding) are read by per-sequence lengths, causally, with no
        ``mask`` (one over padded columns cannot address left-aligned storage); a pad query's
        output is meaningless.

        A single-token step that masks nothing goes to :func:`kernels.attention.decode_attention`
        (the fused kernel where the backend asks for it and it covers the codec); everything else to
        the PyTorch core :func:`kernels.attention.attend`, with the committed tokens decoded once
        (``memo_decoded``, ``attend='reconstruct'``) or scored by the codec's estimator.
        """
        scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
        ragged_read = self.padded or (pads is not None and any(pads))
        if ragged_read:
            if self.codec is None:
                raise NotImplementedError("a native layer of a padded batch holds its pads: read it with the "
                                          "model's own attention and padding mask")
            if mask is not None:
                raise ValueError("a padded batch is read by per-sequence lengths; pass pads, not a mask")
            causal = True
        lengths = window_lengths = None
        if self.seq_window:
            lengths = self._lengths(self.seq_committed, self.committed, q.device)
            window_lengths = self._lengths(self.seq_window, 0 if self.window_k is None else self.window_k.shape[-2],
                                           q.device)
        keys = self.compressed_keys()
        path = self._fused_path(q, mask, softcap, keys)
        if k_new is not None and self.codec is not None and self.codec.stores_before_attending(self.length):
            # the engine writes the tokens in flight to its cache first: attended as stored (the same bytes the
            # append below stores); a fused kernel reads them decoded, as native tokens
            k_new, v_new = self.codec.encode(k_new, self.finite), self.codec.encode_values(v_new, self.finite)
            if path is not None:
                k_new, v_new = self.codec.decode(k_new), self.codec.decode_values(v_new)
        if path is not None:
            wk, wv = self.window_k, self.window_v
            if k_new is not None:  # each sequence's new token right after its own window
                wk, wl = ragged.append(wk, self.seq_window, k_new, None)
                wv, _ = ragged.append(wv, self.seq_window, v_new, None)
                window_lengths = self._lengths(wl, wk.shape[-2], q.device)
            return decode_attention(q, keys, self.compressed_values(), self.codec, wk, wv,
                                    scale=scale, backend=self.config.backend, lengths=lengths,
                                    window_lengths=window_lengths, path=path)
        prefix = {"codec": self.codec}  # its prepare_query for the compressed tokens
        if keys is not None:
            if self._uses_memo() or self.config.attend == "reconstruct":
                prefix["decoded"] = self.decoded()
            else:
                prefix.update(key_state=self.compressed_keys(), value_state=self.compressed_values())
        if ragged_read and pads is not None and any(pads) and k_new is not None:  # the new pads are not keys
            keep_new = ragged.keep_after_pads(tuple(pads), k_new.shape[-2], str(q.device))
            old = (self.committed if keys is not None else 0) + (0 if self.window_k is None else self.window_k.shape[-2])
            mask = torch.cat([torch.ones(q.shape[0], old, dtype=torch.bool, device=q.device), keep_new], -1)[:, None, None]
        return attend(q, **prefix, window_k=self.window_k, window_v=self.window_v, k_new=k_new, v_new=v_new,
                      lengths=lengths, window_lengths=window_lengths, mask=mask, causal=causal, scale=scale,
                      softcap=softcap)

    def _fused_path(self, q, mask, softcap, keys: Encoded | None) -> str | None:
        """The fused kernel ('lut' or 'triton') that takes this read, or None: it must be a single-token
        step over committed tokens that masks nothing, with a backend that wants the fused kernels
        here (:func:`kernels.backend.fused_wanted`; asked first, as the mask check may sync the
        device), and :func:`kernels.attention.decide_attention` must pick a kernel (a named one
        raises where it cannot run). Wherever no kernel runs, the read takes the same reference path
        as backend 'torch', bit for bit (soft-capped logits, a codec no kernel covers)."""
        if not (fused_wanted(self.config.backend, q.device) and q.shape[2] == 1 and self.codec is not None
                and keys is not None and (mask is None or _keeps_everything(mask))):
            return None
        path = decide_attention(q, self.codec, keys.shape[-3], self.config.backend, softcap=softcap).path
        return None if path == "torch" else path

    # --- accounting -----------------------------------------------------------------------
    def nbytes(self, seq: int | None = None) -> dict[str, int]:
        """Bytes held for sequence ``seq`` (default: every sequence), from real tokens only."""
        def count(xs):
            return sum(xs) if seq is None else (xs[seq] if xs else 0)

        kb = 0 if self.store_k is None else self.store_k.nbytes(seq)
        vb = 0 if self.store_v is None else self.store_v.nbytes(seq)
        if self.library_bytes is not None:  # a sequence's share of what the library holds for the batch
            kb, vb = (b if seq is None else b // len(self.seq_committed) for b in self.library_bytes)
        win = count(self.seq_window) * self._token_bytes
        native = win if self.codec is None else 0
        return {"compressed": kb + vb, "compressed_keys": kb, "compressed_values": vb,
                "window": 0 if self.codec is None else win, "native_layers": native,
                "uncompressed": count(self._seen) * self._token_bytes}
