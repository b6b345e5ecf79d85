"""Readers that turn input files into Arrow batches, never crashing on a bad file.

JSON Lines are *not* parsed here: the reader yields raw lines (`RAW_LINES`
schema) with file and line number, and the ingest stage parses and validates
them, so one bad line becomes one quarantine row instead of a dead job. A
truncated or corrupt compressed file ends its stream with a row carrying
`_read_error`, after every line that could still be read.
"""
from __future__ import annotations

import gzip
import io
import zlib
from typing import Iterator

import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

from datakit.contracts import RAW_LINES
from datakit.io.fs import InputError, filesystem, open_file

DEFAULT_BATCH_ROWS = 4096
# A line longer than this is not split further in memory than needed: the reader
# keeps only the first bytes and ingest quarantines it as `line_too_long`.
MAX_LINE_BYTES = 8 * 1024 * 1024


def _decompressed(url: str, raw) -> io.BufferedIOBase:
    if url.endswith(".zst") or url.endswith(".zstd"):
        return io.BufferedReader(_ZstdFrames(raw), 1 << 20)
    if url.endswith(".gz"):
        return gzip.GzipFile(fileobj=raw)  # type: ignore[return-value]
    return raw


class _ZstdFrames(io.RawIOBase):
    """Decompress concatenated zstd frames and *notice truncation*.

    `zstandard`'s stream_reader returns a clean EOF when the input stops in the
    middle of a frame; a truncated log would then lose its tail silently. Here
    input that ends inside a frame raises `EOFError`, which the line reader turns
    into a `truncated_file` quarantine row.
    """

    def __init__(self, raw) -> None:
        self._raw = raw
        self._d = zstandard.ZstdDecompressor().decompressobj()
        self._buf = b""
        self._in_frame = False

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        while not self._buf:
            chunk = self._raw.read(1 << 18)
            if not chunk:
                if self._in_frame:
                    raise EOFError("zstd stream ends inside a frame")
                return 0
            while chunk:
                self._in_frame = True
                self._buf += self._d.decompress(chunk)
                if self._d.eof:
                    chunk = self._d.unused_data
                    self._d = zstandard.ZstdDecompressor().decompressobj()
                    self._in_frame = False
                else:
                    chunk = b""
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n


def iter_raw_lines(url: str, batch_rows: int = DEFAULT_BATCH_ROWS, max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[pa.RecordBatch]:
    """Yield RAW_LINES batches for one JSON Lines file (plain, .gz or .zst)."""
    try:
        raw = open_file(url, "rb")
    except FileNotFoundError:
        raise InputError(f"input not found: {url}") from None
    except (PermissionError, OSError) as e:
        raise InputError(f"cannot read {url}: {e.__class__.__name__}") from None
    lines: list[bytes | None] = []
    numbers: list[int] = []
    errors: list[str | None] = []
    lineno = 0

    def flush() -> pa.RecordBatch:
        batch = pa.RecordBatch.from_arrays(
            [pa.array(lines, pa.binary()), pa.array([url] * len(lines), pa.string()),
             pa.array(numbers, pa.int64()), pa.array(errors, pa.string())],
            schema=RAW_LINES,
        )
        lines.clear(); numbers.clear(); errors.clear()
        return batch

    with raw:
        stream = _decompressed(url, raw)
        try:
            while True:
                line = stream.readline(max_line_bytes + 1)
                if not line:
                    break
                lineno += 1
                if len(line) > max_line_bytes and not line.endswith(b"\n"):
                    # keep a prefix for the quarantine, skip the rest of this line
                    while True:
                        rest = stream.readline(max_line_bytes)
                        if not rest or rest.endswith(b"\n"):
                            break
                    lines.append(line[:4096]); numbers.append(lineno); errors.append("line_too_long")
                else:
                    stripped = line.rstrip(b"\r\n")
                    if not stripped.strip():
                        continue
                    lines.append(stripped); numbers.append(lineno); errors.append(None)
                if len(lines) >= batch_rows:
                    yield flush()
        except (zstandard.ZstdError, EOFError, OSError, zlib.error) as e:
            # truncated/corrupt compressed stream: keep what was read, record the failure
            lines.append(None); numbers.append(lineno + 1)
            errors.append(f"truncated_file: {type(e).__name__}")
        if lines:
            yield flush()


def iter_parquet(url: str, batch_rows: int = 65536, columns: list[str] | None = None) -> Iterator[pa.RecordBatch]:
    """Yield batches of one Parquet file, with `_source_file`/`_source_line` (row number, 1-based)."""
    fs, p = filesystem(url)
    try:
        pf = pq.ParquetFile(p, filesystem=fs)
    except FileNotFoundError:
        raise InputError(f"input not found: {url}") from None
    except Exception as e:  # pyarrow raises ArrowInvalid for non-Parquet bytes
        raise InputError(f"cannot read Parquet file {url}: {e}") from None
    row = 0
    for batch in pf.iter_batches(batch_size=batch_rows, columns=columns):
        n = batch.num_rows
        batch = batch.append_column("_source_file", pa.array([url] * n, pa.string())) if "_source_file" not in batch.schema.names else batch
        if "_source_line" not in batch.schema.names:
            batch = batch.append_column("_source_line", pa.array(range(row + 1, row + n + 1), pa.int64()))
        row += n
        yield batch


def read_table(paths: list[str], columns: list[str] | None = None) -> pa.Table:
    """Read small side inputs (opt-out lists, eval files) fully: Parquet or JSON Lines by suffix."""
    import json

    tables = []
    for url in paths:
        if url.endswith(".parquet"):
            fs, p = filesystem(url)
            tables.append(pq.read_table(p, filesystem=fs, columns=columns))
        else:
            rows = []
            for batch in iter_raw_lines(url):
                for i, line in enumerate(batch.column("_raw").to_pylist()):
                    if line is None:
                        raise InputError(f"{url}: {batch.column('_read_error')[i].as_py()}")
                    try:
                        rows.append(json.loads(line))
                    except ValueError:
                        raise InputError(f"{url}:{batch.column('_source_line')[i].as_py()}: not valid JSON") from None
            t = pa.Table.from_pylist(rows)
            if columns:
                t = t.select([c for c in columns if c in t.schema.names])
            tables.append(t)
    if not tables:
        return pa.table({})
    return pa.concat_tables(tables, promote_options="permissive")
