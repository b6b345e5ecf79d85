"""Bytes after a complete bz2/xz stream that start no stream end the file with a `truncated_file` row.

Found in review: `bz2.BZ2File` and `lzma.LZMAFile` take such bytes as the end of the file, so a .bz2 or
.xz whose second stream was damaged, or that had garbage after its first, lost the lines after it with
no row and no warning (100 of 200 lines, exit 0), where a .gz or .zst ends with `truncated_file`. And
an .xz with stream padding between its streams (NUL bytes, which the format allows) lost its second
stream's lines the same way.
"""
from __future__ import annotations

import bz2
import lzma

import pytest

from datakit.io.readers import iter_raw_lines

FIRST = b"".join(b'{"n": %d}\n' % i for i in range(100))
SECOND = b"".join(b'{"n": %d}\n' % i for i in range(100, 200))
COMPRESS = {"bz2": bz2.compress, "xz": lzma.compress}


def _rows(tmp_path, ext: str, data: bytes) -> list[tuple]:
    path = tmp_path / f"a.jsonl.{ext}"
    path.write_bytes(data)
    return [(r["_raw"], r["_read_error"]) for b in iter_raw_lines(str(path)) for r in b.to_pylist()]


def _damaged(data: bytes, at: int) -> bytes:
    b = bytearray(data)
    b[at] ^= 0x20
    return bytes(b)


@pytest.mark.parametrize("ext", ["bz2", "xz"])
@pytest.mark.parametrize("after", ["damaged_stream", "garbage"])
def test_what_follows_a_stream_and_is_none_is_a_truncated_file(tmp_path, ext, after):
    c = COMPRESS[ext]
    tail = _damaged(c(SECOND), 1) if after == "damaged_stream" else b"\x00garbage"
    rows = _rows(tmp_path, ext, c(FIRST) + tail)
    assert [r[0] for r in rows[:-1]] == FIRST.splitlines()
    assert rows[-1] == (None, "truncated_file: _TrailingGarbage")


@pytest.mark.parametrize("ext", ["bz2", "xz"])
def test_streams_one_after_another_are_all_read(tmp_path, ext):
    c = COMPRESS[ext]
    rows = _rows(tmp_path, ext, c(FIRST) + c(b"") + c(SECOND))
    assert [r[0] for r in rows] == (FIRST + SECOND).splitlines() and not any(r[1] for r in rows)


def test_xz_stream_padding_is_part_of_the_format(tmp_path):
    rows = _rows(tmp_path, "xz", lzma.compress(FIRST) + b"\x00" * 8 + lzma.compress(SECOND) + b"\x00" * 4)
    assert [r[0] for r in rows] == (FIRST + SECOND).splitlines() and not any(r[1] for r in rows)
    rows = _rows(tmp_path, "xz", lzma.compress(FIRST) + b"\x00" * 3)  # not a multiple of 4: not padding
    assert rows[-1] == (None, "truncated_file: _TrailingGarbage")
