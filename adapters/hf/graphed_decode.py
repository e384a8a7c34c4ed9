"""Greedy decode steps replayed from a CUDA graph: :class:`GraphedDecode`.

Eager, one decode step of a 7B transformers model is some 1,300 kernel launches, each dispatched
from Python, so the host sets the pace: issue #24's profile at 32k context measured 41-85 ms of
host time against 15-21 ms of kernels per step. A graph replays the step's kernels with one launch.

A rollout that generates greedily from an equal-length batch hands its :class:`CompressedCache`
(codec 'none' for the native baseline) to a ``GraphedDecode`` once every layer can take the static
layout (:func:`why_not`: e.g. once a short prompt's window has filled). Every layer's tokens are then
copied into buffers of the static layout (:mod:`adapters.cache.static_kv`), kept with the step captured
over them in a :class:`DecodeGraphs` pool, per configuration and batch shape (:func:`_key`) and capacity
(:func:`bucket`), across the process's rollouts. The first step a pooled graph ever takes runs eagerly on
a side stream (the warm-up compiles kernels and allocates what a capture cannot: workspaces, the device
flags of the non-finite check), the second is captured; every later step, of this rollout or a later one
that fits, is one replay of: the model's forward of the last token, the argmax of its logits written to
the next step's input, the positions and lengths advanced on the device. Nothing in it syncs; the caller
reads the picks, one sync per token, to stop at EOS. :meth:`GraphedDecode.close` hands the steps' tokens
back to the rollout's eager cache.

``capture=False`` runs every step eagerly in the static layout (the same kernels a replay runs, so
the same bytes: the check that a replay equals its eager step) and works on any device.

``model.generate`` through our cache: :class:`GraphedForward` stands in for the model's forward while
``generate`` runs, and answers its single-token decode steps from a ``GraphedDecode`` fed the tokens
``generate`` picked (sampling, logits processors and stopping stay ``generate``'s, eager, on the logits
the replay returns); every other call (the prefill, a padded batch, a cache the graph refuses) goes
to the model's own forward.
"""
from __future__ import annotations

import functools
import json
import warnings

import torch

from kernels.attention import decide_attention

from transformers.modeling_outputs import CausalLMOutputWithPast

from adapters.hf.cache import CompressedCache, CompressedLayer
from adapters.hf.compat import cache_kwargs, takes_keyword
from adapters.hf.library_layer import is_library_layer
from adapters.cache.rollout_clock import wall
from adapters.cache.static_kv import StaticCounters, StaticKV
from adapters.cache.static_kv import why_not as layer_why_not

_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


#: at least this many steps left to generate, or building a graph does not pay (a warm-up and a capture)
MIN_STEPS = 4


def why_not(model, cache, steps: int, capture: bool = True) -> str | None:
    """None when ``cache`` (after a prefill, before a decode step) can decode its next ``steps``
    single-token steps graphed, else the first reason it cannot (some pass after more eager steps)."""
    if capture and model.device.type != "cuda":
        return "CUDA graphs need a CUDA device"
    if steps < MIN_STEPS:
        return f"{steps} steps left (a graph pays from {MIN_STEPS})"
    if not isinstance(cache, CompressedCache):
        return "not a CompressedCache (the native baseline graphs through codec 'none')"
    if getattr(model.config.get_text_config(decoder=True), "attn_logit_softcapping", None) is not None:
        return "attention logit soft-capping (the fused kernels do not cap)"
    for i, layer in enumerate(cache.layers):
        if is_library_layer(layer):
            return (f"layer {i} is transformers' own quantized cache layer (hf-quanto, hf-hqq: its tensors grow "
                    f"in transformers' layer object, on the host's schedule, so these codecs decode eagerly)")
        if not isinstance(layer, CompressedLayer):
            return f"layer {i} is transformers' own cache layer (a sliding window)"
        why = layer_why_not(layer.kv)
        if why is not None:
            return f"layer {i}: {why}"
    # last: a scan of the parameters, reached once per rollout (the checks above refuse the steps before)
    if len({p.device for p in model.parameters()}) > 1:
        return "the model is spread over several devices (device_map): one graph captures one device's work"
    return None


def _decode_path(model, layer: CompressedLayer) -> str:
    kv = layer.kv
    q = torch.empty(len(kv.seq_window), model.config.get_text_config(decoder=True).num_attention_heads, 1,
                    kv.codec.head_dim, dtype=model.dtype, device="meta")
    return decide_attention(q, kv.codec, kv.window_k.shape[1], kv.config.backend, device=model.device).path


def _key(model, cache: CompressedCache) -> tuple:
    """What a captured step depends on besides the lengths: the batch, each layer's codec and decode path,
    the window, the model's dtype and device (two rollouts of one key can share a graph)."""
    layers = tuple(None if layer.kv.codec is None else (json.dumps(layer.kv.codec.config.to_json(), sort_keys=True),
                                                        _decode_path(model, layer)) for layer in cache.layers)
    return (len(cache.layers[0].kv.seq_window), cache.kv.config.residual, str(model.dtype), str(model.device), layers)


def _need(cache: CompressedCache, steps: int) -> int:
    """Tokens a layer's buffers must hold for ``steps`` more steps of ``cache``."""
    return max((kv.seq_window[0] if kv.codec is None else kv.committed) + steps
               for kv in (layer.kv for layer in cache.layers))


def bucket(tokens: int) -> int:
    """A capacity for ``tokens``: rounded up to an eighth of its power of two, so rollouts of nearly one
    length (a task's prompts of one context) share buffers and a graph, and a capacity wastes at most 1/8."""
    step = max(1, 1 << max(tokens.bit_length() - 4, 0))
    return -(-tokens // step) * step


class _Graph:
    """The buffers of every layer, the counters, the input ids, and the step captured over them: what
    rollouts of one key share (:class:`DecodeGraphs`)."""

    def __init__(self, model, cache: CompressedCache, capacity: int):
        dev = model.device
        self.capacity = capacity
        codec = next((layer.kv.codec for layer in cache.layers if layer.kv.codec is not None), None)
        self.counters = StaticCounters(len(cache.layers[0].kv.seq_window), cache.kv.config.residual, dev,
                                       1 if codec is None else codec.token_block)
        self.statics = [StaticKV(layer.kv, self.counters, capacity,
                                 None if layer.kv.codec is None else _decode_path(model, layer))
                        for layer in cache.layers]
        self.ids = torch.zeros(len(cache.layers[0].kv.seq_window), 1, dtype=torch.long, device=dev)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: torch.Tensor | None = None  # the captured step's output
        self.warmed = False  # a step has run eagerly on these buffers (what a capture needs first)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for s in self.statics for t in vars(s).values()
                   if isinstance(t, torch.Tensor))


class DecodeGraphs:
    """Captured decode steps kept for a process's rollouts: the last ``size`` keys' graphs and buffers.

    A graph is captured once per key (configuration and batch shape) and capacity (:func:`bucket`), and
    every later rollout of that key that fits replays it after copying its cache in, so a short answer
    decodes at the steady-state rate. ``capture_s`` sums the seconds spent warming up and capturing."""

    def __init__(self, size: int = 4):
        self.size = size
        self._graphs: dict[tuple, _Graph] = {}
        self.capture_s = 0.0

    def take(self, key: tuple, need: int) -> _Graph | None:
        g = self._graphs.pop(key, None)
        if g is not None and g.capacity < need:
            g = None  # too small: its buffers go
        return g

    def give(self, key: tuple, g: _Graph) -> None:
        self._graphs[key] = g  # the most recent last
        while len(self._graphs) > self.size:
            self._graphs.pop(next(iter(self._graphs)))

    def clear(self) -> None:
        self._graphs.clear()


class GraphedDecode:
    """The next ``steps`` greedy steps of ``cache`` (module docstring).

    ``ids``: the B tokens the first step feeds (one per sequence: the picks of the logits before it).
    :meth:`step` runs one step and returns its logits [B, V] float32; :attr:`picks` their argmax, the
    next step's input; :meth:`close` hands the cache back (call it before reading the cache). ``pool``:
    where captured steps are kept across rollouts (None: this rollout's own, captured for it and dropped).
    ``capture_s``: this rollout's seconds of warm-up and capture (none where it replayed a kept graph)."""

    def __init__(self, model, cache: CompressedCache, ids: list[int], steps: int, capture: bool = True,
                 pool: DecodeGraphs | None = None):
        why = why_not(model, cache, steps, capture)
        if why is not None:
            raise ValueError(f"graphed decode: {why}")
        self.model, self.cache, self.capture, self.steps, self.pool = model, cache, capture, steps, pool
        need = _need(cache, steps)
        self.key = _key(model, cache) if pool is not None else None
        g = pool.take(self.key, need) if pool is not None else None
        if g is None:
            g = _Graph(model, cache, bucket(need) if pool is not None else need)
        self.g = g
        self.capture_s = 0.0
        kvs = [layer.kv for layer in cache.layers]
        coded = next((kv for kv in kvs if kv.codec is not None), None)  # every codec layer holds as many tokens
        g.counters.load(0 if coded is None else coded.committed, kvs[0].columns,
                        None if coded is None else coded.seq_window[0])
        for layer, static in zip(cache.layers, g.statics):
            static.load(layer.kv)
            layer.static = static
        g.ids.copy_(torch.as_tensor(ids, dtype=torch.long).reshape(-1, 1))  # [B, 1]: the next input
        self._keep = {"logits_to_keep": 1} if takes_keyword(model, "logits_to_keep") else {}
        self.taken = 0

    @property
    def ids(self) -> torch.Tensor:
        return self.g.ids

    @property
    def counters(self) -> StaticCounters:
        return self.g.counters

    def _run(self) -> torch.Tensor:
        """One step from the static buffers: logits [B, V] float32; the argmax becomes the next input."""
        g = self.g
        out = self.model(g.ids, position_ids=g.counters.positions, use_cache=True,
                         **cache_kwargs(self.model, self.cache), **self._keep)
        logits = out.logits[:, -1].float()
        g.ids.copy_(logits.argmax(-1, keepdim=True))
        g.counters.advance()
        return logits

    def step(self, feed: torch.Tensor | None = None) -> torch.Tensor:
        """Run the next step; its logits [B, V] float32 (a tensor of the caller's). ``feed`` [B, 1]
        (on the device): the step's input tokens, in place of the last step's argmax (a sampler's
        picks). A step that raises hands the cache back (:meth:`close`) first."""
        if self.taken >= self.steps:
            raise RuntimeError(f"graphed decode: all {self.steps} steps taken")
        try:
            if feed is not None:  # on the current stream, before the replay reads it (no sync)
                self.g.ids.copy_(feed.reshape(self.g.ids.shape))
            return self._step()
        except BaseException:  # the failed step is not counted (the rollout's cache is not to be trusted)
            self.taken -= 1
            for layer in self.cache.layers:
                layer.pending = None
            self.close()
            raise

    def _step(self) -> torch.Tensor:
        self.taken += 1
        g = self.g
        if not self.capture:
            return self._run()
        if g.graph is not None:
            g.graph.replay()
            return g.logits.clone()
        t0 = wall([self.model.device])
        try:
            if not g.warmed:  # the warm-up, eagerly on a side stream (as torch.cuda.graphs asks)
                side = torch.cuda.Stream(self.model.device)
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    logits = self._run()
                torch.cuda.current_stream().wait_stream(side)
                g.warmed = True
                return logits
            g.graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(g.graph):  # recorded, not run: the replay below runs it
                    g.logits = self._run()
            except RuntimeError as e:  # an operation a capture cannot take (nothing of the step ran)
                g.graph, self.capture = None, False
                for layer in self.cache.layers:
                    layer.pending = None
                _warn_once(f"graphed decode: a step could not be captured in a CUDA graph ({str(e).splitlines()[0]}); "
                           f"this rollout's steps run eagerly in the static layout")
                return self._run()
            g.graph.replay()
            return g.logits.clone()
        finally:  # a warm-up or a capture: timed apart from the steps (two syncs, at most twice per graph)
            spent = wall([self.model.device]) - t0
            self.capture_s += spent
            if self.pool is not None:
                self.pool.capture_s += spent

    @property
    def picks(self) -> list[int]:
        """The argmax of the last step's logits per sequence (one sync)."""
        return self.g.ids[:, 0].tolist()

    def close(self) -> int:
        """Hand every layer back to the eager cache; returns the steps taken. The buffers and the graph go
        back to the pool (or are dropped, without one)."""
        for layer in self.cache.layers:
            if layer.static is not None:
                layer.static.unload(layer.kv, self.taken)
                layer.static = None
        if self.pool is not None and self.g is not None:
            self.pool.give(self.key, self.g)
        self.g = None
        return self.taken


class GraphedForward:
    """``with GraphedForward(model, cache, steps, capture): model.generate(..., cache=cache)``: the
    single-token decode steps each ``generate`` call makes through ``cache`` (at most ``steps`` of them)
    are answered from a :class:`GraphedDecode` once :func:`why_not` lets them (asked again at each step
    until then); the model's forward runs every other call, after the graph hands the cache back. The
    model's ``forward`` and ``generate`` are replaced on the instance inside the block and restored on
    leaving it; each ``generate`` call hands the cache back as it returns (``generate`` reads the
    cache's length between calls)."""

    def __init__(self, model, cache: CompressedCache, steps: int, capture: bool = True,
                 pool: DecodeGraphs | None = None):
        self.model, self.cache, self.steps, self.capture, self.pool = model, cache, steps, capture, pool
        self.key = next(iter(cache_kwargs(model, cache)))  # the keyword the forward takes the cache under
        self.graph: GraphedDecode | None = None
        self.calls = 0  # decode steps seen, over the block
        self.replayed = 0  # of which answered from the graph
        self._first = 0  # the first of this generate call's steps
        self._busy = False

    def __enter__(self) -> GraphedForward:
        self._own = {name: vars(self.model).get(name) for name in ("forward", "generate")}  # accelerate's hooks
        self._forward, generate = self.model.forward, self.model.generate
        # generate reads the forward's signature (whether it takes position_ids, logits_to_keep): keep it
        self.model.forward = functools.wraps(self._forward)(lambda *args, **kw: self._step(*args, **kw))

        def generate_then_hand_back(*args, **kw):
            self._first = self.calls
            try:
                return generate(*args, **kw)
            finally:
                self._hand_back()

        self.model.generate = functools.wraps(generate)(generate_then_hand_back)
        return self

    def __exit__(self, *exc) -> None:
        for name, own in self._own.items():
            if own is None:
                delattr(self.model, name)  # the class's method again
            else:
                setattr(self.model, name, own)
        self._hand_back()

    def _hand_back(self) -> None:
        if self.graph is not None:
            self.graph.close()
            self.graph = None

    def _is_step(self, args, kw) -> bool:
        """Whether a forward call is a decode step of our cache the graph could answer: one token per
        sequence by ``input_ids``, our cache, and nothing asked beyond the logits."""
        ids = kw.get("input_ids", args[0] if args else None)
        return (kw.get(self.key) is self.cache and isinstance(ids, torch.Tensor) and ids.dim() == 2
                and ids.shape[1] == 1 and kw.get("inputs_embeds") is None and not kw.get("output_attentions")
                and not kw.get("output_hidden_states") and kw.get("labels") is None)

    def _step(self, *args, **kw):
        if self._busy:  # the graph's own forward calls
            return self._forward(*args, **kw)
        if not self._is_step(args, kw):
            if kw.get(self.key) is self.cache:  # the cache goes back to eager layers first
                self._hand_back()
            return self._forward(*args, **kw)
        ids = kw.get("input_ids", args[0] if args else None)
        left, self.calls = self.steps - (self.calls - self._first), self.calls + 1
        if self.graph is not None and self.graph.taken >= self.graph.steps:  # more steps than announced
            self._hand_back()
        self._busy = True
        try:
            if self.graph is None and why_not(self.model, self.cache, left, self.capture) is None:
                self.graph = GraphedDecode(self.model, self.cache, ids[:, 0], left, self.capture, self.pool)
            if self.graph is None:
                return self._forward(*args, **kw)
            logits = self.graph.step(feed=ids)
        except BaseException:
            self.graph = None  # GraphedDecode hands the cache back when it fails
            raise
        finally:
            self._busy = False
        self.replayed += 1
        return CausalLMOutputWithPast(logits=logits[:, None], **{self.key: self.cache})
