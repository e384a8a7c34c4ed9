"""What every model loader shares: device and dtype resolution, strict state-dict loading,
seeded random initialisation and the local cache directory."""
from __future__ import annotations

import argparse
import math
import os
import re
from pathlib import Path

import torch

from kernels import private_generator

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16, "fp16": torch.float16,
          "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


# --- placement ------------------------------------------------------------------------------------
def resolve_device(device: str | None) -> str:
    """'auto' (or None): cuda where available, else cpu; anything else as given."""
    if device in (None, "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    return str(device)


def resolve_dtype(dtype, device: str) -> torch.dtype:
    """'auto' (or None): bfloat16 on CUDA, float32 elsewhere; a name of :data:`DTYPES`; a torch.dtype as given."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "auto"):
        return torch.bfloat16 if str(device).startswith("cuda") else torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype '{dtype}'. Available: auto, {', '.join(sorted(DTYPES))}")
    return DTYPES[dtype]


def resolve(device, dtype) -> tuple[str, torch.dtype]:
    """(device, dtype) of a loader's arguments, 'auto' resolved (the same defaults for every modality)."""
    device = resolve_device(device)
    return device, resolve_dtype(dtype, device)


# --- reading checkpoint files: tensors only, never code ----------------------------------------------
class CheckpointError(ValueError):
    """A checkpoint file the harness will not use (unsafe pickle, unreadable, ambiguous or of another
    recipe); the message names the file and the fix. The runner reports it as a one-line error."""


#: The only non-tensor classes a pickled checkpoint may hold beyond torch's own weights-only set:
#: ``argparse.Namespace`` (training arguments pickled next to the weights by release scripts; it is
#: a plain attribute bag, and its values still pass the same weights-only checks).
SAFE_PICKLE_GLOBALS = (argparse.Namespace,)

#: The conversion a user runs once where they trust the file's source: still a weights-only load,
#: with only the one class the file names allowed (imported from its own package), then safetensors.
CONVERT_HINT = ("if you trust '{module}.{name}', convert it once: python -c \"import torch; from {module} import "
                "{name}; from safetensors.torch import save_file; torch.serialization.add_safe_globals([{name}]); "
                "sd = torch.load('{file}', weights_only=True){key}; "
                "save_file({{k: v.contiguous() for k, v in sd.items()}}, '{stem}.safetensors')\"")


def _entry_expr(key: str | tuple[str, ...] | None) -> str:
    """The hint's code that picks the weights' entry: ``['a']``, or for candidates (a, b, ...) the
    first present, as the loader reads it."""
    if not key:
        return ""
    if isinstance(key, str):
        return f"['{key}']"
    *first, last = key
    pick = f"sd['{last}']"
    for k in reversed(first):
        pick = f"sd['{k}'] if '{k}' in sd else {pick}"
    return f"; sd = {pick}"


def safe_torch_load(path: str | os.PathLike, what: str = "checkpoint", key: str | tuple[str, ...] | None = None) -> dict:
    """Read a checkpoint without running code from it: ``.safetensors`` with safetensors, anything
    else with ``torch.load(weights_only=True)`` (memory-mapped where the format allows), allowing
    only :data:`SAFE_PICKLE_GLOBALS` beyond plain containers and tensors.

    A pickle that needs any other class is refused with a :class:`CheckpointError` naming the file
    and how to convert it (``key``: the entry holding the weights, which the hint keeps; None: the
    whole file is the state dict). A ``.safetensors`` file holds the state dict itself.
    """
    import pickle

    p = Path(path)
    if not p.is_file():
        raise CheckpointError(f"{what} {p} does not exist or is not a file; pass the checkpoint file itself")
    if p.suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file
        try:
            return load_file(str(p))
        except (SafetensorError, OSError, ValueError) as e:
            raise CheckpointError(f"{what} {p} is not a readable safetensors file ({_first_line(e)}); "
                                  f"download it again") from None
    try:
        with torch.serialization.safe_globals(list(SAFE_PICKLE_GLOBALS)):
            try:
                return torch.load(str(p), map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError as e:  # a legacy (non-zip) file cannot be memory-mapped
                if "mmap" not in str(e) and "zipfile" not in str(e):
                    raise
                return torch.load(str(p), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        found = re.search(r"Unsupported global: GLOBAL (\S+)", str(e))
        if found is None:
            raise CheckpointError(f"{what} {p} is not a readable PyTorch checkpoint (not a pickle of tensors); "
                                  f"download it again, or pass another file") from None
        module, _, name = found.group(1).rpartition(".")
        hint = CONVERT_HINT.format(module=module, name=name, file=p, key=_entry_expr(key), stem=p.with_suffix(""))
        raise CheckpointError(f"{what} {p} pickles '{found.group(1)}', not only tensors and plain values, and the "
                              f"harness never runs code from a data file; {hint}") from None
    except (RuntimeError, EOFError, OSError, ValueError) as e:
        raise CheckpointError(f"{what} {p} is not a readable PyTorch checkpoint ({_first_line(e)}); "
                              f"download it again, or pass another file") from None


def _first_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return (lines[0] if lines else type(e).__name__)[:200]


# --- Hugging Face folders: their files are data, their Python never runs ---------------------------------
#: Every transformers ``from_pretrained`` of the harness passes this: a folder whose config or tokenizer names
#: its own classes (``auto_map``) is then refused by transformers instead of prompting "run custom code? [y/N]"
#: (a "y" on stdin would have run the folder's module). A fixed class (UMT5EncoderModel, ClapModel) never
#: imports a folder's module; it gets the keyword too, so that one rule holds at every call site.
NO_FOLDER_CODE = {"trust_remote_code": False}

#: the files of a Hugging Face folder that can ask for the folder's own classes
_CODE_ASKING_FILES = ("config.json", "tokenizer_config.json", "processor_config.json", "preprocessor_config.json")
_JSON_LIMIT = 64 << 20  # a config larger than this is no config (a device or a planted giant file)


def refuse_folder_code(folder: str | os.PathLike, what: str) -> None:
    """ValueError in one line where a local Hugging Face folder asks to run its own Python: an ``auto_map`` in
    one of its configs for classes transformers does not ship (a ``model_type`` it does not know; where it knows
    the type, ``trust_remote_code=False`` loads transformers' own classes and the folder's module is ignored).
    Checked from the JSON alone, before transformers reads the folder. ``what``: the model's name, for the line."""
    from transformers import CONFIG_MAPPING

    f = Path(folder)
    if not f.is_dir():
        return  # a .gguf file or a Hub id: no folder of Python (a Hub id's is refused by NO_FOLDER_CODE)
    model_type = None
    for name in _CODE_ASKING_FILES:
        data = _small_json(f / name)
        if name == "config.json":
            model_type = data.get("model_type")
        asked = data.get("auto_map")
        if asked and not (isinstance(model_type, str) and model_type in CONFIG_MAPPING):
            classes = ", ".join(sorted(map(str, asked.values() if isinstance(asked, dict) else asked)))[:160]
            raise ValueError(f"{what} at {f}: {name} asks to run the folder's own Python (auto_map: {classes}) for "
                             f"model type {model_type!r}, which transformers does not ship; the harness never runs "
                             f"code from a model folder: use a checkpoint of an architecture transformers has")


def _small_json(path: Path) -> dict:
    """A config's JSON object, or {} where the file is absent, not a regular file, too large or not JSON (its
    loader then names the problem)."""
    import json
    import stat

    try:
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as f:  # a pipe: opened, never read
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return {}
            raw = f.read(_JSON_LIMIT + 1)
        data = json.loads(raw.decode("utf-8")) if len(raw) <= _JSON_LIMIT else {}
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


# --- strict loading -------------------------------------------------------------------------------
class CheckpointKeyError(KeyError, ValueError):
    """A checkpoint that does not match its model; the message lists every missing, unexpected and
    mis-shaped key (a KeyError for the key lookups that raise it, a ValueError for a bad file)."""

    def __str__(self) -> str:  # KeyError quotes its message; show it plainly
        return str(self.args[0])


def _show(keys: list[str]) -> str:
    return ", ".join(keys[:40]) + (f", ... ({len(keys)} in all)" if len(keys) > 40 else "")


def load_strict(module: torch.nn.Module, state: dict[str, torch.Tensor], what: str, assign: bool = False) -> None:
    """Load ``state`` into ``module`` with every key and shape checked first; raise one
    :class:`CheckpointKeyError` naming them all. ``assign``: take the checkpoint's tensors as
    they are (a module built on the meta device)."""
    own = module.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    shapes = sorted(f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(own[k].shape)}"
                    for k in set(own) & set(state) if tuple(state[k].shape) != tuple(own[k].shape))
    if missing or unexpected or shapes:
        lines = [f"{what}: the checkpoint does not match the model."]
        if missing:
            lines.append(f"missing keys ({len(missing)}): {_show(missing)}")
        if unexpected:
            lines.append(f"unexpected keys ({len(unexpected)}): {_show(unexpected)}")
        if shapes:
            lines.append(f"shape mismatches ({len(shapes)}): {'; '.join(shapes[:40])}")
        raise CheckpointKeyError("\n".join(lines))
    module.load_state_dict(state, strict=True, assign=assign)


# --- seeded random weights ------------------------------------------------------------------------
@torch.no_grad()
def random_init_(module: torch.nn.Module, *seed_parts) -> torch.nn.Module:
    """Re-draw every parameter from a generator seeded by ``(*seed_parts, parameter name)`` (on the
    parameter's device), so a weight does not depend on the global RNG or on the other parameters.

    Weights ~ N(0, 1/fan_in) (variance-preserving), biases ~ N(0, 0.02^2), norm gains 1,
    embeddings ~ N(0, 1).
    """
    embeddings = {f"{n}.weight" for n, m in module.named_modules() if isinstance(m, torch.nn.Embedding)}
    for name, p in sorted(module.named_parameters()):
        g = private_generator(*seed_parts, name, device=p.device)
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "bias":
            std = 0.02
        elif "norm" in name or leaf == "gamma":
            p.fill_(1.0)
            continue
        elif name in embeddings:
            std = 1.0
        elif p.dim() >= 2:
            std = 1.0 / math.sqrt(math.prod(p.shape[1:]))
        else:
            std = 1.0 / math.sqrt(p.numel())
        p.copy_(torch.randn(p.shape, generator=g, device=p.device, dtype=torch.float32).mul_(std).to(p.dtype))
    return module


# --- the cache directory --------------------------------------------------------------------------
def cache_root() -> Path:
    """Where prepared checkpoints live: ``$KVCODEC_CACHE``, default ``~/.cache/kvcodec-harness``."""
    return Path(os.environ.get("KVCODEC_CACHE", Path.home() / ".cache" / "kvcodec-harness"))
