"""The ``model_args`` of lm-eval's ``kvcodec`` model (:mod:`harness.lm_eval.model`), checked before its
checkpoint loads: the ``harness run`` options among them by the run's typed configuration and checks, in their
words (:func:`check_args`); lm-eval's own options that act on a loaded model passed on; every other key refused
(:func:`check_keys`). Needs no lm-eval: the checks run before it is imported."""
from __future__ import annotations

import difflib
from dataclasses import dataclass, fields

import torch

from adapters.cache.config import CacheConfig
from registry.options import Allowed, option, read_options

from harness.run.checks import check_window
from harness.run.config import RunConfig

MODEL_NAME = "kvcodec"

#: the model_args (and lm-eval's own ``--batch_size``, ``--device``) that are ``harness run`` options -> the
#: RunConfig field each one sets: its declaration and :meth:`RunConfig.validate` check them as they check the
#: flag, in the same words, the option named as model_args name it
RUN_FIELDS = {"pretrained": "model_path", "codec": "codecs", "bits": "bits", "value_bits": "value_bits",
              "residual": "residual", "protect": "protect", "codec_seed": "codec_seeds", "device": "device",
              "dtype": "dtype", "batch_size": "batch_size", "graphs": "graphs", "prefill_chunk": "prefill_chunk"}
_LISTS = ("codecs", "bits", "codec_seeds")  # one value here, a list in the run's config
_ARG_NAMES = {field: arg for arg, field in RUN_FIELDS.items()}


@dataclass(frozen=True)
class Options:
    """The model_args of lm-eval alone (no ``harness run`` flag has them), declared as a codec's or a task's
    options are (:mod:`registry.options`)."""

    chunk: int = option(64, "tokens per teacher-forced chunk after the prefill", Allowed(lo=1))


@dataclass(frozen=True)
class ModelArgs:
    """model_args, checked (:func:`check_args`): the run configuration they describe (validated), the cache's
    configuration, lm-eval's own options, and the dtype as given (a torch.dtype from Python is taken as it is)."""

    run: RunConfig
    cache: CacheConfig
    options: Options
    dtype: object


def check_args(args: dict) -> ModelArgs:
    """Every ``model_args`` value (and lm-eval's ``--batch_size`` / ``--device``), checked before the checkpoint
    loads by the typed configuration ``harness run`` uses (:data:`RUN_FIELDS`: RunConfig's declarations and
    :meth:`~harness.run.config.RunConfig.validate`, then CacheConfig and the codec's ``Options``) and by
    :class:`Options`: a ValueError in one line, ``model 'kvcodec': `` and the CLI's own words with the argument
    named as here (``model option kvcodec.chunk=0: ...`` for :class:`Options`, which names the model itself).
    lm-eval reads 'none' as None: an argument given as none takes its default."""
    from adapters.cache.config import check_protect
    from adapters.hf.models import declared_shape
    from kernels import codec_class
    from kernels.config import check_bits

    args = {k: v for k, v in args.items() if v is not None}
    check_keys(args)
    pretrained = args.get("pretrained")
    if not pretrained:
        raise ValueError(f"model '{MODEL_NAME}' needs pretrained= in --model_args: a local checkpoint folder "
                         f"(config.json, tokenizer, *.safetensors) or a .gguf file")
    codec = args.get("codec") or "none"
    given = {field: args[arg] for arg, field in RUN_FIELDS.items() if arg in args}
    given.update({field: [given[field]] for field in _LISTS if field in given})
    if isinstance(given.get("batch_size"), str) and given["batch_size"].strip().isdigit():
        given["batch_size"] = int(given["batch_size"])  # lm-eval's --batch_size is text ('auto' too)
    if str(given.get("device", "")).startswith("cuda") and not torch.cuda.is_available():
        given["device"] = "auto"  # lm-eval's CLI default is cuda:0; --model hf falls back to the CPU too
    if isinstance(given.get("dtype"), torch.dtype):
        given["dtype"] = "auto"  # a torch.dtype from Python: taken as given (ModelArgs.dtype)
    config = RunConfig(**{"model": "hf", "batch_size": 1, "codec_seeds": [0], "bits": [16], **given,
                          "codecs": [] if codec == "none" else [codec], "baseline": codec == "none"})
    try:
        bits_supported = codec_class(str(codec)).bits_supported  # unknown codec -> "Unknown codec ... Available"
        if codec != "none" and "bits" not in args:
            raise ValueError(f"codec={codec} needs bits= ({', '.join(map(str, bits_supported))})")
        config.validate(lambda field: _ARG_NAMES.get(field, field))
        if codec != "none":
            check_bits(codec, config.bits[0])
        [cache] = config.cache_configs()
    except ValueError as e:
        raise ValueError(f"model '{MODEL_NAME}': {e}") from None
    own = {f.name: args[f.name] for f in fields(Options) if f.name in args}
    options = read_options("model", MODEL_NAME, Options, own, strings=False)  # names the model itself
    shape = declared_shape(pretrained, MODEL_NAME)  # the checkpoint's config (or GGUF header), no weights
    if shape.layers is not None:
        try:
            check_protect(cache.protect, shape.layers)
        except ValueError as e:
            raise ValueError(f"model '{MODEL_NAME}': protect={args.get('protect')}: {e} ({pretrained})") from None
    positions = [n for n in (shape.positions, _count(args.get("max_length"))) if n]  # lm-eval cuts to max_length
    if codec != "none" and positions:
        try:
            check_window(cache.residual, min(positions), pretrained, "residual=")
        except ValueError as e:
            raise ValueError(f"model '{MODEL_NAME}': {e}") from None
    return ModelArgs(config, cache, options, args.get("dtype", "auto"))


#: lm-eval's HFLM options that act on the model kvcodec has loaded: passed on to HFLM as they are
HFLM_OPTIONS = ("truncation", "logits_cache", "max_length", "softmax_dtype", "mixed_precision_dtype", "max_batch_size",
                "add_bos_token", "prefix_token_id", "think_end_token", "enable_thinking", "chat_template_args")
#: HFLM's options for loading a checkpoint itself, which kvcodec does (``pretrained=``): silently ignored by HFLM
#: once it is handed a model, so refused here rather than dropped
HFLM_LOADING = ("backend", "revision", "subfolder", "tokenizer", "use_fast_tokenizer", "parallelize",
                "max_memory_per_gpu", "max_cpu_memory", "offload_folder", "tp_plan", "peft", "delta", "autogptq",
                "gptqmodel", "gguf_file")


def known_keys() -> list[str]:
    """Every model_args key kvcodec takes, in the order its help lists them."""
    return [*RUN_FIELDS, *(f.name for f in fields(Options)), *HFLM_OPTIONS]


def check_keys(args: dict) -> None:
    """ValueError in one line for a model_args key kvcodec does not take: a misspelt one (``resdual=``) would
    otherwise be dropped and its default run; HFLM's loading options, which kvcodec's own loading replaces; and
    ``trust_remote_code``, as the harness never runs code from a model folder."""
    if args.get("trust_remote_code") not in (None, False, "False", "false"):
        raise ValueError(f"model '{MODEL_NAME}': trust_remote_code={args['trust_remote_code']}: the harness never "
                         f"runs code from a model folder; use a checkpoint of an architecture transformers has")
    known = known_keys()
    for key in args:
        if key in known or key == "trust_remote_code":
            continue
        if key in HFLM_LOADING:
            raise ValueError(f"model '{MODEL_NAME}': {key}= is an option of lm-eval's own loading, which kvcodec "
                             f"replaces (it loads pretrained= as harness run --model hf does); drop it")
        near = difflib.get_close_matches(key, known, n=1)
        hint = f"did you mean {near[0]}=? " if near else ""
        raise ValueError(f"model '{MODEL_NAME}': unknown model_args key {key}=; {hint}kvcodec takes "
                         f"{', '.join(known)}")


def _count(value) -> int | None:
    """A positive token count from lm-eval's text or a number (None for anything else: its own check says why)."""
    try:
        n = int(value)
    except (TypeError, ValueError):
        return None
    return n if n > 0 else None
