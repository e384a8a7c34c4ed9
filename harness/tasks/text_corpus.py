"""Where the text tasks' text comes from: the offline default corpus, WikiText-2 / C4 through
``datasets``, or local files. Everything returns plain strings; tokenization is the model's."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from harness.run.input_files import field, read_jsonl

CORPUS_SPEC = Path(__file__).resolve().parents[2] / "prompts" / "text" / "default_corpus.json"
LICENSES_DIR = Path("/usr/share/common-licenses")
DATASET_SOURCES = ("wikitext2", "c4")


@dataclass(frozen=True)
class Excerpt:
    id: str
    source: str  # "license:GPL-3", "pydoc:execmodel", "wikitext2", a path, ...
    text: str

    @property
    def sha(self) -> str:
        return text_hash(self.text)


def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _clean(text: str) -> str:
    return text.replace("\r\n", "\n").strip()


def _read_source(source: str) -> str | None:
    kind, _, name = source.partition(":")
    if kind == "license":
        f = LICENSES_DIR / name
        return f.read_text(encoding="utf-8", errors="replace") if f.is_file() else None
    if kind == "pydoc":
        try:
            from pydoc_data.topics import topics
        except ImportError:
            return None
        return topics.get(name)
    raise ValueError(f"unknown corpus source kind '{kind}' in '{source}' (expected license:NAME or pydoc:TOPIC)")


def default_corpus() -> list[Excerpt]:
    """The excerpts of prompts/text/default_corpus.json that exist on this machine, in file order."""
    spec = json.loads(CORPUS_SPEC.read_text())
    out = []
    for e in spec["excerpts"]:
        text = _read_source(e["source"])
        if text is None:
            continue
        start = e.get("start")
        if start and start in text:
            text = text[text.index(start):]
        out.append(Excerpt(e["id"], e["source"], _clean(text)))
    if not out:
        raise FileNotFoundError(f"none of the default corpus sources in {CORPUS_SPEC} exist here "
                                f"(pydoc_data, {LICENSES_DIR}); pass --prompts path/to/file.txt")
    return out


def _segments(name: str, source: str, text: str, chars: int, limit: int | None) -> list[Excerpt]:
    """Consecutive non-overlapping pieces of ``chars`` characters (cut at whitespace)."""
    out, i = [], 0
    while i < len(text) and (limit is None or len(out) < limit):
        j = min(len(text), i + chars)
        if j < len(text):
            k = text.rfind(" ", i + chars // 2, j)
            j = k if k > 0 else j
        piece = text[i:j].strip()
        if len(piece) >= chars // 2 or (not out and piece):  # a short text still gives one prompt
            out.append(Excerpt(f"{name}-{len(out):03d}", source, piece))
        i = j
    return out


def _load_dataset_text(source: str, chars_needed: int) -> str:
    try:
        from datasets import load_dataset
    except ImportError as e:
        raise ImportError(f"--prompts {source} needs the 'datasets' package (pip install datasets)") from e
    try:
        if source == "wikitext2":
            try:
                ds = load_dataset("Salesforce/wikitext", "wikitext-2-raw-v1", split="test")
            except Exception:
                ds = load_dataset("wikitext", "wikitext-2-raw-v1", split="test")
            return "".join(ds["text"])
        ds = load_dataset("allenai/c4", "en", split="validation", streaming=True)
        parts, n = [], 0
        for row in ds:
            parts.append(row["text"])
            n += len(row["text"]) + 2
            if n >= chars_needed:
                break
        return "\n\n".join(parts)
    except Exception as e:  # no network, no Hub access, a gated dataset...
        raise RuntimeError(f"could not load '{source}' through datasets ({type(e).__name__}: {e}). "
                           f"Without Hub access use the offline default corpus (no --prompts) or "
                           f"--prompts path/to/file.txt") from None


def _read_local(path: Path) -> str:
    if path.is_dir():
        files = sorted(path.glob("*.txt"))
        if not files:
            raise FileNotFoundError(f"--prompts {path}: a folder, but it holds no .txt files")
        return "\n\n".join(f.read_text(encoding="utf-8", errors="replace") for f in files)
    if path.suffix == ".jsonl":  # one {"text": ...} object a line
        lines = read_jsonl(path, "text prompts (.jsonl)")
        return "\n\n".join(field(d, "text", str, f"{path}:{i}") for i, d in lines)
    return path.read_text(encoding="utf-8", errors="replace")


def load_excerpts(source: str | None, chars: int, limit: int | None) -> list[Excerpt]:
    """source None/'default': the default corpus; 'wikitext2' / 'c4': through datasets; else a path
    (text file, folder of .txt, .jsonl with 'text'), cut into pieces of ``chars`` characters."""
    if source in (None, "", "default"):
        ex = default_corpus()
        return ex[:limit] if limit else ex
    if source in DATASET_SOURCES:
        text = _load_dataset_text(source, chars * (limit or 8) * 2)
        return _segments(source, source, _clean(text), chars, limit)
    path = Path(source).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"--prompts {source}: no such file or folder. Text sources: a path, "
                                f"{', '.join(DATASET_SOURCES)}, or nothing for the offline default corpus")
    out = _segments(path.stem, str(path), _clean(_read_local(path)), chars, limit)
    if not out:
        raise ValueError(f"--prompts {source}: no text in it")
    return out
