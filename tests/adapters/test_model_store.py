"""adapters/model_store.py: a prepared GGUF is keyed by the file's content, so another file of the same
name (or the same file changed) never runs as the model prepared earlier."""
from __future__ import annotations

import hashlib
import json
import os

import pytest

from adapters import model_store
from adapters.model_store import HASHES_FILE, file_sha256, gguf_cache_dir


def _gguf(path, payload: bytes):
    """A small GGUF-like file: the magic, then bytes that stand for the header and tensors."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"GGUF" + payload)
    return path


def test_same_name_other_content_gets_another_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("KVCODEC_CACHE", str(tmp_path / "cache"))
    a = _gguf(tmp_path / "a" / "model.gguf", b"\x01" * 5000)
    b = _gguf(tmp_path / "b" / "model.gguf", b"\x01" * 4999 + b"\x02")  # same name and size, one byte differs
    da, db = gguf_cache_dir(a), gguf_cache_dir(b)
    assert da != db and da.parent == db.parent == tmp_path / "cache" / "models"
    assert da.name.startswith("gguf-model-") and gguf_cache_dir(a) == da
    copy = _gguf(tmp_path / "c" / "other-name.gguf", b"\x01" * 5000)
    assert gguf_cache_dir(copy).name.split("-")[-1] == da.name.split("-")[-1]  # same bytes, same key


def test_changed_file_is_hashed_again_unchanged_is_remembered(tmp_path, monkeypatch):
    memo = tmp_path / HASHES_FILE
    f = _gguf(tmp_path / "model.gguf", b"one")
    h1 = file_sha256(f, memo)
    assert json.loads(memo.read_text())[str(f.resolve())]["sha256"] == h1
    calls = []
    real = model_store._full_hash
    monkeypatch.setattr(model_store, "_full_hash", lambda p: calls.append(1) or real(p))
    assert file_sha256(f, memo) == h1 and not calls  # unchanged: not read again
    _gguf(f, b"two")
    st = f.stat()
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert file_sha256(f, memo) != h1 and calls


def test_a_file_changed_in_place_with_its_times_kept_is_hashed_again(tmp_path):
    """Issue #27: same size, same modification time (restored), other bytes: the memo must not answer."""
    memo = tmp_path / HASHES_FILE
    big = model_store.SAMPLE_BYTES * 3
    f = _gguf(tmp_path / "model.gguf", b"\x01" * big)
    h1 = file_sha256(f, memo)
    st = f.stat()
    with open(f, "r+b") as w:  # one byte in the middle (outside both sampled ends), then the old times back
        w.seek(big // 2)
        w.write(b"\x02")
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert f.stat().st_size == st.st_size and f.stat().st_mtime_ns == st.st_mtime_ns
    h2 = file_sha256(f, memo)
    assert h2 != h1 and h2 == hashlib.sha256(f.read_bytes()).hexdigest()  # the status-change time moved
    # were the status-change time kept too (another file system, a restored backup), the ends still tell
    entry = json.loads(memo.read_text())[str(f.resolve())]
    with open(f, "r+b") as w:
        w.write(b"\x03")
    forged = {**entry, "ctime_ns": f.stat().st_ctime_ns, "mtime_ns": f.stat().st_mtime_ns}
    memo.write_text(json.dumps({str(f.resolve()): forged}))
    assert file_sha256(f, memo) == hashlib.sha256(f.read_bytes()).hexdigest() != h2


def test_a_replaced_gguf_is_prepared_again(tmp_path, monkeypatch):
    """The reported case: a different model.gguf ran as the earlier one with exit code 0."""
    monkeypatch.setenv("KVCODEC_CACHE", str(tmp_path / "cache"))
    import adapters.hf.models as hf

    prepared = []

    class Stop(Exception):
        pass

    def fake_prepare(gguf, dest, progress=True):
        prepared.append(dest)
        raise Stop  # the de-quantization itself is transformers'; what matters is where it goes

    monkeypatch.setattr(hf, "prepare_gguf", fake_prepare)
    f = _gguf(tmp_path / "model.gguf", b"first model")
    with pytest.raises(Stop):
        hf.load_checkpoint(f, "hf", "cpu", "float32")
    _gguf(f, b"second model")
    with pytest.raises(Stop):
        hf.load_checkpoint(f, "hf", "cpu", "float32")
    assert len(prepared) == 2 and prepared[0] != prepared[1]
