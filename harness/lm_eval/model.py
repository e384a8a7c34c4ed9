"""lm-eval model ``kvcodec``: lm-evaluation-harness tasks through the compressed KV cache.

``harness lm-eval --model kvcodec --model_args pretrained=DIR,codec=octopus,bits=3 --tasks T`` (or
``lm_eval --model kvcodec`` after ``import harness.lm_eval.model``). ``model_args``:

  pretrained   a local checkpoint folder or a ``.gguf`` file (loaded as ``harness run --model hf``
               loads it: :func:`adapters.hf.models.load_checkpoint`)
  codec, bits  the key codec and its bit width (``codec=none``: the native cache; bits not needed)
  value_bits   value bit width (default: bits)     residual  native window in tokens (default 32)
  protect      none | boundary-1 | layer indices joined by ':' (e.g. 0:23; model_args are split on ',')
  codec_seed   the codec's own seed (rotations, projections)
  chunk        tokens per teacher-forced chunk after the prefill (default 64)
  prefill_chunk  a context longer than N tokens is prefilled in pieces of N, natively, then committed, in every
               request type (``harness run --prefill-chunk``; auto, the default: contexts up to 32,768 tokens
               in one piece, longer ones in the largest piece free memory holds for the model's max length)
  device, dtype  as ``harness run`` takes them (auto: cuda + bfloat16 where available, else cpu + float32)
  graphs       auto (decode steps from CUDA graphs on CUDA where the cache allows) | static | off (eager)
  batch_size   (lm-eval's ``--batch_size``) requests run together through one cache, left-padded
               (:mod:`adapters.cache.padded_batch`): every answer is the one it gets alone, to float
               rounding; a number ('auto' is not supported)

Each is checked before the checkpoint loads as ``harness run`` checks its flag (:func:`check_args`: the run's
typed configuration, its checks and their words), the argument named as it is here; a ``residual`` that holds
all of the model's positions is refused, as ``harness run`` refuses it, and so is an evaluation where no rollout
committed a token to the codec (:func:`check_compressed`). lm-eval's options that act on a loaded model
(``max_length``, ``truncation``, ``add_bos_token``, ...: :data:`~harness.lm_eval.args.HFLM_OPTIONS`) pass on to
HFLM; any other key, a misspelt one or one of HFLM's own loading (``revision``, ``peft``, ``trust_remote_code``),
is refused in one line (:func:`~harness.lm_eval.args.check_keys`): the harness never runs a model folder's code.

How each request type meets the cache:

- ``generate_until``: the context is prefilled (plain attention: nothing is cached yet), then
  decoded through the :class:`~adapters.hf.cache.CompressedCache`; tokens are encoded as they leave
  the native window, so every decode step reads the compressed context. A greedy request (lm-eval's
  default, on a model whose generation config adds no logits processor such as a repetition penalty) is decoded by :meth:`~adapters.hf.causal_lm.CausalLM.greedy`, whose steps are replayed
  from a CUDA graph on CUDA, stopping at EOS or at the first of its ``until`` strings; in a batch a
  finished request is fed padding, so its statistics count its own tokens only. Sampling requests go
  through ``model.generate`` (its steps replayed from a graph too where the batch is unpadded), which
  keeps feeding a finished request (its pad token, unmasked) until the batch is done, so that
  request's cache statistics count those tokens too.
- ``loglikelihood``: the context is prefilled into the cache, then the continuation is
  teacher-forced in chunks of ``chunk`` tokens, each attending to the compressed past + the
  native window + itself (:meth:`~adapters.hf.models.CausalLM.teacher_force`). The first
  continuation token is scored from the prefill's last logit. The prefill of a context shared
  by several requests (multiple choice) is computed once and replayed into each cache.
- ``loglikelihood_rolling``: lm-eval's rolling windows, each scored as above: its one-token
  context (the prefix token, or the previous window's last token) is the native first chunk,
  then the window is teacher-forced in chunks through the cache.

With ``codec=none`` every answer is what ``--model hf`` gives on the same checkpoint (the same
log-likelihoods to float rounding, the same is_greedy, the same generations): the tests check.
Log-probabilities are computed in float32.

Cache statistics (true key and value bits per coordinate, cache bytes, committed tokens, from
:func:`adapters.cache.stats.cache_row_stats` of each rollout's cache, averaged over the rollouts
that committed tokens to the codec) and the exact cache and codec configuration go into
``results["config"]["kvcodec"]`` (lm-eval's ``get_model_info``); ``harness lm-eval`` moves them
to the top-level ``kvcodec`` key of the results JSON that lm-eval writes.

lm-eval is an optional extra (``pip install '.[lm-eval]'``): only this module imports it.
"""
from __future__ import annotations

import sys
from collections import Counter

import torch
import torch.nn.functional as F
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM
from tqdm import tqdm

from adapters.cache.stats import cache_row_stats
from adapters.hf.attach import attach
from adapters.hf.compat import cache_kwargs
from adapters.hf.models import load_checkpoint
from adapters.cache.config import DEFAULT_RESIDUAL

from harness.lm_eval.args import MODEL_NAME, check_args
from harness.run.checks import check_window
from harness.run.config import RunConfig

STAT_FIELDS = ("bits_per_coord", "value_bits_per_coord", "cache_bits_per_coord", "cache_bytes",
               "uncompressed_bytes", "compressed_bytes", "committed_tokens")


def check_compressed(summary: dict) -> str | None:
    """A finished evaluation's ``kvcodec`` statistics (:meth:`KVCodecLM.kvcodec_summary`): ValueError in one line
    where a compressing cache committed no token in any rollout (every context fit the native window, so the
    scores are the native cache's under the codec's name); a note where only some rollouts committed none."""
    if summary["cache_config"]["codec"] == "none":
        return None
    done, none = summary["rollouts_with_committed_tokens"], summary["rollouts_without_committed_tokens"]
    residual = summary["cache_config"]["residual"]
    if done == 0 and none:  # no rollout at all (every answer from lm-eval's cache): nothing was measured either way
        raise ValueError(f"model '{MODEL_NAME}': none of the {none} rollouts committed a token to the codec (every "
                         f"context was shorter than what the cache commits at once: the native window of "
                         f"residual={residual} tokens, or the codec's block), so these would be the native cache's "
                         f"scores; pass a smaller residual= or tasks with longer contexts")
    if none:
        return (f"note: {none} of {done + none} rollouts committed no token to the codec (their contexts fit the "
                f"native window of residual={residual}); their answers are the native cache's")
    return None


def chunk_plan(n_context: int, n_scored: int, chunk: int) -> list[int]:
    """Chunk sizes for an input of ``n_context`` prefilled tokens then ``n_scored`` teacher-forced ones."""
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    return [n_context] + [min(chunk, n_scored - i) for i in range(0, n_scored, chunk)]


@register_model(MODEL_NAME)
class KVCodecLM(HFLM):
    """lm-eval's HF model with every request run through a compressed KV cache (module docstring)."""

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None):
        from lm_eval.utils import simple_parse_args_string

        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None):
        """lm-eval's constructor: ``model_args`` and its own options (batch_size, device), checked
        (:func:`check_args`, by ``__init__``) before the checkpoint loads; one given twice is refused."""
        extra = {k: v for k, v in (additional_config or {}).items() if v is not None}
        twice = sorted(set(arg_dict) & set(extra) - {"batch_size"})
        if "batch_size" in arg_dict and str(extra.get("batch_size", 1)) != "1":  # lm-eval's default is 1
            twice.append("batch_size")
        if twice:
            raise ValueError(f"model '{MODEL_NAME}': {', '.join(twice)} given both in --model_args and as lm-eval's "
                             f"own option; give each once")
        return cls(**{**extra, **arg_dict})

    def __init__(self, pretrained: str | None = None, codec: str = "none", bits: int | None = None,
                 value_bits: int | None = None, residual: int = DEFAULT_RESIDUAL, protect="none", codec_seed: int = 0,
                 chunk: int = 64, device: str | None = "auto", dtype="auto", batch_size=1, graphs: str = "auto",
                 prefill_chunk="auto", **kwargs):
        """Every argument checked first (:func:`check_args`; ``pretrained`` None: refused there, in one line)."""
        checked = check_args(dict(pretrained=pretrained, codec=codec, bits=bits, value_bits=value_bits,
                                  residual=residual, protect=protect, codec_seed=codec_seed, chunk=chunk,
                                  device=device, dtype=dtype, batch_size=batch_size, graphs=graphs,
                                  prefill_chunk=prefill_chunk, **kwargs))
        kwargs.pop("trust_remote_code", None)  # False where given (check_args): the model is loaded already
        run = checked.run
        self.lm = load_checkpoint(pretrained, MODEL_NAME, run.device, checked.dtype, graphs=run.graphs)
        super().__init__(pretrained=self.lm.model, tokenizer=self.lm.tokenizer, batch_size=run.batch_size, **kwargs)
        self.pretrained_path = str(pretrained)
        if checked.cache.codec != "none":  # the length lm-eval cuts contexts to, known now (its default: the model's)
            try:
                check_window(checked.cache.residual, self.max_length, self.pretrained_path, "residual=")
            except ValueError as e:
                raise ValueError(f"model '{MODEL_NAME}': {e}") from None
        self.chunk = checked.options.chunk
        self.lm.prefill_chunk = _prefill_chunk(run, self.lm, self.max_length)
        self.cache_cfg = self.lm.cache_config(checked.cache)
        _, n_kv, head_dim = self.lm.geometry
        self.codec_json = {k: v for k, v in self.cache_cfg.codec_config(head_dim, n_kv).to_json().items() if k != "layer"}
        if self.cache_cfg.codec != "none":
            from kernels import make_codec

            make_codec(self.cache_cfg.codec_config(head_dim, n_kv))  # bits and geometry checked before any request
        self.rollout_stats: list[dict] = []
        self.rollouts = Counter()  # per request type
        self.uncommitted = 0  # rollouts whose tokens all stayed in the native window

    # --- the cache's statistics ---------------------------------------------------------------------
    def _record(self, kind: str, cache, sequence: int = 0) -> None:
        """The statistics of request ``sequence`` of the batch that ``cache`` ran."""
        self.rollouts[kind] += 1
        kv = cache.kv
        if self.cache_cfg.codec != "none" and not any(layer.seq_committed[sequence] for layer in kv.layers
                                                      if layer.codec is not None):
            self.uncommitted += 1
            return
        self.rollout_stats.append(cache_row_stats(kv, sequence))

    def kvcodec_summary(self) -> dict:
        """The cache configuration and the mean cache statistics over the rollouts that committed tokens."""
        n = len(self.rollout_stats)
        means = {f: sum(s[f] for s in self.rollout_stats) / n for f in STAT_FIELDS} if n else {}
        return {"cache_config": self.cache_cfg.to_json(), "codec_config": self.codec_json,
                "pretrained": self.pretrained_path, "chunk": self.chunk, "prefill_chunk": self.lm.prefill_chunk,
                "rollouts": dict(self.rollouts), "rollouts_with_committed_tokens": n,
                "rollouts_without_committed_tokens": self.uncommitted, "mean": means}

    def get_model_info(self) -> dict:
        """lm-eval's model info (read once the requests have run, before any score is printed or saved) with the
        cache's statistics; a ValueError where no rollout committed a token (:func:`check_compressed`)."""
        summary = self.kvcodec_summary()
        note = check_compressed(summary)
        if note:
            print(note, file=sys.stderr)
        return {**super().get_model_info(), MODEL_NAME: summary}

    # --- loglikelihood and loglikelihood_rolling ------------------------------------------------------
    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, override_bs=None) -> list[tuple[float, bool]]:
        """requests: (cache key or None, context ids, continuation ids) -> (sum of log p, is_greedy),
        ``batch_size`` requests at a time in the order given."""
        res = []
        bar = tqdm(total=len(requests), disable=disable_tqdm or self.rank != 0,
                   desc="Running loglikelihood requests (kvcodec)")
        for i in range(0, len(requests), self.batch_size):
            batch = requests[i:i + self.batch_size]
            for (request_str, _, _), answer in zip(batch, self._score([(c, x) for _, c, x in batch])):
                res.append(answer)
                if request_str is not None:  # rolling windows are cached per document by loglikelihood_rolling
                    self.cache_hook.add_partial("loglikelihood", request_str, answer)
            bar.update(len(batch))
        bar.close()
        return res

    def _score(self, requests: list[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        """Per (context, continuation): prefill the context, teacher-force continuation[:-1] in chunks;
        the logits from the context's last token on predict the continuation (truncated from the left
        as HFLM does). The requests run as one left-padded batch, each on its own chunk plan."""
        ids, plans, targets = [], [], []
        for context, continuation in requests:
            if not context or not continuation or len(continuation) > self.max_length:
                raise ValueError(f"loglikelihood needs a context and a continuation of 1..{self.max_length} tokens")
            x = (context + continuation)[-(self.max_length + 1):][:-1]
            ids.append(x)
            plans.append(chunk_plan(len(x) - (len(continuation) - 1), len(continuation) - 1, self.chunk))
            targets.append(torch.tensor(continuation, device=self.device))
        logp, greedy = [[] for _ in requests], [[] for _ in requests]

        def on_chunk(b: int, start: int, logits: torch.Tensor) -> None:  # logits [t, V] of ids[b][start:start + t]
            if start == 0:
                logits = logits[-1:]  # the context's last token predicts continuation[0]
            lp = F.log_softmax(logits.float(), dim=-1)
            tgt = targets[b][len(logp[b]):len(logp[b]) + lp.shape[0]]
            logp[b].extend(lp.gather(-1, tgt[:, None])[:, 0].tolist())
            greedy[b].extend((lp.argmax(-1) == tgt).tolist())

        cache = self.lm.teacher_force(ids, plans, self.cache_cfg, on_chunk)
        for b in range(len(requests)):
            self._record("loglikelihood", cache, b)
        return [(float(sum(lp)), all(g)) for lp, g in zip(logp, greedy)]

    # --- generate_until -------------------------------------------------------------------------------
    def _model_generate(self, context: torch.Tensor, max_length: int, stop: list[str], **generation_kwargs):
        """context [B, T] (left-padded, its attention_mask in ``generation_kwargs``): prefilled, then
        decoded through a compressed cache; greedy requests by :meth:`CausalLM.greedy`, others by
        ``model.generate`` (which reads the padding from the mask; an unpadded batch's steps graphed by
        :meth:`CausalLM.graphed_generate`), both graphed on CUDA where the cache allows. Returns [B, T + n]:
        the context, then each request's tokens, padded."""
        if _greedy(generation_kwargs) and _plain_greedy(self.model.generation_config):
            return self._greedy_generate(context, max_length, stop, generation_kwargs.get("attention_mask"))
        with attach(self.model) as new_cache:
            cache = new_cache(self.cache_cfg)
            # the prompt prefilled as greedy requests prefill it (in chunks where long), then graphed steps
            with self.lm.chunked_generate(cache), self.lm.graphed_generate(cache, max_length - context.shape[1] - 1):
                out = super()._model_generate(context, max_length, stop, **cache_kwargs(self.model, cache),
                                              **generation_kwargs)
        for b in range(context.shape[0]):
            self._record("generate_until", cache, b)
        return out


    def _greedy_generate(self, context: torch.Tensor, max_length: int, stop: list[str], mask) -> torch.Tensor:
        T = context.shape[1]
        keep = torch.ones_like(context) if mask is None else mask
        prompts = [[t for t, m in zip(row, ms) if m] for row, ms in zip(context.tolist(), keep.tolist())]
        decode = self.tokenizer.decode

        def stopped(tokens: list[int]) -> bool:  # lm-eval's stop strings, in the decoded answer so far
            text = decode(tokens)
            return any(s in text for s in stop)

        results = self.lm.greedy(prompts, max_length - T, self.cache_cfg, stop=stopped if stop else None,
                                 keep_logits=False)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eot_token_id
        out = context.new_full((context.shape[0], max_length), pad)
        out[:, :T] = context
        for b, r in enumerate(results):
            out[b, T:T + len(r["tokens"])] = torch.tensor(r["tokens"], dtype=out.dtype)
            self._record("generate_until", r["cache"], r["sequence"])
        return out


def _prefill_chunk(run: RunConfig, lm, max_length: int) -> int | None:
    """``prefill_chunk`` resolved as ``harness run`` resolves ``--prefill-chunk`` (:mod:`harness.run.memory_check`),
    for a batch of contexts of the model's ``max_length`` (lm-eval truncates every context to it)."""
    from harness.run.memory import TaskShape
    from harness.run.memory_check import resolve_chunk

    return resolve_chunk(run, [TaskShape(run.batch_size or 1, max_length, forced=True)],
                         lm.model.config.to_dict(), str(lm.device))


#: generation_config fields whose logits processors ``model.generate`` applies under greedy decoding too,
#: with their neutral values: a model that sets any other keeps ``model.generate`` (CausalLM.greedy takes
#: the plain argmax)
_PROCESSORS = {"repetition_penalty": (None, 1.0), "encoder_repetition_penalty": (None, 1.0),
               "no_repeat_ngram_size": (None, 0), "encoder_no_repeat_ngram_size": (None, 0),
               "bad_words_ids": (None,), "min_length": (None, 0), "min_new_tokens": (None, 0),
               "suppress_tokens": (None,), "begin_suppress_tokens": (None,), "forced_bos_token_id": (None,),
               "forced_eos_token_id": (None,), "exponential_decay_length_penalty": (None,),
               "sequence_bias": (None,), "renormalize_logits": (None, False), "logits_processor": (None,)}


def _plain_greedy(generation_config) -> bool:
    """Whether ``model.generate``'s greedy decoding under this config is the plain argmax (no logits
    processor: repetition penalty, suppressed tokens, ...)."""
    return all(getattr(generation_config, k, None) in neutral for k, neutral in _PROCESSORS.items())


def _greedy(generation_kwargs: dict) -> bool:
    """Whether lm-eval asks for plain greedy decoding (as ``HFLM._model_generate`` reads its
    arguments: no sampling, temperature 0 or unset, nothing else but the mask)."""
    kw = dict(generation_kwargs)
    kw.pop("attention_mask", None)
    temperature = kw.pop("temperature", 0.0)
    do_sample = kw.pop("do_sample", None)
    return not kw and not do_sample and (temperature == 0.0 or do_sample is False)
