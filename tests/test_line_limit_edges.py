"""The line-length limit counts a line's content: not its byte-order mark, not its line end.

Found in review: the reader read `max + 1` bytes per line and then removed the first line's byte-order
mark, so the first line of a file with a mark, at least `max - 2` bytes long (a 50 MB line from a Windows
tool), became two rows: its first `max - 2` bytes as a line of its own (`bad_json`, all ~8 MB of them
kept in `_quarantine/`) and the rest `line_too_long`. The file had one row more than lines and every
later line was numbered one too high. And a line of exactly `max` bytes was `line_too_long` with a CRLF
end, but not with LF.
"""
from __future__ import annotations

import pytest

from datakit.io.readers import iter_raw_lines

MAX = 64
BOM = b"\xef\xbb\xbf"


def _rows(tmp_path, data: bytes) -> list[tuple]:
    path = tmp_path / "a.jsonl"
    path.write_bytes(data)
    out = []
    for b in iter_raw_lines(str(path), max_line_bytes=MAX):
        out += zip(b.column("_source_line").to_pylist(), b.column("_read_error").to_pylist(),
                   b.column("_raw").to_pylist())
    return out


@pytest.mark.parametrize("bom", [b"", BOM])
@pytest.mark.parametrize("eol", [b"\n", b"\r\n"])
@pytest.mark.parametrize("length,too_long", [(MAX - 3, False), (MAX - 2, False), (MAX, False), (MAX + 1, True),
                                             (MAX + 3, True), (10 * MAX, True)])
def test_one_row_per_physical_line_whatever_the_mark_and_line_end(tmp_path, bom, eol, length, too_long):
    first = b"x" * length
    rows = _rows(tmp_path, bom + first + eol + b"second" + eol)
    assert [r[0] for r in rows] == [1, 2]  # one row per line, numbered as the file's lines
    assert rows[0][1] == ("line_too_long" if too_long else None)
    if not too_long:
        assert rows[0][2] == first
    assert rows[1][1:] == (None, b"second")


def test_a_last_line_without_its_end(tmp_path):
    assert [r[1] for r in _rows(tmp_path, BOM + b"x" * MAX)] == [None]
    assert [r[1] for r in _rows(tmp_path, BOM + b"x" * (MAX + 1))] == ["line_too_long"]
