"""The run configuration: :class:`RunConfig`, the defaults, and the presets. Each field's annotation
declares its ``harness run`` flag (:mod:`harness.run.flags` has tyro generate the command line from them)."""
from __future__ import annotations

import functools
import hashlib
import math
import re
import typing
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Annotated, Callable, Literal

from tyro.conf import arg

from adapters.cache.config import DEFAULT_RESIDUAL, CacheConfig, parse_protect, protect_text
from kernels.backend import BACKENDS
from registry.versioned import VersionedJSON

from harness.run.flags import owner_options, parsed, values
from harness.run.rows import dumps

Backend = Literal[BACKENDS]

RUN_CONFIG_VERSION = 1
DEFAULT_MODEL = "smollm2-135m"
DEFAULT_CODECS = ("octopus", "turboquant-mse", "turboquant-prod", "qjl", "polarquant", "polarquant-2d", "quarot", "kivi")
DEFAULT_BITS = (2, 3, 4)
# how a codec's bit widths are chosen (codec_entries): said by --help, `harness list` and the README
WIDTHS = ("a bare NAME runs at the --bits it takes, or where it takes none of them at its own widths (a note line "
          "says so: --codec vllm-fp8 runs at 8); NAME@B[,B...] runs at exactly those widths, and one it does not "
          "take is an error before the model loads")
#: three draws of every randomized codec: enough for the interval to see seed-to-seed spread
DEFAULT_CODEC_SEEDS = (0, 1, 2)
#: ``--batch-size`` left out, per device type. CPU: 8 (a CPU gains little from larger batches, and
#: every sequence's logits and cache sit in host memory). CUDA: 16 (on an H100, 16 needle-style
#: prompts of ~1k tokens ran 5-11x faster together than one by one with a 135M model; the float32
#: logits of a prefill, [B, T, vocab], stay near 20 GB for a 150k-vocabulary model at 2k tokens)
AUTO_BATCH_SIZE = {"cpu": 8, "cuda": 16}
#: ``--prefill-chunk auto``: text prompts up to this many tokens are prefilled in one piece (what every run
#: did before chunks: their rows unchanged); longer ones in pieces sized to free memory (harness.run.memory)
AUTO_WHOLE_PREFILL = 32_768
REPORTS_DIR = Path("reports")


class RunError(ValueError):
    pass


# the command line's forms beyond tyro's own (harness/run/flags.py)
_STRS = {flag: values(str, flag) for flag in ("--task", "--codec")}
_INTS = {flag: values(int, flag) for flag in ("--bits", "--codec-seeds")}
_PROTECT = parsed(functools.partial(parse_protect, name="--protect"), "PROTECT", protect_text)
_TASK_OPT = owner_options("--task-opt", "TASK.NAME=VALUE")
_CODEC_OPT = owner_options("--codec-opt", "CODEC.NAME=VALUE")


def _default_is(note: str) -> str:
    return f"(default: {note})"


@dataclass
class RunConfig(VersionedJSON, what="run config", version=RUN_CONFIG_VERSION, versionless=True):
    """Everything that decides a run's numbers (each field's annotation declares its flag); round-trips to JSON
    (:class:`registry.versioned.VersionedJSON`; a config.json from before versions were written reads as version 1).

    The field order is the order of config.json and of ``harness run --help``."""

    model: Annotated[str, arg(help="model name (see `harness list`)")] = DEFAULT_MODEL
    model_path: Annotated[str | None, arg(
        help="local checkpoint directory (or .gguf file) for the model", metavar="PATH")] = None
    tasks: Annotated[list[str], _STRS["--task"], arg(
        name="task", help="task(s)", help_behavior_hint=_default_is("the model's own; text: perplexity"))] = \
        field(default_factory=list)
    codecs: Annotated[list[str], _STRS["--codec"], arg(
        name="codec", help=f"codec(s): {WIDTHS}")] = field(default_factory=lambda: list(DEFAULT_CODECS))
    bits: Annotated[list[int], _INTS["--bits"], arg(help="key bit width(s)")] = \
        field(default_factory=lambda: list(DEFAULT_BITS))
    prompts: Annotated[str | None, arg(
        help="prompt source: a path, or for text wikitext2 / c4", metavar="SOURCE",
        help_behavior_hint=_default_is("the task's default; text: offline corpus"))] = None
    limit: Annotated[int | None, arg(help="at most this many prompts per task", metavar="N")] = None
    margin: Annotated[float | None, arg(
        help="non-inferiority margin on each task's headline metric, in its units: the report says which "
        "configurations are shown to be no worse than the baseline by more than this (a one-sided bound at the "
        "95 percent level)", metavar="DELTA")] = None
    seed: Annotated[int, arg(
        help="prompt seed: every draw of the prompts and rollouts (needles, noise, sampling)")] = 0
    codec_seeds: Annotated[list[int], _INTS["--codec-seeds"], arg(
        help="codec seeds: a randomized codec (rotation signs, projections) runs once per seed; a deterministic "
        "codec and the baseline run once")] = field(default_factory=lambda: list(DEFAULT_CODEC_SEEDS))
    residual: Annotated[int, arg(help="native window in tokens")] = DEFAULT_RESIDUAL
    protect: Annotated[str | list[int], _PROTECT, arg(help="layers kept native: none, boundary-1, or 0,29")] = "none"
    value_bits: Annotated[int | None, arg(
        help="value bit width", metavar="BITS", help_behavior_hint=_default_is("the key bit width"))] = None
    value_group: Annotated[int, arg(help="value quantization group size")] = 32
    attend: Annotated[Literal["score", "reconstruct"], arg(
        help="read keys through each codec's score estimator or its reconstruction")] = "score"
    backend: Annotated[Backend, arg(help="attention backend")] = "auto"
    device: Annotated[str, arg(help="auto (cuda if available), cpu, cuda, cuda:1, ...")] = "auto"
    dtype: Annotated[str, arg(help="auto (float32 on cpu, bfloat16 on cuda), float32, bfloat16, float16")] = "auto"
    batch_size: Annotated[int | None, arg(
        help="prompts run together through one cache by the text tasks (left-padded; rows do not depend on it "
        "beyond float rounding, which in bfloat16 can flip a greedy token)", metavar="N",
        help_behavior_hint=_default_is(f"auto: {AUTO_BATCH_SIZE['cpu']} on cpu, {AUTO_BATCH_SIZE['cuda']} on cuda")
    )] = None
    task_options: Annotated[dict[str, dict], _TASK_OPT, arg(
        name="task-opt", help="task option, repeatable (e.g. needle.contexts=512,1024; see `harness list`)",
        help_behavior_hint="")] = field(default_factory=dict)
    codec_options: Annotated[dict[str, dict[str, str]], _CODEC_OPT, arg(
        name="codec-opt", help="codec option, repeatable (e.g. octopus.split=3,3,3)", help_behavior_hint="")] = \
        field(default_factory=dict)
    # also run codec 'none' through the cache path (a row per prompt; KL must be 0)
    baseline: Annotated[bool, arg(name="baseline-row", help="do not add the codec 'none' rows",
                                  help_behavior_hint="")] = True

    # --- scale (harness.scale.shard, docs/scale_out.md) ---
    # a text model larger than one GPU: its layers spread over the visible GPUs by accelerate
    device_map: Annotated[Literal["auto"] | None, arg(
        help="'auto': spread a text model that does not fit one GPU over every visible GPU (accelerate)")] = None

    # greedy decode steps of text models: replayed from a CUDA graph where the cache allows (equal to
    # eager steps to float rounding), run eagerly in the graph's static layout, or eager
    graphs: Annotated[Literal["auto", "static", "off"], arg(
        help="decode steps of text models: auto (CUDA graphs on CUDA where the cache allows), static (the graphs' "
        "static layout, run eagerly on any device), off (eager)")] = "auto"

    # the first forward of a long text prompt in pieces (adapters.hf.prefill); config.json keeps the option as
    # given, model.json the chunk it came to (harness.run.memory: chosen from free memory, so machine-dependent)
    prefill_chunk: Annotated[Literal["auto"] | int, arg(
        help="text prompts longer than N tokens are prefilled in pieces of N, natively, then committed (the "
        "same numbers to float rounding; a piece's activations instead of the prompt's); auto: prompts up to "
        f"{AUTO_WHOLE_PREFILL:,} tokens in one piece, longer ones in the largest piece free memory holds",
        metavar="auto|N")] = "auto"

    def validate(self, spell: Callable[[str], str] | None = None) -> list[str]:
        """Check every field that needs no model (names are checked against the registries by
        ``runner.resolve``), read ``protect`` into its canonical form and drop repeated codecs, bits and tasks,
        keeping the first. Returns a note per dropped repeat; raises :class:`RunError` naming the option and
        the allowed values. ``spell``: a field's name as the front end gives it (default: its ``harness run``
        flag, :func:`flag`; lm-eval's ``model_args`` name theirs), so every front end gets these checks and
        their wording."""
        name = spell or flag
        if self.limit is not None and not _whole(self.limit, 1):
            raise RunError(f"{name('limit')} must be a positive number of prompts, got {self.limit!r}; "
                           f"leave it out to run every prompt")
        if self.margin is not None and (isinstance(self.margin, bool) or not isinstance(self.margin, (int, float))
                                        or not 0 <= self.margin < math.inf):
            raise RunError(f"{name('margin')} must be a finite number >= 0 (in the headline metric's units), "
                           f"got {self.margin!r}")
        if not _whole(self.residual, 0):
            raise RunError(f"{name('residual')} must be >= 0 tokens, got {self.residual!r}")
        if not _whole(self.seed, 0):
            raise RunError(f"{name('seed')} must be an integer >= 0, got {self.seed!r}")
        if self.batch_size is not None and not _whole(self.batch_size, 1):
            raise RunError(f"{name('batch_size')} must be a positive number of prompts, got {self.batch_size!r}; "
                           f"leave it out for the default")
        chunk = self.prefill_chunk
        if chunk != "auto" and not _whole(chunk, 1):
            raise RunError(f"{name('prefill_chunk')} takes auto or a number of tokens >= 1, got {chunk!r}")
        if self.value_bits is not None and not (_whole(self.value_bits, 1) and self.value_bits <= 16):
            raise RunError(f"{name('value_bits')} must be in 1..16, got {self.value_bits!r}; "
                           f"leave it out to use the key bits")
        if not _whole(self.value_group, 1):
            raise RunError(f"{name('value_group')} must be >= 1, got {self.value_group!r}")
        if not self.codec_seeds or not all(_whole(c, 0) for c in self.codec_seeds):
            raise RunError(f"{name('codec_seeds')} must be one or more integers >= 0, got {self.codec_seeds}")
        if not all(_whole(b, 1) for b in self.bits):
            raise RunError(f"{name('bits')} must be positive integers, got {self.bits}")
        for f in fields(self):  # the closed choices (tyro checks them on the command line; JSON and Python here)
            choices = typing.get_args(_hints(False)[f.name])
            if typing.get_origin(_hints(False)[f.name]) is Literal and getattr(self, f.name) not in choices:
                raise RunError(f"{name(f.name)} '{getattr(self, f.name)}' is not one of {', '.join(choices)}")
        try:
            self.protect = parse_protect(self.protect, name("protect"))
        except ValueError as e:
            raise RunError(str(e)) from None
        if not isinstance(self.device, str) or not re.fullmatch(r"auto|cpu|cuda(:\d+)?|mps", self.device):
            raise RunError(f"{name('device')} '{self.device}' is not a device; use auto, cpu, cuda or cuda:N")
        if self.device.startswith("cuda"):
            import torch

            if not torch.cuda.is_available():
                raise RunError(f"{name('device')} {self.device}: CUDA is not available on this machine; "
                               f"use {name('device')} cpu (or auto)")
            index = int(self.device.partition(":")[2] or 0)
            if index >= torch.cuda.device_count():
                raise RunError(f"{name('device')} {self.device}: this machine has {torch.cuda.device_count()} CUDA "
                               f"device(s); use cuda:0..cuda:{torch.cuda.device_count() - 1}")
        if self.backend in ("lut", "triton"):
            import torch

            from kernels.backend import backend_unavailable

            device = self.device if self.device != "auto" else "cuda" if torch.cuda.is_available() else "cpu"
            why = backend_unavailable(self.backend, "cpu" if device == "mps" else device)
            if why is not None:
                raise RunError(f"{name('backend')} {self.backend}: {why}; use {name('backend')} auto (the fused "
                               f"kernels where they run, the PyTorch reference elsewhere) or torch")
        from adapters.loading import DTYPES

        if self.device_map not in (None, "auto"):
            raise RunError(f"{name('device_map')} '{self.device_map}' is not a placement; use auto, or leave it out")
        if self.dtype != "auto" and self.dtype not in DTYPES:
            raise RunError(f"{name('dtype')} '{self.dtype}' is not a dtype; use auto, {', '.join(sorted(DTYPES))}")
        notes = []
        for field_name in ("codecs", "bits", "tasks", "codec_seeds"):
            values = getattr(self, field_name)
            unique = list(dict.fromkeys(values))
            if len(unique) != len(values):
                notes.append(f"{name(field_name)} {' '.join(map(str, values))}: each repeat is run once "
                             f"({' '.join(map(str, unique))})")
                setattr(self, field_name, unique)
        return notes

    def digest(self) -> str:
        return hashlib.sha256(dumps(self.to_json()).encode()).hexdigest()[:8]

    def default_out(self) -> Path:
        return REPORTS_DIR / f"{self.model}-{self.digest()}"

    def codec_options_for(self, codec: str):
        """Codec ``codec``'s ``Options`` instance: the strings of ``--codec-opt`` read by the types of its
        fields (the one place they are parsed; every config made from it trusts it)."""
        from kernels.config import codec_options

        try:
            return codec_options(codec, self.codec_options.get(codec, {}), strings=True)
        except ValueError as e:
            raise RunError(f"--codec-opt: {e}") from None

    def cache_configs(self) -> list[CacheConfig]:
        """The baseline ('none') first, then every (codec, bits) in the order given; each config's
        ``seed`` is the first codec seed (:func:`seeded` makes the others)."""
        entries = self.codec_entries()
        unknown = set(self.codec_options) - {name for name, _ in entries}
        if unknown:
            raise RunError(f"options given for codec(s) {sorted(unknown)} that this run does not have ({self.codecs})")
        common = dict(residual=self.residual, protect=self.protect, value_bits=self.value_bits,
                      value_group=self.value_group, seed=self.codec_seeds[0], attend=self.attend,
                      backend=self.backend)
        out = [CacheConfig(codec="none", bits=16, **common)] if self.baseline else []
        for codec, bits in entries:
            if codec == "none":
                continue
            options = self.codec_options_for(codec)
            for b in bits:
                if all((c.codec, c.bits) != (codec, b) for c in out):  # each (codec, bits) once
                    out.append(CacheConfig(codec=codec, bits=b, options=options, **common))
        return out

    def codec_entries(self, log: Callable[[str], None] | None = None) -> list[tuple[str, list[int]]]:
        """[(codec name, its bit widths)], the widths chosen so that a codec never runs at one it lacks:

        - ``NAME@B[,B...]``: those widths; one the codec does not take is a :class:`RunError` (before any
          model loads);
        - a bare ``NAME``: the widths of ``--bits`` it takes, and where it takes none of them, every width it
          takes (an engine's fixed-width cache named bare, ``vllm-fp8``, runs at 8).

        ``log``: where a bare name's widths differ from ``--bits``, one note line says which it runs at.
        An unknown name raises the codec registry's ValueError (naming the codecs there are)."""
        from kernels import codec_class

        out = []
        for entry in self.codecs:
            name, sep, own = str(entry).partition("@")
            takes = list(codec_class(name).bits_supported)  # unknown name -> "Unknown codec 'x'. Available: ..."
            if name == "none":  # the baseline: its width is nominal
                out.append((name, list(self.bits)))
            elif sep:
                out.append((name, _own_bits(entry, name, own, takes)))
            else:
                common = [b for b in self.bits if b in takes]
                if log is not None and common != list(self.bits):
                    given = f"{flag('bits')} {' '.join(map(str, self.bits))}"
                    log(f"note: {flag('codecs')} {name} runs at {','.join(map(str, common))} of {given} (it takes "
                        f"{','.join(map(str, takes))})" if common else
                        f"note: {flag('codecs')} {name} runs at {','.join(map(str, takes))}, its own "
                        f"width{'s' if len(takes) > 1 else ''} (it takes none of {given})")
                out.append((name, common or takes))
        return out


def _own_bits(entry: str, name: str, own: str, takes: list[int]) -> list[int]:
    """The widths of ``--codec NAME@B[,B...]``; RunError for text that is not widths, or a width the codec lacks."""
    try:
        bits = [int(b) for b in own.split(",")]
    except ValueError:
        bits = []
    if not bits or any(b < 1 for b in bits):
        raise RunError(f"--codec {entry}: NAME@B takes bit widths, e.g. {name}@8 or {name}@2,3")
    lacking = [b for b in bits if b not in takes]
    if lacking:
        widths = ",".join(map(str, takes))
        raise RunError(f"--codec {entry}: codec '{name}' does not support bits={','.join(map(str, lacking))}; it "
                       f"takes {widths}: pass {name}@{widths}, or name it bare ({name}) to run it at the widths it takes")
    return bits


@functools.cache
def _hints(extras: bool) -> dict:
    return typing.get_type_hints(RunConfig, include_extras=extras)


@functools.cache
def flag(field_name: str) -> str:
    """``harness run``'s flag of the RunConfig field ``field_name``, as its annotation declares it
    (``arg(name=...)``, else the field's name): ``flag("codecs") == "--codec"``."""
    declared = getattr(_hints(True)[field_name], "__metadata__", ())
    named = [m.name for m in declared if isinstance(getattr(m, "name", None), str)]
    return "--" + (named[0] if named else field_name).replace("_", "-")


def _whole(value, lo: int) -> bool:
    """Whether ``value`` is an integer (a bool is not) >= ``lo``."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= lo


def batch_size_for(requested: int | None, device) -> int:
    """``--batch-size``, or where it was left out (None) the device's :data:`AUTO_BATCH_SIZE`."""
    if requested is not None:
        return requested
    import torch

    return AUTO_BATCH_SIZE.get(torch.device(device).type, AUTO_BATCH_SIZE["cpu"])


def seeded(cache_config: CacheConfig, codec_seeds: list[int]) -> list[CacheConfig]:
    """``cache_config`` once per codec seed where its codec draws at random, else once (first seed)."""
    from kernels import codec_class

    seeds = codec_seeds if codec_class(cache_config.codec).randomized else codec_seeds[:1]
    return [replace(cache_config, seed=s) for s in seeds]


#: the KV caches engines deploy (kernels/engines/), each at its own bits, by engine: ``--preset deployed`` runs them
#: all beside OCTOPUS and TurboQuant-MSE, ``--preset deployed:ENGINE`` one engine's (TensorRT-LLM's int8 needs a
#: calibrated per-layer scale: --codec-opt trtllm-int8.kv_scale=...)
DEPLOYED: dict[str, list[str]] = {
    "vllm": ["vllm-fp8@8", "vllm-fp8-e5m2@8", "vllm-fp8-per-token-head@8", "vllm-int8-per-token-head@8",
             "vllm-int4-per-token-head@4", "vllm-nvfp4@4", "vllm-turboquant-k8v4@8", "vllm-turboquant-4bit-nc@4",
             "vllm-turboquant-k3v4-nc@3", "vllm-turboquant-3bit-nc@3"],
    "sglang": ["sglang-fp8-e4m3@8", "sglang-fp8-e5m2@8", "sglang-fp4-e2m1@4"],
    "transformers": ["hf-quanto@2,4", "hf-hqq@2,4"],
    "llamacpp": ["llamacpp-q8_0@8", "llamacpp-q5_1@5", "llamacpp-q5_0@5", "llamacpp-q4_1@4", "llamacpp-q4_0@4",
                 "llamacpp-iq4_nl@4"],
    "mlx": ["mlx-g64@2,3,4,8"],
    "exllamav2": ["exl2-q8@8", "exl2-q6@8", "exl2-q4@4", "exl2-fp8@8"],
    "exllamav3": ["exl3@2,3,4,8"],
    "lmdeploy": ["lmdeploy-int8@8", "lmdeploy-int4@4"],
    "trtllm": ["trtllm-fp8@8", "trtllm-nvfp4@4"],
}
_RESEARCH = ["octopus", "turboquant-mse"]

#: ``harness run --preset NAME``: values that replace the defaults (flags given still win).
#: 'default' is the quick sweep (every codec, minutes on a laptop CPU); 'full' the paper-sized one.
PRESETS: dict[str, dict] = {
    "default": {},
    "full": {
        "tasks": ["perplexity", "needle"],
        "codec_seeds": [0, 1, 2, 3, 4],
        "task_options": {
            "perplexity": {"context": 1024, "prefix": 256, "chunk": 64, "count": 8},
            "needle": {"contexts": [1024, 2048], "repeats": 2},
        },
    },
    "deployed": {"codecs": _RESEARCH + [c for codecs in DEPLOYED.values() for c in codecs], "bits": [2, 3, 4]},
    **{f"deployed:{engine}": {"codecs": _RESEARCH + codecs, "bits": [2, 3, 4]} for engine, codecs in DEPLOYED.items()},
    # RULER's niah defaults (its scripts/synthetic.yaml and constants.py): 4 needles, 128 tokens to generate
    "ruler": {
        "tasks": ["needle"],
        "task_options": {"needle": {"ruler": "multikey", "needles": 4, "max_new_tokens": 128}},
    },
}


def with_preset(name: str, given: dict) -> dict:
    """RunConfig keyword arguments: preset ``name``'s values under the ``given`` ones (task and
    codec options merge per option)."""
    if name not in PRESETS:
        raise RunError(f"--preset '{name}' is not a preset; use one of {', '.join(PRESETS)}")
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in PRESETS[name].items()}
    for k, v in given.items():
        if k in ("task_options", "codec_options") and k in out:
            merged = {owner: dict(opts) for owner, opts in out[k].items()}
            for owner, opts in v.items():
                merged.setdefault(owner, {}).update(opts)
            out[k] = merged
        else:
            out[k] = v
    if "task_options" in out and "tasks" in given:  # options of a task the user left out of the run
        out["task_options"] = {t: o for t, o in out["task_options"].items()
                               if t in given["tasks"] or t in given.get("task_options", {})}
    return out
