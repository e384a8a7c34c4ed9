"""Reading the released AAR / SAT checkpoints strictly.

The release stores the AAR transformer under ``model_state_dict`` and the tokenizer under
``generator_state_dict`` (next to optimizer state and the epoch), keys possibly prefixed with
``module.`` (DistributedDataParallel). Any missing or unexpected key, or a shape that does not
match, is an error that lists them all (:func:`adapters.loading.load_strict`).
"""
from __future__ import annotations

from pathlib import Path

import torch

from adapters.loading import CheckpointKeyError, safe_torch_load

AAR_KEY = "model_state_dict"
SAT_KEY = "generator_state_dict"

# torch.nn.utils.parametrizations.weight_norm names -> the legacy names the release uses
_PARAMETRIZED = {".parametrizations.weight.original0": ".weight_g", ".parametrizations.weight.original1": ".weight_v"}


def read_state_dict(source, key: str) -> dict[str, torch.Tensor]:
    """A checkpoint file (or an already loaded dict) -> the state dict under ``key``, keys normalised."""
    if isinstance(source, (str, Path)):
        # tensors and plain values only; argparse Namespaces pickled next to the weights are allowed
        ckpt = safe_torch_load(source, f"AAR checkpoint ('{key}')", key)
        if Path(source).suffix == ".safetensors":  # a converted file holds the state dict itself
            ckpt = {key: ckpt}
    else:
        ckpt = source
    if key not in ckpt:
        raise CheckpointKeyError(f"checkpoint {source if isinstance(source, (str, Path)) else '(dict)'} has no '{key}'; "
                       f"top-level keys: {sorted(map(str, ckpt))[:20]}")
    return normalize_keys(ckpt[key])


def normalize_keys(state: dict) -> dict[str, torch.Tensor]:
    out = {}
    for k, v in state.items():
        if k.startswith("module."):
            k = k[len("module."):]
        for new, old in _PARAMETRIZED.items():
            if k.endswith(new):
                k = k[: -len(new)] + old
        out[k] = v
    return out
