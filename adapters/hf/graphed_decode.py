"""Greedy decode steps replayed from a CUDA graph: :class:`GraphedDecode`.

Eager, one decode step of a 7B transformers model is some 1,300 kernel launches, each dispatched
from Python, so the host sets the pace: issue #24's profile at 32k context measured 41-85 ms of
host time against 15-21 ms of kernels per step. A graph replays the step's kernels with one launch.

A rollout that generates greedily from an equal-length batch hands its :class:`CompressedCache`
(codec 'none' for the native baseline) to a ``GraphedDecode`` once every layer can take the static
layout (:func:`why_not`: e.g. once a short prompt's window has filled). Every layer then takes it
(:mod:`adapters.cache.static_kv`); the first step runs eagerly on a side stream (the warm-up compiles
kernels and allocates what a capture cannot: workspaces, counters, the device flags of the
non-finite check), the second is captured, and each step from then on is one replay of: the model's
forward of the last token, the argmax of its logits written to the next step's input, the positions
and lengths advanced on the device. Nothing in it syncs; the caller reads the picks, one sync per
token, to stop at EOS. :meth:`GraphedDecode.close` hands the layers back to the eager cache.

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
import warnings

import torch

from kernels.attention import decide_attention

from transformers.modeling_outputs import CausalLMOutputWithPast

from adapters.hf.cache import CompressedCache, CompressedLayer
from adapters.hf.compat import cache_kwargs, takes_keyword
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
        if not isinstance(layer, CompressedLayer):
            return f"layer {i} is transformers' own cache layer (a sliding window, or its quantized cache)"
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


class GraphedDecode:
    """The next ``steps`` greedy steps of ``cache`` (module docstring).

    ``ids``: the B tokens the first step feeds (one per sequence: the picks of the logits before it).
    :meth:`step` runs one step and returns its logits [B, V] float32; :attr:`picks` their argmax, the
    next step's input; :meth:`close` hands the cache back (call it before reading the cache)."""

    def __init__(self, model, cache: CompressedCache, ids: list[int], steps: int, capture: bool = True):
        why = why_not(model, cache, steps, capture)
        if why is not None:
            raise ValueError(f"graphed decode: {why}")
        self.model, self.cache, self.capture, self.steps = model, cache, capture, steps
        dev = model.device
        kvs = [layer.kv for layer in cache.layers]
        committed = next((kv.committed for kv in kvs if kv.codec is not None), 0)
        self.counters = StaticCounters(len(ids), committed, kvs[0].columns, cache.kv.config.residual, dev)
        try:
            for layer in cache.layers:
                path = None if layer.kv.codec is None else _decode_path(model, layer)
                layer.static = StaticKV(layer.kv, self.counters, steps, path)
        except BaseException:  # the layers built so far go back to the eager cache as they were
            self.taken = 0
            self.close()
            raise
        self.ids = torch.as_tensor(ids, dtype=torch.long).to(dev).reshape(-1, 1).clone()  # [B, 1]: the next input
        self._keep = {"logits_to_keep": 1} if takes_keyword(model, "logits_to_keep") else {}
        self.taken = 0
        self._graph = None
        self._logits: torch.Tensor | None = None  # the captured step's output

    def _run(self) -> torch.Tensor:
        """One step from the static buffers: logits [B, V] float32; the argmax becomes the next input."""
        out = self.model(self.ids, position_ids=self.counters.positions, use_cache=True,
                         **cache_kwargs(self.model, self.cache), **self._keep)
        logits = out.logits[:, -1].float()
        self.ids.copy_(logits.argmax(-1, keepdim=True))
        self.counters.advance()
        return logits

    def step(self, feed: torch.Tensor | None = None) -> torch.Tensor:
        """Run the next step; its logits [B, V] float32 (a tensor of the caller's). ``feed`` [B, 1]
        (on the device): the step's input tokens, in place of the last step's argmax (a sampler's
        picks). A step that raises hands the cache back (:meth:`close`) first."""
        if self.taken >= self.steps:
            raise RuntimeError(f"graphed decode: all {self.steps} steps taken")
        try:
            if feed is not None:  # on the current stream, before the replay reads it (no sync)
                self.ids.copy_(feed.reshape(self.ids.shape))
            return self._step()
        except BaseException:  # the failed step is not counted (the rollout's cache is not to be trusted)
            self.taken -= 1
            for layer in self.cache.layers:
                layer.pending = None
            self.close()
            raise

    def _step(self) -> torch.Tensor:
        self.taken += 1
        if not self.capture:
            return self._run()
        if self._graph is not None:
            self._graph.replay()
            return self._logits.clone()
        if self.taken == 1:  # the warm-up, eagerly on a side stream (as torch.cuda.graphs asks)
            side = torch.cuda.Stream(self.model.device)
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                logits = self._run()
            torch.cuda.current_stream().wait_stream(side)
            return logits
        self._graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(self._graph):  # recorded, not run: the replay below runs it
                self._logits = self._run()
        except RuntimeError as e:  # an operation a capture cannot take (nothing of the step ran)
            self._graph, self.capture = None, False
            for layer in self.cache.layers:
                layer.pending = None
            _warn_once(f"graphed decode: a step could not be captured in a CUDA graph ({str(e).splitlines()[0]}); "
                       f"this rollout's steps run eagerly in the static layout")
            return self._run()
        self._graph.replay()
        return self._logits.clone()

    @property
    def picks(self) -> list[int]:
        """The argmax of the last step's logits per sequence (one sync)."""
        return self.ids[:, 0].tolist()

    def close(self) -> int:
        """Hand every layer back to the eager cache; returns the steps taken."""
        for layer in self.cache.layers:
            if layer.static is not None:
                layer.static.write_back(self.taken)
                layer.static = None
        self._graph = self._logits = None
        return self.taken


class GraphedForward:
    """``with GraphedForward(model, cache, steps, capture): model.generate(..., cache=cache)``: the
    single-token decode steps each ``generate`` call makes through ``cache`` (at most ``steps`` of them)
    are answered from a :class:`GraphedDecode` once :func:`why_not` lets them (asked again at each step
    until then); the model's forward runs every other call, after the graph hands the cache back. The
    model's ``forward`` and ``generate`` are replaced on the instance inside the block and restored on
    leaving it; each ``generate`` call hands the cache back as it returns (``generate`` reads the
    cache's length between calls)."""

    def __init__(self, model, cache: CompressedCache, steps: int, capture: bool = True):
        self.model, self.cache, self.steps, self.capture = model, cache, steps, capture
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
                self.graph = GraphedDecode(self.model, self.cache, ids[:, 0], left, self.capture)
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
