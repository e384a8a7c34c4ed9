"""Hugging Face causal LMs (any transformers decoder) behind the compressed KV cache.

Which decoders are served (Llama, Qwen2/3, Mistral, Phi-3, Gemma 2/3 and the like: attention through
transformers' attention interface; sliding-window layers kept native) is :mod:`adapters.hf.arch`'s
decision, checked on the checkpoint's config before its weights are read.

The loaders (:mod:`adapters.hf.models`) return a :class:`CausalLM`, which is what the text tasks
drive: ``teacher_force`` for chunked teacher forcing and ``greedy`` for generation, each either
native (``cache_config`` None: a plain ``DynamicCache``, the model untouched) or through a
:class:`CompressedCache`, for one sequence or a batch of any lengths (left-padded:
:mod:`adapters.cache.padded_batch`).
"""
from __future__ import annotations

import copy
import functools
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Callable

import torch

from adapters.hf.arch import decoder_arch, geometry, refuse_padding
from adapters.hf.attach import attached
from adapters.hf.cache import CompressedCache
from adapters.hf.graphed_decode import DecodeGraphs, GraphedDecode, GraphedForward
from adapters.hf.graphed_decode import why_not as graphed_why_not
from adapters.hf.compat import cache_kwargs, takes_keyword
from adapters.hf.prefill import ChunkedFirstForward, native_prefill
from adapters.cache.config import CacheConfig
from adapters.cache.padded_batch import LeftPadded
from adapters.protocol import CachePolicy, Geometry, ModelAdapter
from adapters.cache.rollout_clock import OFF, RolloutClock
from adapters.cache.shared_prefill import SharedPrefill

#: CausalLM.graphs: 'auto' (CUDA graphs on CUDA), 'static' (their layout, run eagerly), 'off'
GRAPH_MODES = ("auto", "static", "off")


@dataclass
class CausalLM(ModelAdapter):
    """A transformers causal LM + tokenizer, in eval mode.

    ``share_prefill``: a rollout's first forward (the prefill into an empty cache) is plain
    attention whatever the codec (nothing is cached yet; see :mod:`adapters.hf.cache`), so its
    keys/values and logits are computed once per prompt and replayed into each cache, which then
    commits and encodes them exactly as after a live prefill. Results are bit-identical to
    running it (tests check); only the time differs. A timed rollout's prefill is then the shared
    forward's measured seconds plus its own replay and encode (:mod:`adapters.cache.shared_prefill`).

    ``graphs``: how :meth:`greedy` runs its decode steps once the cache allows (:mod:`adapters.hf.graphed_decode`;
    the native baseline then decodes through codec 'none', whose eager steps are the model's own):
    'auto' replays them from a CUDA graph on CUDA (eager elsewhere), 'static' runs them eagerly in the
    graph's static layout on any device (the same kernels a replay runs), 'off' runs every step as
    before. The static steps equal the eager ones to float rounding (longer, masked reads).

    ``prefill_chunk``: a prompt longer than this many tokens is prefilled in pieces of it, natively, then
    replayed into the cache (:mod:`adapters.hf.prefill`: the same numbers to float rounding, a chunk's
    activations instead of the prompt's); None: in one piece.
    """

    model: object
    tokenizer: object
    name: str
    source: str
    share_prefill: bool = True
    graphs: str = "auto"
    prefill_chunk: int | None = None
    _shared: SharedPrefill = field(default_factory=SharedPrefill, repr=False)
    _graphs: DecodeGraphs = field(default_factory=DecodeGraphs, repr=False)  # captured decode steps, kept

    modality = "text"

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def geometry(self) -> Geometry:
        return Geometry(*geometry(self.model.config))

    def cache_policy(self, window: int | None = None) -> CachePolicy:
        """The run's ``--residual`` tokens (or ``window`` tokens) stay native."""
        if window is None:
            return CachePolicy(note="the run's --residual tokens")
        return CachePolicy("token", window, note=f"the last {window} tokens")

    def describe(self) -> dict:
        """The model for model.json; ``native_layers`` (present when some are) lists the layers that stay
        native whatever the codec, by why: {'sliding': [...]} for sliding-window attention."""
        n_layers, n_kv, head_dim = self.geometry
        c = self.model.config
        out = {"name": self.name, "source": self.source, "model_type": c.model_type, "layers": n_layers,
               "q_heads": c.get_text_config(decoder=True).num_attention_heads, "kv_heads": n_kv,
               "head_dim": head_dim, "dtype": str(self.model.dtype).replace("torch.", ""), "device": str(self.device)}
        # how greedy decode steps ran: graphed steps equal eager ones to float rounding, not bit for bit
        out["prefill_chunk"] = self.prefill_chunk  # None: every prompt prefilled in one piece
        out["decode_steps"] = {"capture": "CUDA graphs where the cache allows (adapters.hf.graphed_decode)",
                               "static": "the graphs' static layout, run eagerly", "off": "eager"}[self._graph_mode]
        native = decoder_arch(c).native_layers()
        return {**out, "native_layers": native} if native else out

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def decode(self, ids) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def eos_ids(self) -> set[int]:
        ids = set()
        for src in (self.tokenizer.eos_token_id, getattr(self.model.generation_config, "eos_token_id", None)):
            if isinstance(src, int):
                ids.add(src)
            elif src:
                ids.update(int(i) for i in src)
        return ids

    # --- rollouts --------------------------------------------------------------------------
    def _feed(self, batch: int) -> LeftPadded:
        pad = self.tokenizer.pad_token_id
        return LeftPadded(batch, 0 if pad is None else pad, self.device)

    @functools.cached_property
    def devices(self) -> tuple[torch.device, ...]:
        """Every device holding a parameter (several where ``device_map`` spread the model)."""
        return tuple(dict.fromkeys(p.device for p in self.model.parameters()))

    @functools.cached_property
    def sliding_layers(self) -> tuple[int, ...]:
        """The layers that attend through a sliding window (kept native; they take no padded batch)."""
        return tuple(sorted(decoder_arch(self.model.config).native))

    def _forward(self, feed: LeftPadded, pieces: list[list[int]], cache, last: bool = False,
                 clock: RolloutClock = OFF) -> torch.Tensor:
        """One step of ``feed`` (sequence b's next tokens ``pieces[b]``) through ``cache``; returns
        the logits [B, t, V] float32 (the first step, into an empty cache, is the prefill: ``clock``
        marks its end). ``last``: only the last column's logits are wanted ([B, 1, V] where the
        model can skip the others: a long prompt's full logits would dwarf its KV cache)."""
        x, padding, pads = feed.step(pieces)
        if pads is not None and any(pads):
            refuse_padding(self.sliding_layers)
        if last and takes_keyword(self.model, "logits_to_keep"):  # transformers' causal LMs mostly take it
            padding = {**padding, "logits_to_keep": 1}
        if feed.columns == x.shape[1]:
            return self._prefill(x, cache, padding, pads, clock)
        if pads is not None and isinstance(cache, CompressedCache):
            cache.set_padding(pads)
        return self.model(x, **cache_kwargs(self.model, cache), use_cache=True, **padding).logits.float()

    def _prefill(self, x: torch.Tensor, cache, padding: dict, pads: list[int] | None,
                 clock: RolloutClock = OFF) -> torch.Tensor:
        """x [B, t] into an empty ``cache`` (``padding``, ``pads``: :meth:`LeftPadded.step`'s, plus
        ``logits_to_keep``); returns the logits [B, t or 1, V] float32. Computed natively and replayed
        into ``cache`` where it is shared or chunked (:mod:`adapters.hf.prefill`), else run through it."""
        chunked = self.prefill_chunk is not None and x.shape[1] > self.prefill_chunk
        if not self.share_prefill and not chunked:
            if pads is not None and isinstance(cache, CompressedCache):
                cache.set_padding(pads)
            logits = self.model(x, **cache_kwargs(self.model, cache), use_cache=True, **padding).logits.float()
            clock.prefill_done()
            return logits

        def compute():
            return native_prefill(self.model, x, padding, self.prefill_chunk)

        if self.share_prefill:
            # the chunk too: another chunking's layers are other numbers (float rounding), never reused for it
            key = (tuple(map(tuple, x.tolist())), None if pads is None else tuple(pads), "logits_to_keep" in padding,
                   self.prefill_chunk)
            (layers, logits), shared = self._shared.get(key, compute, self.devices)
        else:
            (layers, logits), shared = compute(), None
        for i, layer in enumerate(layers):  # layers are never written in place: a copy shares their tensors
            if isinstance(cache, CompressedCache):
                cache.replay(i, layer, pads, self.prefill_chunk)
            else:
                cache.layers[i] = copy.copy(layer)
        clock.prefill_done(shared)
        return logits

    @property
    def _graph_mode(self) -> str:
        """'capture', 'static' or 'off': what ``graphs`` means on this model's device."""
        if self.graphs not in GRAPH_MODES:
            raise ValueError(f"Unknown graphs '{self.graphs}'. Available: {', '.join(GRAPH_MODES)}")
        if self.graphs == "auto":
            return "capture" if self.device.type == "cuda" else "off"
        return self.graphs

    def _graphed(self, cache, ids: list[int], steps: int) -> GraphedDecode | None:
        """The next ``steps`` decode steps of ``cache`` graphed, or None where they run eagerly
        (``graphs`` off, or :func:`adapters.hf.graphed_decode.why_not` says why; asked again next step)."""
        mode = self._graph_mode
        if mode == "off" or graphed_why_not(self.model, cache, steps, capture=mode == "capture") is not None:
            return None
        return GraphedDecode(self.model, cache, ids, steps, capture=mode == "capture", pool=self._graphs)

    def graphed_generate(self, cache, steps: int):
        """A context in which ``self.model.generate(..., cache)`` takes its next ``steps`` decode steps as
        :meth:`greedy` takes its own (``graphs``; :class:`adapters.hf.graphed_decode.GraphedForward`), or
        a no-op (``graphs`` off, a transformers cache)."""
        mode = self._graph_mode
        if mode == "off" or not isinstance(cache, CompressedCache):
            return nullcontext()
        return GraphedForward(self.model, cache, steps, capture=mode == "capture", pool=self._graphs)

    def chunked_generate(self, cache):
        """A context in which ``self.model.generate(..., cache)`` prefills as :meth:`greedy` does: a prompt longer
        than ``prefill_chunk`` natively in chunks, then replayed into ``cache`` (:mod:`adapters.hf.prefill`)."""
        return ChunkedFirstForward(self.model, cache, self.prefill_chunk, self._prefill)

    def _session(self, cache_config: CacheConfig | None, decodes: bool = False):
        """(context manager, cache factory): native rollouts touch nothing, except that one which
        ``decodes`` on CUDA with ``graphs`` runs through codec 'none' (its graphed steps need our cache)."""
        if cache_config is None and decodes and self._graph_mode != "off":
            cache_config = CacheConfig()
        if cache_config is None:
            from transformers import DynamicCache

            return nullcontext(lambda: DynamicCache(config=self.model.config))
        return attached(self.model, self.cache_config(cache_config))

    @torch.no_grad()
    def teacher_force(self, ids: list[int] | list[list[int]], chunks: list[int] | list[list[int]],
                      cache_config: CacheConfig | None, on_chunk: Callable,
                      speed: RolloutClock | None = None) -> object:
        """Chunked teacher forcing: feed ``ids`` in pieces of the given sizes (summing to its length).

        ``ids``: one sequence, or a batch: a list of sequences of any lengths. ``chunks``: the
        chunk sizes, one plan for every sequence or (a batch) one plan per sequence. Step i feeds
        every sequence's i-th chunk, left-padded to the longest (a sequence whose plan has ended
        gives padding; see :mod:`adapters.cache.padded_batch`). Each chunk attends to its sequence's
        cache (compressed past + native window) and to itself, causally; then it is appended.
        Every sequence gets the numbers it gets alone, to float rounding (batched matmuls sum in
        another order); no pad enters a cache. ``on_chunk(start, logits)`` is called per chunk
        with the logits [t, V] float32 of one sequence; for a batch ``on_chunk(b, start, logits)``
        per sequence b and chunk, logits [t_b, V] (so the logits of a long context never pile up).
        ``speed``: a clock that times the first chunk as the prefill (nothing is decoded). Returns
        the cache.
        """
        batched = bool(ids) and isinstance(ids[0], (list, tuple))
        rows = [list(r) for r in ids] if batched else [list(ids)]
        per_row = batched and bool(chunks) and isinstance(chunks[0], (list, tuple))
        plans = [list(c) for c in chunks] if per_row else [list(chunks)] * len(rows)
        if len(plans) != len(rows):
            raise ValueError(f"{len(plans)} chunk plans for {len(rows)} sequences")
        for b, (row, plan) in enumerate(zip(rows, plans)):
            if sum(plan) != len(row) or not plan or min(plan) < 1:
                raise ValueError(f"chunk sizes {plan} must be >= 1 and sum to the {len(row)} tokens"
                                 + (f" of sequence {b}" if batched else ""))
        emit = on_chunk if batched else (lambda b, start, logits: on_chunk(start, logits))
        clock = speed or OFF
        with self._session(cache_config) as new_cache:
            cache = new_cache()
            feed, starts = self._feed(len(rows)), [0] * len(rows)
            clock.start(len(rows), self.devices)
            for i in range(max(map(len, plans))):
                pieces = [row[s:s + plan[i]] if i < len(plan) else [] for row, plan, s in zip(rows, plans, starts)]
                logits = self._forward(feed, pieces, cache, clock=clock if i == 0 else OFF)
                for b, piece in enumerate(pieces):
                    if piece:
                        emit(b, starts[b], logits[b, logits.shape[1] - len(piece):])
                        starts[b] += len(piece)
            clock.stop()
        return cache

    @torch.no_grad()
    def converse(self, context: list[int], questions: list[list[int]], max_new_tokens: int,
                 cache_config: CacheConfig | None, on_turn: Callable[[object], dict] = lambda cache: {}) -> list[dict]:
        """A chat through one cache (the ``turns`` task): ``context`` prefilled (plain attention, then committed),
        then per question its tokens fed as one chunk and up to ``max_new_tokens`` greedy tokens, stopping at EOS.

        An answer's last token was generated but not yet fed: it opens the next chunk, so every answer
        stays in the cache; where the answer ended with EOS and the next question opens with that token
        (a chat template's end of turn), the question's copy is dropped. Returns per question
        {'tokens': the answer, 'chunk': the tokens fed before it, 'fed': tokens fed through the cache so
        far, 'after': ``on_turn(cache)`` as the turn ends (the cache is live only inside this call)}."""
        eos, out, tokens = self.eos_ids(), [], []
        # every step runs eagerly (greedy() may replay CUDA graphs of its steps: equal to these to float rounding)
        with self._session(cache_config) as new_cache:
            cache, feed = new_cache(), self._feed(1)
            self._forward(feed, [list(context)], cache, last=True)
            for question in questions:
                chunk = list(question)
                if not (tokens and tokens[-1] in eos and chunk[:1] == tokens[-1:]):
                    chunk = tokens[-1:] + chunk
                logits = self._forward(feed, [chunk], cache, last=True)[0, -1]
                tokens = []
                while True:
                    tokens.append(int(logits.argmax()))
                    if tokens[-1] in eos or len(tokens) == max_new_tokens:
                        break
                    logits = self._forward(feed, [tokens[-1:]], cache, last=True)[0, -1]
                out.append({"tokens": tokens, "chunk": chunk, "fed": feed.seen[0], "after": on_turn(cache)})
        return out

    @torch.no_grad()
    def greedy(self, prompt: list[int] | list[list[int]], max_new_tokens: int, cache_config: CacheConfig | None,
               force: list[int] | list[list[int]] | str | None = None,
               prefill: int | list[int] | None = None, speed: RolloutClock | None = None,
               stop: Callable[[list[int]], bool] | None = None, keep_logits: bool = True) -> dict | list[dict]:
        """Prefill ``prompt`` (its tokens attend to each other natively), then decode greedily one
        token at a time through the cache, stopping at EOS, once ``stop(tokens so far)`` is true (a
        stop string: lm-eval's ``until``), or after ``max_new_tokens``.

        ``prefill``: prefill only the first ``prefill`` tokens (a batch: one count for all, or one per
        prompt); the rest of ``prompt`` then goes
        through the cache as one chunk (attending to the compressed prefix, the native window and
        itself), as kvpress compresses a context before its question arrives.
        ``force``: tokens to teacher-force, as one chunk, on a fork of the cache taken right after
        the prompt ("self": the tokens this call generated); their logits say how this cache
        scores that continuation. Returns {'tokens': [...], 'logits': [n, V] float32 of the
        generated steps, 'forced_logits': [len(force), V] or None, 'cache': the cache after
        generation}; 'logits' None with ``keep_logits`` False (the steps' [V] float32 logits are not kept on
        the device: a long batch's answers). ``speed``: a clock that times the first forward (the
        prefill) and the decode loop (every token after the first; the prompt's tail and the forced
        pass are in neither).

        A batch: ``prompt`` a list of prompts (any lengths: left-padded, see
        :mod:`adapters.cache.padded_batch`) and ``force`` None, "self" or one list per prompt. A finished
        sequence is fed padding until the last one finishes, so its cache holds what it holds
        alone. Returns one dict per prompt, each with the shared 'cache' and its 'sequence' index
        in it; every prompt's numbers are those it gets alone, to float rounding.
        """
        batched = bool(prompt) and isinstance(prompt[0], (list, tuple))
        prompts = [list(p) for p in prompt] if batched else [list(prompt)]
        B = len(prompts)
        if force is None or isinstance(force, str):
            if force not in (None, "self"):
                raise ValueError(f"force takes token ids or 'self', got '{force}'")
            forces = [force] * B
        else:
            forces = [list(f) for f in force] if batched else [list(force)]
        eos = self.eos_ids()
        ns = [len(p) for p in prompts] if prefill is None else (
            [prefill] * B if isinstance(prefill, int) else [int(n) for n in prefill])
        if len(ns) != B or not all(0 < n <= len(p) for n, p in zip(ns, prompts)):
            raise ValueError(f"greedy: prefill {prefill} must give each prompt a count in [1, its length] "
                             f"(lengths {[len(p) for p in prompts]})")
        clock = speed or OFF
        with self._session(cache_config, decodes=max_new_tokens > 1) as new_cache:
            cache = new_cache()
            feed = self._feed(B)
            clock.start(B, self.devices)
            out = self._forward(feed, [p[:n] for p, n in zip(prompts, ns)], cache, last=True, clock=clock)
            last = [out[b, -1] for b in range(B)]
            rest = [p[n:] for p, n in zip(prompts, ns)]
            if any(rest):  # the prompt's tail goes through the cache as one chunk (kvpress: the question)
                out = self._forward(feed, rest, cache, last=True)
                last = [out[b, -1] if rest[b] else last[b] for b in range(B)]
            logits = [[last[b]] for b in range(B)]
            branch = None
            if force is not None:
                branch = (cache.fork() if isinstance(cache, CompressedCache) else copy.deepcopy(cache), feed.fork())
            tokens: list[list[int]] = [[] for _ in range(B)]
            live, graph = list(range(B)), None
            clock.decode_start()
            for step in range(max_new_tokens):
                if graph is None:
                    picks = torch.stack([logits[b][-1] for b in live]).argmax(-1).tolist()
                else:  # the argmax of the same logits, taken in the graph
                    picks = graph.picks
                for b, t in zip(live, picks):
                    tokens[b].append(t)
                live = [b for b in live if tokens[b][-1] not in eos and step < max_new_tokens - 1
                        and not (stop is not None and stop(tokens[b]))]
                if graph is not None and len(live) < B:  # a sequence ended: the rest are fed padding, eagerly
                    clock.captured(graph.capture_s)
                    feed.advance(graph.close())
                    graph = None
                if not live:
                    break
                if graph is None and len(live) == B and not feed.padded:
                    graph = self._graphed(cache, [t[-1] for t in tokens], max_new_tokens - 1 - step)
                if graph is not None:
                    out = graph.step()[:, None]
                else:
                    out = self._forward(feed, [tokens[b][-1:] if b in live else [] for b in range(B)], cache, last=True)
                for b in live:
                    logits[b].append(out[b, -1])
                    if not keep_logits:  # the first (a forced pass starts from it) and the last
                        del logits[b][1:-1]
            if graph is not None:
                clock.captured(graph.capture_s)
                feed.advance(graph.close())
            clock.decode_done(sum(max(len(t) - 1, 0) for t in tokens))
            forced = [None] * B
            if force is not None:
                pieces = [(tokens[b] if forces[b] == "self" else forces[b])[:-1] for b in range(B)]
                f = self._forward(branch[1], pieces, branch[0]) if any(pieces) else None
                for b, piece in enumerate(pieces):
                    forced[b] = logits[b][0][None]
                    if piece:
                        forced[b] = torch.cat([forced[b], f[b, f.shape[1] - len(piece):]], 0)
            clock.stop()
        out = [{"tokens": tokens[b], "logits": torch.stack(logits[b][:len(tokens[b])]) if keep_logits else None,
                "forced_logits": forced[b],
                "cache": cache, "sequence": b} for b in range(B)]
        return out if batched else {k: v for k, v in out[0].items() if k != "sequence"}
