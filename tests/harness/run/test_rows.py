"""harness/run/rows.py: safe names, paths kept inside the run folder, rows.jsonl read back (a torn last
line repaired, a corrupt line inside named by file and line), the row key with its codec seed."""
from __future__ import annotations

import pytest

from harness.run.rows import ID_FIELDS, CorruptRows, UnsafePath, inside, read_rows, row_key, safe_name


@pytest.mark.parametrize("raw", ["/etc/passwd", "../../x", "..", ".", "", "a\x00b/c", "a/../../b", "\\..\\x"])
def test_safe_name_is_one_component_inside(raw, tmp_path):
    name = safe_name(raw)
    assert name and "/" not in name and "\x00" not in name and name not in (".", "..")
    assert inside(tmp_path, "video", name).resolve().parent == (tmp_path / "video").resolve()


def test_safe_name_keeps_ordinary_names():
    assert [safe_name(s) for s in ("000_a_cat", "octopus-2", "p.1")] == ["000_a_cat", "octopus-2", "p.1"]


def test_inside_refuses_escapes(tmp_path):
    for parts in (("..", "x"), ("/abs",), ("a", "..", "..", "b"), (".",)):
        with pytest.raises(UnsafePath, match="not inside the run folder"):
            inside(tmp_path / "run", *parts)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "link").symlink_to(tmp_path)  # a link out of the folder counts as outside
    with pytest.raises(UnsafePath):
        inside(tmp_path / "run", "link", "x")
    assert inside(tmp_path / "run", "a", "b.pt") == tmp_path / "run" / "a" / "b.pt"


def test_corrupt_line_is_named_and_torn_last_line_repaired(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"a": 1}\n{"a": 2')  # a crash mid-write: the last line is cut off silently
    assert read_rows(path, repair=True, keyed=False) == [{"a": 1}] and path.read_text() == '{"a": 1}\n'
    with pytest.raises(CorruptRows, match=rf"^{path}:1: a row needs 'task'"):  # a row must have its key
        read_rows(path)
    path.write_text('{"a": 1}\n{"a": 2}\n{garbled\n{"a": 4}\n')
    with pytest.raises(CorruptRows, match=rf"^{path}:3: not a JSON row .* delete or fix that line"):
        read_rows(path, keyed=False)
    path.write_text('{"a": 1}\n[1, 2]\n')
    with pytest.raises(CorruptRows, match=rf"{path}:2: not a JSON object"):
        read_rows(path, keyed=False)
    path.write_bytes(b'{"a": 1}\n\xff\xfe\n')
    with pytest.raises(CorruptRows, match=rf"{path}:2"):
        read_rows(path, keyed=False)


def test_row_key_has_the_codec_seed_and_old_rows_count_as_seed_0():
    row = {"task": "perplexity", "prompt": "p0", "codec": "octopus", "bits": 2, "label": "octopus@2"}
    assert row_key(row) == ("perplexity", "p0", "octopus@2", 0)  # written before codec seeds
    assert row_key({**row, "codec_seed": 2}) == ("perplexity", "p0", "octopus@2", 2)
    assert row_key({**row, "codec_seed": 2}) != row_key(row) and "codec_seed" in ID_FIELDS
