"""The device memory a text run needs at its peak, planned before the model loads: :func:`plan_memory`.

A pure function of the checkpoint's config.json (:class:`ModelShape`: layers, heads, widths, vocabulary),
the dtype, the batch, the longest context, the tokens generated after it and the codecs' stored bytes
(:class:`CodecRate`, from each codec's own byte formula). It adds up what a run holds at each of its
moments and takes the largest:

- *prefill*: the weights, the native cache the prefill writes (the batch's longest context), and the
  activations of one chunk (:mod:`adapters.hf.prefill`): the MLP's three [B, chunk, intermediate]
  tensors (gate, up, their product), the residual stream, and, where a batch of several prompts may be padded,
  transformers' boolean mask [B, chunk, keys], the attention's additive copy of it and the keys and values
  repeated to every query head (sdpa takes grouped heads only without a mask; a causal chunk of an unpadded
  batch against its past has none: :mod:`adapters.hf.lower_right`), the growth of one layer's
  native cache (a concatenation: old and new alive), and the logits kept;
- *native rollout* (the baseline, codec 'none'): the shared prefill's native cache, held for the batch while
  every configuration replays it (:mod:`adapters.cache.shared_prefill`), plus the rollout's own copies of it:
  its decode writes new tensors (a concatenation, or a graphed decode's static buffers), the teacher-forced
  pass on a fork another, and a transformers cache forked on the CPU (a deep copy) a third;
- *codec rollout*: the shared native cache, the codec's stored bytes twice (the rollout's and its fork's,
  copied on write; a third time where the decode runs eagerly, whose first commit doubles the store), the
  decoded keys and values a read of the past keeps where the codec reads it decoded (``memo_decoded``: the
  teacher-forced pass's, and the decode's own where no fused kernel reads the codec: on the CPU, or a codec
  such as KIVI), the layers kept native as in a native rollout, and the attention of the teacher-forced pass.

The figures count tensors, not the allocator's rounding or fragmentation, nor CUDA's own context (outside
``torch.cuda.max_memory_allocated`` too): ``scripts/memory_plan_bench.py`` prints the plan beside a run's
measured peak. :func:`refusal` words a run that cannot fit in one line.
"""
from __future__ import annotations

from dataclasses import dataclass, field

GIB = 2 ** 30


@dataclass(frozen=True)
class ModelShape:
    """What a decoder's config.json says of its size (a multimodal config's ``text_config`` first)."""

    layers: int
    hidden: int
    intermediate: int
    q_heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool = False  # the output head is the embedding
    qkv_bias: bool = False
    window: int | None = None  # the sliding window of the layers that have one
    sliding: int = 0  # how many layers attend through it

    @classmethod
    def from_config(cls, cfg: dict) -> "ModelShape":
        text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg

        def get(key, default=None):
            v = text.get(key, cfg.get(key, default))
            return default if v is None else v

        layers, hidden, heads = int(get("num_hidden_layers")), int(get("hidden_size")), int(get("num_attention_heads"))
        kinds = get("layer_types") or []
        window = get("sliding_window") if (get("use_sliding_window", True) and get("sliding_window")) else None
        sliding = sum(k in ("sliding_attention", "chunked_attention") for k in kinds) if kinds else 0
        return cls(layers=layers, hidden=hidden, intermediate=int(get("intermediate_size", 4 * hidden)),
                   q_heads=heads, kv_heads=int(get("num_key_value_heads", heads)),
                   head_dim=int(get("head_dim", hidden // heads)), vocab=int(get("vocab_size")),
                   tied=bool(get("tie_word_embeddings", False)),
                   qkv_bias=bool(get("attention_bias", False)) or get("model_type") == "qwen2",
                   window=int(window) if window and sliding else None, sliding=sliding if window else 0)

    @property
    def params(self) -> int:
        """Parameters of a Llama-style decoder: attention (q, k, v, o and their biases), a gated MLP, two
        norms per layer; the embedding, the final norm and an output head unless tied."""
        q, kv = self.q_heads * self.head_dim, self.kv_heads * self.head_dim
        attn = self.hidden * (q + 2 * kv) + q * self.hidden + ((q + 2 * kv) if self.qkv_bias else 0)
        per_layer = attn + 3 * self.hidden * self.intermediate + 2 * self.hidden
        return self.layers * per_layer + self.vocab * self.hidden * (1 if self.tied else 2) + self.hidden

    def layer_token_bytes(self, dtype_bytes: int) -> int:
        """One token's native key and value in one layer (every KV head)."""
        return 2 * self.kv_heads * self.head_dim * dtype_bytes

    def native_bytes(self, batch: int, tokens: int, dtype_bytes: int, layers: int | None = None) -> int:
        """A native cache of ``tokens`` per sequence in ``layers`` of the full-attention layers (default all;
        the sliding ones hold their window)."""
        full = self.layers - self.sliding if layers is None else layers
        held = full * tokens + (self.sliding * min(tokens, self.window) if layers is None and self.window else 0)
        return batch * held * self.layer_token_bytes(dtype_bytes)


@dataclass(frozen=True)
class CodecRate:
    """A cache configuration's stored bytes: ``token_bytes`` per token of one codec layer (keys and values,
    every KV head), in ``codec_layers`` of the model's layers (the others native); ``decoded``: a read of
    several tokens keeps its layer decoded (``memo_decoded``)."""

    label: str
    token_bytes: float
    codec_layers: int
    decoded: bool
    block: int = 1
    fused: bool = True  # a fused decode kernel reads its states (graphed on CUDA where its block is 1)


@dataclass(frozen=True)
class TaskShape:
    """What a task's longest batch asks of memory: ``batch`` sequences of ``context`` tokens, ``new_tokens``
    generated after it, ``logit_columns`` of logits kept per sequence by a forward (1 where only the next
    token is read), ``forced``: a teacher-forced pass on a fork of the cache after the prompt."""

    batch: int
    context: int
    new_tokens: int = 0
    logit_columns: int = 1
    forced: bool = False


@dataclass
class MemoryPlan:
    """Bytes per item (in order) and per moment of the run; ``peak`` the largest moment."""

    items: dict[str, int] = field(default_factory=dict)
    moments: dict[str, int] = field(default_factory=dict)
    chunk: int | None = None

    @property
    def peak(self) -> int:
        return max(self.moments.values())

    @property
    def peak_moment(self) -> str:
        return max(self.moments, key=self.moments.get)


def chunk_activations(shape: ModelShape, e: int, batch: int, chunk: int, keys: int, masked: bool,
                      logit_columns: int) -> dict[str, int]:
    """Bytes alive while one forward of ``chunk`` columns reads ``keys`` keys (module docstring), by part."""
    B, c, s = batch, chunk, shape
    attn = 2 * B * c * (s.q_heads + 2 * s.kv_heads) * s.head_dim * e  # projections and their rotated copies
    if masked:
        attn += B * c * keys * (1 + e)  # the boolean mask and the attention's additive copy of it
        if s.q_heads > s.kv_heads:
            attn += 2 * B * s.q_heads * keys * s.head_dim * e  # keys and values repeated to every query head
    return {"stream": 2 * B * c * s.hidden * e, "layer": max(3 * B * c * s.intermediate * e, attn),
            "logits": B * min(logit_columns, c) * s.vocab * (e + 4)}


def plan_memory(shape: ModelShape, dtype_bytes: int, task: TaskShape, codecs: list[CodecRate],
                chunk: int | None = None, residual: int = 0, graphed: bool = True) -> MemoryPlan:
    """The plan of a run's text task at its longest batch (module docstring). ``chunk``: the prefill's
    pieces (None: one piece); ``residual``: the native window of codec layers; ``graphed``: decode steps
    from CUDA graphs where the cache allows (the baseline then decodes through codec 'none', whose fork shares
    tensors, where otherwise it deep-copies a transformers cache)."""
    e, B, T = dtype_bytes, task.batch, task.context
    total = T + task.new_tokens
    c = T if chunk is None or chunk >= T else chunk
    plan = MemoryPlan(chunk=None if c == T else c)
    weights = shape.params * e
    shared = shape.native_bytes(B, T, e)
    pre = chunk_activations(shape, e, B, c, T, masked=B > 1, logit_columns=task.logit_columns)
    grow = B * T * shape.layer_token_bytes(e)  # one layer's native cache concatenated: old and new alive
    plan.items = {"weights": weights, "native cache (the shared prefill)": shared,
                  "prefill chunk activations": sum(pre.values()) + grow}
    plan.moments["prefill"] = weights + shared + plan.items["prefill chunk activations"]
    # the teacher-forced pass (or a decode step): a few columns reading every key
    n = max(task.new_tokens, 1)
    fwd = chunk_activations(shape, e, B, n, total, masked=B > 1, logit_columns=n)
    copies = 1 + (1 if task.forced else 0) + (1 if task.forced and not graphed else 0)
    native = shape.native_bytes(B, total, e)
    plan.items[f"baseline rollout ({copies} cop{'y' if copies == 1 else 'ies'} of the native cache)"] = copies * native
    plan.moments["baseline rollout"] = weights + shared + copies * native + sum(fwd.values())
    for rate in codecs:
        window = (residual + rate.block) * shape.layer_token_bytes(e)  # at most a block past the window commits
        stored = int(B * rate.codec_layers * (total * rate.token_bytes + window))
        eager = not (graphed and rate.fused and rate.block == 1)  # decode steps that grow the store by doubling
        own = (1 + (1 if task.forced else 0) + (1 if eager and task.new_tokens else 0)) * stored
        decoded = shape.native_bytes(B, total, e, layers=rate.codec_layers)
        if rate.decoded:  # the forced pass's memo, and the decode's where no fused kernel reads the codec
            memos = (1 if task.forced else 0) + (1 if task.new_tokens and not (graphed and rate.fused) else 0)
            own += memos * decoded
        if graphed and not rate.fused and task.new_tokens:  # graphed steps keep keys and values decoded in float32
            own += decoded * 4 // e * 9 // 8  # (the eager memo dropped meanwhile), at a capacity up to 1/8 over
        kept_native = shape.layers - shape.sliding - rate.codec_layers
        own += (2 if task.forced else 1) * shape.native_bytes(B, total, e, layers=kept_native)
        scores = 3 * B * shape.q_heads * n * total * 4 if task.forced else 0  # float32 scores, softmax
        plan.items[f"{rate.label} cache"] = stored
        plan.moments[f"{rate.label} rollout"] = weights + shared + own + fwd["stream"] + fwd["logits"] + max(
            fwd["layer"], scores)
    return plan


def gib(n: float) -> str:
    """Bytes as the plan prints them: GiB to a tenth, or MiB below one GiB."""
    return f"{n / GIB:,.1f} GiB" if n >= GIB else f"{n / 2 ** 20:,.1f} MiB"


def plan_lines(plan: MemoryPlan, task: TaskShape, dtype: str, free: int | None, where: str) -> list[str]:
    """The plan as the run's header prints it: what it assumes, each item, the peak against what is free."""
    chunk = "one piece" if plan.chunk is None else f"chunks of {plan.chunk:,} tokens"
    head = (f"memory plan: {dtype}, batch {task.batch}, {task.context:,} tokens + {task.new_tokens:,} generated, "
            f"prefill in {chunk}")
    items = "; ".join(f"{name} {gib(n)}" for name, n in plan.items.items())
    peak = f"peak {gib(plan.peak)} ({plan.peak_moment})" + (f" of {gib(free)} free on {where}" if free else "")
    return [head, f"  {items}", f"  {peak}"]


def refusal(plan: MemoryPlan, free: int, where: str, fits: list[tuple[str, MemoryPlan]], spread: bool) -> str:
    """One line: what the run needs at its peak, what is free, and what makes it fit: ``fits`` (a flag and the
    plan it gives, each within ``free``), then GPUs enough for ``--device-map auto`` (or more of them)."""
    ways = [f"{flag} (peak {gib(p.peak)})" for flag, p in fits]
    ways.append(f"{'more GPUs' if spread else '--device-map auto over GPUs'} with {gib(plan.peak)} free in all")
    return (f"the run needs {gib(plan.peak)} at its peak ({plan.peak_moment}) and {gib(free)} is free on {where}; "
            f"to fit: {', or '.join(ways)}, or a shorter context")
