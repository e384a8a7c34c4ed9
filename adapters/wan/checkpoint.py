"""Loading the released causal Wan generators and the Wan 2.1 text encoder and VAE.

Released generator checkpoints are ``torch.save`` dicts whose ``generator`` (or
``generator_ema``) entry is the state dict of a wrapper module holding the Wan model as
``model``: Wan-native key names (``blocks.0.self_attn.q.weight``) behind a prefix,
``model.`` (CausVid) or ``model._fsdp_wrapped_module.`` (Causal Forcing). We strip the
prefix and rename with diffusers' own converter (``convert_wan_transformer_to_diffusers``);
any key the diffusers model lacks or does not receive is an error that lists them.

The Wan folder comes in two layouts:

* diffusers (``Wan-AI/Wan2.1-T2V-1.3B-Diffusers``): ``tokenizer/``, ``text_encoder/``, ``vae/``;
* original (``Wan-AI/Wan2.1-T2V-1.3B``): ``google/umt5-xxl/`` (tokenizer),
  ``models_t5_umt5-xxl-enc-bf16.pth`` (Wan-native T5 names, renamed here to transformers'
  ``UMT5EncoderModel``) and ``Wan2.1_VAE.pth`` (renamed with diffusers' ``convert_wan_vae_to_diffusers``).
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import torch

from adapters.loading import NO_FOLDER_CODE, CheckpointError, CheckpointKeyError, load_strict, safe_torch_load

#: What each released format wraps its generator in (prefixes tried in order).
RELEASED_PREFIXES = {
    "causvid": ("model.",),
    "causal-forcing": ("model._fsdp_wrapped_module.", "model."),
}
#: Names of generator files inside a checkpoint folder, per format.
CHECKPOINT_NAMES = {
    "causvid": ("model.pt",),
    "causal-forcing": ("causal_forcing.pt", "model.pt"),
}
#: FSDP / activation-checkpointing / torch.compile wrappers that can appear inside a key.
_WRAPPER_SEGMENTS = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.")

T5_ORIGINAL_FILE = "models_t5_umt5-xxl-enc-bf16.pth"
VAE_ORIGINAL_FILE = "Wan2.1_VAE.pth"
T5_TOKENIZER_ORIGINAL = "google/umt5-xxl"


def _torch_load(path: Path, what: str, key: str | tuple[str, ...] | None = None) -> dict:
    """Tensors only (never code): see :func:`adapters.loading.safe_torch_load`."""
    return safe_torch_load(path, what, key)


# --- the generator (transformer) ------------------------------------------------------------
#: What a released checkpoint's folder (or file) name says about its recipe, per format: a pattern
#: that, found in the name, means a recipe this model does not sample with, and what it means.
#: CausVid's snapshot: ``autoregressive_checkpoint/`` (3-frame blocks, 3 steps: ours) beside
#: ``bidirectional_checkpoint{1,2}/`` and a warped 4-step one; Causal Forcing's
#: ``checkpoints/framewise/`` (ours) beside ``checkpoints/chunkwise/`` (3-frame blocks).
OTHER_RECIPES = {
    "causvid": ((r"bidirectional", "a bidirectional (non-causal) model"),
                (r"frame-?wise", "a frame-wise model (1-frame blocks)"),
                (r"(?<!\d)(?!3step)\d+-?step", "another step count (causvid samples with 3 steps)")),
    "causal-forcing": ((r"bidirectional", "a bidirectional (non-causal) model"),
                       (r"chunk-?wise", "a chunk-wise model (3-frame blocks)"),
                       (r"(?<!\d)(?!4step)\d+-?step", "another step count (causal-forcing samples with 4 steps)")),
}
#: The harness model that samples a recipe the names can tell (for the error's advice). Causal
#: Forcing's chunk-wise checkpoint has no model here (CausVid's 3-frame recipe has other steps).
_RECIPE_MODEL = {"frame-wise": "causal-forcing"}
#: How deep under a given folder checkpoints are looked for (``checkpoints/framewise/x.pt`` from a repository root).
_SEARCH_DEPTH = 3


def find_generator_file(path: str | os.PathLike, fmt: str) -> Path:
    """The generator file at ``path``: the file itself, or the ONE candidate under the folder
    (names of :data:`CHECKPOINT_NAMES`, up to three folders down). Several candidates are an
    error listing them; a file whose folder names another recipe (:data:`OTHER_RECIPES`) too."""
    p = Path(path)
    if p.is_file():
        check_recipe(p, fmt)
        return p
    if p.is_dir():
        found = sorted({c for name in CHECKPOINT_NAMES[fmt] for depth in range(_SEARCH_DEPTH + 1)
                        for c in p.glob("/".join(["*"] * depth + [name])) if c.is_file()})
        if len(found) == 1:
            check_recipe(found[0], fmt)
            return found[0]
        if found:
            raise CheckpointError(
                f"{p} holds {len(found)} candidate {fmt} checkpoints ({', '.join(str(f.relative_to(p)) for f in found)}); "
                f"pass the one to run as --model-path FILE (see docs/video.md)")
    raise FileNotFoundError(
        f"no {fmt} generator checkpoint at {p}: pass the file ({' or '.join(CHECKPOINT_NAMES[fmt])}) "
        f"or a folder holding it (see docs/video.md)")


def check_recipe(file: Path, fmt: str) -> None:
    """Refuse a checkpoint whose folder or file name says it is another recipe than ``fmt`` samples."""
    names = f"{file.parent.name}/{file.name}".lower()
    for pattern, what in OTHER_RECIPES[fmt]:
        if re.search(pattern, names):
            other = next((m for k, m in _RECIPE_MODEL.items() if k in what), None)
            fix = (f"use --model {other}" if other and other != fmt
                   else f"pass the {fmt} checkpoint as --model-path FILE (see docs/video.md)")
            raise CheckpointError(f"{file} looks like {what} ('{file.parent.name}/{file.name}'), not what model "
                                  f"'{fmt}' samples with; {fix}")


def generator_state_dict(checkpoint: dict, fmt: str, key: str | None = None) -> dict[str, torch.Tensor]:
    """The Wan-native state dict (prefix and wrappers stripped) of a released generator checkpoint.

    ``key``: which entry to read; default ``generator_ema`` when present (Causal Forcing's
    README samples with ``--use_ema``), else ``generator``.
    """
    if key is None:
        key = "generator_ema" if "generator_ema" in checkpoint else "generator"
    if key not in checkpoint:
        entries = [k for k in checkpoint if not torch.is_tensor(checkpoint[k])][:20]
        raise CheckpointKeyError(f"{fmt} checkpoint has no '{key}' entry (it holds: {', '.join(map(str, entries))})")
    sd = checkpoint[key]
    prefixes = RELEASED_PREFIXES[fmt]
    out = {}
    for name, tensor in sd.items():
        for pre in prefixes:
            if name.startswith(pre):
                name = name[len(pre):]
                break
        else:
            raise CheckpointKeyError(f"{fmt} checkpoint key '{name}' does not start with "
                                     f"{' or '.join(repr(p) for p in prefixes)}: not a {fmt} generator?")
        for seg in _WRAPPER_SEGMENTS:
            name = name.replace(seg, "")
        out[name] = tensor
    return out


def wan_to_diffusers(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Wan-native transformer names -> diffusers' ``WanTransformer3DModel`` names (diffusers' converter)."""
    from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers
    return convert_wan_transformer_to_diffusers(dict(sd))  # it pops from its argument


def load_transformer_weights(transformer, sd: dict[str, torch.Tensor], what: str) -> None:
    """Strictly load diffusers-named weights ``sd`` into ``transformer`` (assigning, dtype kept)."""
    load_strict(transformer, sd, what, assign=True)


def load_released_generator(transformer, path, fmt: str, key: str | None = None) -> Path:
    """Load a released CausVid / Causal Forcing checkpoint into a diffusers ``WanTransformer3DModel``."""
    file = find_generator_file(path, fmt)
    # the hint converts the entry generator_state_dict reads: the EMA weights where present
    checkpoint = _torch_load(file, f"{fmt} generator checkpoint", key or ("generator_ema", "generator"))
    if file.suffix == ".safetensors":  # a converted file holds the generator's state dict itself
        checkpoint = {key or "generator": checkpoint}
    sd = wan_to_diffusers(generator_state_dict(checkpoint, fmt, key))
    load_transformer_weights(transformer, sd, f"{fmt} generator {file}")
    return file


# --- the Wan folder: text encoder, tokenizer, VAE ---------------------------------------------
def wan_layout(folder: str | os.PathLike) -> str:
    """'diffusers' or 'original'; raises with what is missing otherwise."""
    f = Path(folder)
    if (f / "text_encoder").is_dir() and (f / "vae").is_dir() and (f / "tokenizer").is_dir():
        return "diffusers"
    if (f / T5_ORIGINAL_FILE).is_file() and (f / VAE_ORIGINAL_FILE).is_file():
        return "original"
    raise FileNotFoundError(
        f"{f} is not a Wan 2.1 folder: expected tokenizer/, text_encoder/ and vae/ (the "
        f"Wan-AI/Wan2.1-T2V-1.3B-Diffusers layout) or {T5_ORIGINAL_FILE}, {VAE_ORIGINAL_FILE} and "
        f"{T5_TOKENIZER_ORIGINAL}/ (the Wan-AI/Wan2.1-T2V-1.3B layout); see docs/video.md")


def umt5_config_for(sd: dict[str, torch.Tensor]):
    """The UMT5 encoder config of a Wan-native T5 state dict, read off its shapes (umt5-xxl:
    vocab 256384, d_model 4096, 64 heads of 64, d_ff 10240, 24 layers)."""
    from transformers import UMT5Config
    try:
        vocab, d_model = sd["token_embedding.weight"].shape
        buckets, heads = sd["blocks.0.pos_embedding.embedding.weight"].shape
        d_ff = sd["blocks.0.ffn.fc1.weight"].shape[0]
    except KeyError as e:
        raise CheckpointKeyError(f"not a Wan T5 encoder state dict: no '{e.args[0]}'") from None
    layers = 1 + max(int(k.split(".")[1]) for k in sd if k.startswith("blocks."))
    return UMT5Config(vocab_size=vocab, d_model=d_model, d_kv=d_model // heads, d_ff=d_ff, num_layers=layers,
                      num_heads=heads, relative_attention_num_buckets=buckets, relative_attention_max_distance=128,
                      feed_forward_proj="gated-gelu", layer_norm_epsilon=1e-6, dropout_rate=0.0)


_T5_RENAMES = (  # Wan-native T5 encoder -> transformers UMT5EncoderModel (per block)
    (r"^blocks\.(\d+)\.norm1\.weight$", r"encoder.block.\1.layer.0.layer_norm.weight"),
    (r"^blocks\.(\d+)\.attn\.([qkvo])\.weight$", r"encoder.block.\1.layer.0.SelfAttention.\2.weight"),
    (r"^blocks\.(\d+)\.pos_embedding\.embedding\.weight$",
     r"encoder.block.\1.layer.0.SelfAttention.relative_attention_bias.weight"),
    (r"^blocks\.(\d+)\.norm2\.weight$", r"encoder.block.\1.layer.1.layer_norm.weight"),
    (r"^blocks\.(\d+)\.ffn\.gate\.0\.weight$", r"encoder.block.\1.layer.1.DenseReluDense.wi_0.weight"),
    (r"^blocks\.(\d+)\.ffn\.fc1\.weight$", r"encoder.block.\1.layer.1.DenseReluDense.wi_1.weight"),
    (r"^blocks\.(\d+)\.ffn\.fc2\.weight$", r"encoder.block.\1.layer.1.DenseReluDense.wo.weight"),
    (r"^norm\.weight$", "encoder.final_layer_norm.weight"),
    (r"^token_embedding\.weight$", "shared.weight"),
)


def wan_t5_to_transformers(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Wan's ``models_t5_umt5-xxl-enc-bf16.pth`` names -> ``UMT5EncoderModel`` names.

    Wan's T5 (gated tanh-GELU FFN ``fc2(fc1(x) * gelu(gate(x)))``, per-layer relative position
    buckets, unscaled attention) is transformers' UMT5 encoder with ``gated-gelu``. Keys that
    match no rule are kept as they are, so the strict check reports them.
    """
    out = {}
    for name, t in sd.items():
        new = name
        for pat, rep in _T5_RENAMES:
            if re.match(pat, name):
                new = re.sub(pat, rep, name)
                break
        out[new] = t
    if "shared.weight" in out:
        out["encoder.embed_tokens.weight"] = out["shared.weight"]  # tied in UMT5EncoderModel
    return out


def load_text_encoder(folder, dtype: torch.dtype, device="cpu"):
    """(UMT5EncoderModel, tokenizer) from a Wan folder of either layout."""
    from transformers import AutoTokenizer, UMT5EncoderModel
    f = Path(folder)
    if wan_layout(f) == "diffusers":
        enc = UMT5EncoderModel.from_pretrained(str(f / "text_encoder"), dtype=dtype, **NO_FOLDER_CODE)
        tok = AutoTokenizer.from_pretrained(str(f / "tokenizer"), **NO_FOLDER_CODE)
    else:
        enc = load_t5_original(f / T5_ORIGINAL_FILE, dtype)
        tok = AutoTokenizer.from_pretrained(str(f / T5_TOKENIZER_ORIGINAL), **NO_FOLDER_CODE)
    return enc.to(device=device, dtype=dtype).eval().requires_grad_(False), tok


def load_t5_original(file, dtype: torch.dtype = torch.float32):
    """transformers' UMT5EncoderModel from Wan's own T5 encoder checkpoint (strict)."""
    from transformers import UMT5EncoderModel
    wan_sd = _torch_load(Path(file), "Wan T5 encoder")
    with torch.device("meta"):
        enc = UMT5EncoderModel(umt5_config_for(wan_sd))
    sd = wan_t5_to_transformers(wan_sd)
    load_strict(enc, {k: v.to(dtype) for k, v in sd.items()}, f"UMT5 text encoder {file}", assign=True)
    return enc.eval().requires_grad_(False)


def load_vae(folder, dtype: torch.dtype, device="cpu"):
    """AutoencoderKLWan from a Wan folder of either layout."""
    from diffusers import AutoencoderKLWan
    from diffusers.loaders.single_file_utils import convert_wan_vae_to_diffusers
    f = Path(folder)
    if wan_layout(f) == "diffusers":
        vae = AutoencoderKLWan.from_pretrained(str(f / "vae"), torch_dtype=dtype)
    else:
        vae = AutoencoderKLWan()
        sd = convert_wan_vae_to_diffusers(dict(_torch_load(f / VAE_ORIGINAL_FILE, "Wan VAE")))
        load_strict(vae, sd, f"Wan VAE {f / VAE_ORIGINAL_FILE}")
    return vae.to(device=device, dtype=dtype).eval().requires_grad_(False)
