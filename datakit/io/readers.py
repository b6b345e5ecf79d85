"""Readers that turn input files into Arrow batches, never crashing on a bad file.

JSON Lines are *not* parsed here: the reader yields raw lines (`RAW_LINES`
schema) with file and line number, and the ingest stage parses and validates
them, so one bad line becomes one quarantine row instead of a dead job. A
truncated or corrupt compressed file ends its stream with a row carrying
`_read_error`, after every line that could still be read.

Every physical line becomes exactly one row (a blank line is a row with
`_read_error = "blank_line"`), so `lines in the file == rows into ingest` and
nothing is skipped uncounted. A UTF-8 byte-order mark at the start of a file is
removed (Windows tools write one; it is not part of the first event).

Parquet *event* files take the same road (`iter_parquet_rows`): each row is
encoded as one JSON object in `_raw`, so ingest applies one rule set to both
formats, a file with a foreign schema or an unconvertible value costs
quarantine rows instead of the job, and a `"false"` string is never cast to a
boolean behind the validator's back.
"""
from __future__ import annotations

import base64
import bz2
import datetime as _dt
import decimal
import gzip
import io
import json
import lzma
import re
import sys
import zlib
from typing import Iterator

import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

from datakit.contracts import EDITOR_EVENT_V1, RAW_LINES
from datakit.io import storage
from datakit.io.fs import InputError, arrow_filesystem, filesystem, open_file, url_path
from datakit.io.url_secrets import hide_url_secrets

DEFAULT_BATCH_ROWS = 4096
# A line longer than this is not split further in memory than needed: the reader
# keeps only the first bytes and ingest quarantines it as `line_too_long`.
MAX_LINE_BYTES = 8 * 1024 * 1024
_BOM = b"\xef\xbb\xbf"


QUARANTINE_PREFIX_BYTES = 4096
_SEPARATORS = re.compile(rb'[\s"\',:;{}\[\]()<>]')


def quarantine_prefix(line: bytes) -> bytes:
    """What a `line_too_long` row keeps of its line: at most the first 4096 bytes, ending at a separator.

    Why the end is moved back: a secret the cut goes through would keep its first characters,
    too few for the quarantine scrubber to recognise as a key, and would be stored as they are
    (30 characters of a 48-character key, found in review). Ending after the last space, quote
    or JSON punctuation drops the word the cut went through, whatever it was.
    """
    prefix = line[:QUARANTINE_PREFIX_BYTES]
    if len(line) <= QUARANTINE_PREFIX_BYTES:
        return prefix
    last = None
    for last in _SEPARATORS.finditer(prefix):
        pass
    return prefix[: last.end()] if last is not None else b""


# a compressed file's format by its name (any case), else by its first bytes
_SUFFIXES = ((".zst", "zst"), (".zstd", "zst"), (".gz", "gz"), (".gzip", "gz"), (".bz2", "bz2"), (".xz", "xz"))
_MAGIC = ((b"\x28\xb5\x2f\xfd", "zst"), (b"\x1f\x8b", "gz"), (b"BZh", "bz2"), (b"\xfd7zXZ\x00", "xz"))


def compression_of(url: str, head: bytes) -> str | None:
    """"zst", "gz", "bz2", "xz" or None (plain text): by the file name's suffix in any case (`.GZ`,
    `.gzip`, `.ZST`), else by the first bytes (`head`) of a file named like plain text.

    Why the bytes too: found in review, `a.jsonl.GZ`, `b.jsonl.gzip`, `c.jsonl.bz2` and a gzip file named
    `e.jsonl` were read as text, every line quarantined as bad UTF-8, exit 0. No JSON line starts with
    these bytes (a line starts with `{`, or a byte-order mark), so a sniffed format is never a guess
    about text. A zstd skippable frame (`0x184D2A5?`, little-endian) starts a zstd file too."""
    low = url_path(url).lower()
    for suffix, kind in _SUFFIXES:
        if low.endswith(suffix):
            return kind
    for magic, kind in _MAGIC:
        if head.startswith(magic):
            return kind
    if len(head) >= 4 and head[1:4] == b"\x2a\x4d\x18" and head[0] & 0xF0 == 0x50:
        return "zst"
    return None


def _head(raw, n: int = 6) -> bytes:
    """The first `n` bytes of `raw`, left to be read again (b"" where that is not possible)."""
    peek = getattr(raw, "peek", None)
    if peek is not None:
        try:
            return peek(n)[:n]
        except (OSError, ValueError):
            return b""
    try:
        if raw.seekable():
            at = raw.tell()
            head = raw.read(n)
            raw.seek(at)
            return head
    except (OSError, ValueError, AttributeError):
        pass
    return b""


def _decompressed(url: str, raw) -> io.BufferedIOBase:
    kind = compression_of(url, _head(raw))
    if kind == "zst":
        return io.BufferedReader(_ZstdFrames(raw), 1 << 20)
    if kind == "gz":
        return gzip.GzipFile(fileobj=_NotEmpty(raw))  # type: ignore[return-value]
    if kind in ("bz2", "xz"):
        # the buffer `bz2.BZ2File` / `lzma.LZMAFile` read with: how much is decoded before a damaged block's check
        return io.BufferedReader(_Streams(_NotEmpty(raw), kind), io.DEFAULT_BUFFER_SIZE)
    if _object_store_file(raw):  # an object-store file (s3fs): its readline() takes no size limit
        return io.BufferedReader(raw, 1 << 20)  # type: ignore[arg-type]
    return raw


class _Bz2Damaged(ValueError):
    """bz2's error for damaged or foreign data (it raises a plain OSError, which here means storage)."""


class _TrailingGarbage(ValueError):
    """Bytes after a complete bz2/xz stream that start no stream (a damaged second stream, garbage)."""


class _Streams(io.RawIOBase):
    """bz2 or xz streams one after another (`pbzip2`, concatenated uploads), read as `bz2.BZ2File` and
    `lzma.LZMAFile` read them, except after a complete stream: those take bytes that start no stream
    as the end of the file. Found in review: a .bz2 or .xz whose second stream was damaged (or that had
    any garbage after its first) lost the lines after it silently, with no row and no warning (100 of
    200 lines, exit 0), where a .gz or .zst ends with a `truncated_file` row. Such bytes now raise
    `_TrailingGarbage`: the lines before are kept and the file ends with one `truncated_file` row.
    A damaged bz2 stream's OSError ("Invalid data stream") is `_Bz2Damaged` (an OSError means storage);
    xz's stream padding (NUL bytes, a multiple of 4, between or after streams) is part of the format."""

    HEAD = 12  # a new stream's first bytes, fed on their own: an xz stream header (a bz2 one is 4, its block magic 6 more)
    BUFFER = 1 << 17

    def __init__(self, raw, kind: str) -> None:
        self._raw = raw
        self._kind = kind
        self._d = self._new()
        self._pending = b""  # input read but not yet fed
        self._streams = 0  # complete streams read

    def readable(self) -> bool:
        return True

    def _new(self):
        return bz2.BZ2Decompressor() if self._kind == "bz2" else lzma.LZMADecompressor()

    def _decompress(self, data: bytes, size: int) -> bytes:
        try:
            return self._d.decompress(data, size)
        except OSError as e:
            if self._kind == "bz2" and "Invalid data stream" in str(e):
                raise _Bz2Damaged(str(e)) from None
            raise

    def _fill(self, n: int) -> None:
        while len(self._pending) < n:
            more = self._raw.read(self.BUFFER)
            if not more:
                return
            self._pending += more

    def _next_stream(self, size: int) -> bytes | None:
        """The first output of the stream after a complete one; None at the end of the input."""
        if self._kind == "xz":
            padding = 0
            while True:
                self._fill(1)
                kept = self._pending.lstrip(b"\0")
                padding += len(self._pending) - len(kept)
                self._pending = kept
                if kept or not self._pending and not self._raw_more():
                    break
            if padding % 4:
                raise _TrailingGarbage(f"{padding} NUL bytes after an xz stream (its padding is a multiple of 4)")
        self._fill(self.HEAD)
        if not self._pending:
            return None
        head, self._pending = self._pending[:self.HEAD], self._pending[self.HEAD:]
        self._d = self._new()
        try:
            return self._decompress(head, size)
        except (_Bz2Damaged, OSError, lzma.LZMAError) as e:
            raise _TrailingGarbage(f"bytes after {self._streams} complete {self._kind} stream(s) start no stream "
                                   f"({type(e).__name__})") from None

    def _raw_more(self) -> bool:
        more = self._raw.read(self.BUFFER)
        self._pending += more
        return bool(more)

    def readinto(self, b) -> int:
        size = len(b)
        while True:
            if self._d.eof:
                self._streams += 1
                self._pending = self._d.unused_data + self._pending
                data = self._next_stream(size)
                if data is None:
                    return 0
            else:
                chunk = b""
                if self._d.needs_input:
                    self._fill(1)
                    if not self._pending:
                        raise EOFError("Compressed file ended before the end-of-stream marker was reached")
                    chunk, self._pending = self._pending, b""
                data = self._decompress(chunk, size)
            if data:
                b[:len(data)] = data
                return len(data)


def _failed_checksum(e: BaseException) -> bool:
    """A compressed stream whose check failed (gzip's CRC or length, zstd's content checksum, a bz2
    block's CRC): bytes were decoded from damaged data, so lines already read may be wrong."""
    text = str(e).lower()
    return any(k in text for k in ("crc", "checksum", "incorrect length", "invalid data stream", "corrupt input data"))


def _object_store_file(raw) -> bool:
    """fsspec's buffered file (s3fs and others); only looked up when fsspec is loaded, which opening
    such a file did (a local file is a plain `open()` and never needs fsspec, see datakit/io/fs.py)."""
    spec = sys.modules.get("fsspec.spec")
    return spec is not None and isinstance(raw, spec.AbstractBufferedFile)


class _NotEmpty(io.RawIOBase):
    """A compressed file's bytes, where a file of no bytes at all is an `EOFError` (a truncated file).

    Why: an empty .gz or .zst is not a compressed empty text (that has a header: 20 bytes of gzip, 9
    of zstd); it is what a failed upload or copy leaves, and it read as a day without events, exit 0
    (found in review). The line reader turns the error into a `truncated_file` quarantine row, as for
    a file cut inside a frame."""

    def __init__(self, raw) -> None:
        self._raw = raw
        self._seen = False

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        data = self._raw.read(len(b))
        if not data and not self._seen:
            raise EOFError("the compressed file is empty (0 bytes)")
        self._seen = True
        n = len(data)
        b[:n] = data
        return n


class _ZstdFrames(io.RawIOBase):
    """Decompress concatenated zstd frames, *notice truncation*, in bounded memory.

    `zstandard`'s stream_reader returns a clean EOF when the input stops in the
    middle of a frame; a truncated log would then lose its tail silently. Here
    input that ends inside a frame raises `EOFError`, which the line reader turns
    into a `truncated_file` quarantine row.

    Fed one block at a time: the compressed input is cut where the frame format says its blocks
    start (`_unit`: a frame's header goes with its first block, its checksum with its last), and a
    zstd block makes at most 128 KB, so no decompress call makes more than that. Why blocks:

    - bounded: a decompress call returns all it can make of its input, and zstd can make ~43,000
      bytes of one (a 16 KB file of 512 MB of one letter: found in review, 1.5 GB peak and time
      growing with the square of the size, as every read also copied the rest of the buffer);
    - nothing before damage is lost: a call that fails returns nothing of what it decoded. Found in
      review: input fed in steps of up to 256 KB (sized from the ratio seen so far, 256 KB after a
      first 1 KB that completed no block) made a 250 KB file with one damaged byte anywhere, even
      at 98 %, one `unreadable_file` row ("not this format at all"), its 389 lines lost, exit 0.

    The cuts only decide how much is fed per call: every byte reaches the decompressor in order,
    and the decompressor alone says where a frame ends, so input the cutting misreads (garbage) is
    fed in small pieces and fails or decodes exactly as it would whole. Reads hand out slices of
    the last output by offset.
    """

    IN_MIN, IN_MAX = 1 << 10, 1 << 18
    _MAGIC = 0xFD2FB528

    def __init__(self, raw) -> None:
        self._raw = _NotEmpty(raw)
        self._d = zstandard.ZstdDecompressor().decompressobj()
        self._buf = b""
        self._pos = 0
        self._pending = b""  # compressed bytes read but not yet fed, from `_off`
        self._off = 0
        self._blocks = False  # the next unit is a block of the current frame (else: a frame starts)
        self._checksum = False  # the current frame ends with a 4-byte checksum
        self._skip = 0  # bytes of a skippable frame still to feed
        self._in_frame = False
        self._error: Exception | None = None

    def readable(self) -> bool:
        return True

    def _fill(self, n: int) -> int:
        """Make `n` unfed bytes available if the input has them; the number available."""
        while len(self._pending) - self._off < n:
            more = self._raw.read(max(self.IN_MAX, n - (len(self._pending) - self._off)))
            if not more:
                break
            self._pending = self._pending[self._off:] + more
            self._off = 0
        return len(self._pending) - self._off

    def _take(self, n: int) -> bytes:
        self._fill(n)
        piece = self._pending[self._off:self._off + n]
        self._off += len(piece)
        return piece

    def _le(self, at: int, size: int) -> int:
        return int.from_bytes(self._pending[self._off + at:self._off + at + size], "little")

    def _unit(self) -> bytes:
        """The next piece of input to decompress (see the class doc); b"" at the end of the input."""
        if self._skip:  # a skippable frame makes no output: fed in steps
            piece = self._take(min(self._skip, self.IN_MAX))
            self._skip = self._skip - len(piece) if piece else 0
            return piece
        if self._blocks:
            if self._fill(3) < 3:
                return self._take(3)
            header = self._le(0, 3)
            last, kind, size = header & 1, header >> 1 & 3, header >> 3
            if last:
                self._blocks = False
            return self._take(3 + (1 if kind == 1 else size) + (4 if last and self._checksum else 0))
        if self._fill(4) < 4:
            return self._take(4)
        magic = self._le(0, 4)
        if magic & 0xFFFFFFF0 == 0x184D2A50 and self._fill(8) >= 8:
            self._skip = 8 + self._le(4, 4)
            return self._unit()
        if magic != self._MAGIC or self._fill(5) < 5:
            return self._take(self.IN_MIN)  # not a frame: the decompressor says what it is
        fhd = self._le(4, 1)
        single = fhd >> 5 & 1
        size = 5 + (0 if single else 1) + (0, 1, 2, 4)[fhd & 3] + (single, 2, 4, 8)[fhd >> 6]
        self._checksum, self._blocks = bool(fhd >> 2 & 1), True
        return self._take(size) + self._unit()

    def _more(self) -> bool:
        """Decompress the next block of input into `_buf`; False at the end of the input."""
        piece = self._unit()
        if not piece:
            if self._in_frame:
                raise EOFError("zstd stream ends inside a frame")
            return False
        self._in_frame = True
        try:
            out = self._d.decompress(piece)
        except zstandard.ZstdError as e:
            # damage, or garbage after a good frame: what was decoded before it was handed out; now fail
            self._error = e
            return True
        if self._d.eof:  # a frame ended (inside this piece, if the cutting misread it): the rest starts the next
            if self._d.unused_data:
                self._pending = self._d.unused_data + self._pending[self._off:]
                self._off = 0
            self._d = zstandard.ZstdDecompressor().decompressobj()
            self._in_frame = False
            self._blocks, self._skip = False, 0
        self._buf, self._pos = out, 0
        return True

    def readinto(self, b) -> int:
        while self._pos >= len(self._buf):
            if self._error is not None:
                raise self._error
            if not self._more():
                return 0
        n = min(len(b), len(self._buf) - self._pos)
        b[:n] = memoryview(self._buf)[self._pos:self._pos + n]
        self._pos += n
        return n


def iter_raw_lines(url: str, batch_rows: int = DEFAULT_BATCH_ROWS, max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[pa.RecordBatch]:
    """Yield RAW_LINES batches for one JSON Lines file (plain, .gz or .zst)."""
    try:
        raw = open_file(url, "rb")
    except FileNotFoundError:
        raise InputError(f"input not found: {url}") from None
    except PermissionError as e:
        raise InputError(f"cannot read {url}: {e.__class__.__name__}") from None
    except Exception as e:
        if storage.is_storage_error(e):  # still failing after the IO layer's retries: a job failure
            raise storage.describe(e, url, "open") from None
        if isinstance(e, OSError):  # a folder, a broken link...: the user's input
            raise InputError(f"cannot read {url}: {e.__class__.__name__}") from None
        raise
    lines: list[bytes | None] = []
    numbers: list[int] = []
    errors: list[str | None] = []
    offsets: list[int] = []
    lineno = 0
    pos = 0  # byte offset of the next line in the decompressed stream
    shown = hide_url_secrets(url)  # the rows' `_source_file`: a presigned URL's signature is not recorded

    def flush() -> pa.RecordBatch:
        batch = pa.RecordBatch.from_arrays(
            [pa.array(lines, pa.binary()), pa.array([shown] * len(lines), pa.string()),
             pa.array(numbers, pa.int64()), pa.array(errors, pa.string()), pa.array(offsets, pa.int64())],
            schema=RAW_LINES,
        )
        lines.clear(); numbers.clear(); errors.clear(); offsets.clear()
        return batch

    with raw:
        stream = _decompressed(url, raw)
        try:
            while True:
                # room for a line of `max_line_bytes` with its "\r\n", and for the first line's byte-order
                # mark. Found in review: the mark took 3 bytes of the old `max + 1`, so the first line of a
                # file with a mark, 8 MB long or more, was cut in two rows (its first 8 MB a `bad_json` row
                # keeping all of them, its rest `line_too_long`), one row more than the file's lines and
                # every later line numbered one too high; and a line of exactly `max` bytes was too long
                # with a CRLF end and not with LF.
                limit = max_line_bytes + 2 + (len(_BOM) if lineno == 0 else 0)
                line = stream.readline(limit)
                if not line:
                    break
                lineno += 1
                offsets.append(pos)
                pos += len(line)
                cut = len(line) == limit and not line.endswith(b"\n")  # the line goes on past what was read
                if lineno == 1 and line.startswith(_BOM):
                    line = line[len(_BOM):]
                    offsets[-1] += len(_BOM)
                stripped = line if cut else line.rstrip(b"\r\n")
                if cut or len(stripped) > max_line_bytes:
                    # keep a prefix for the quarantine, skip the rest of this line
                    while cut:
                        rest = stream.readline(max_line_bytes)
                        pos += len(rest)
                        if not rest or rest.endswith(b"\n"):
                            break
                    lines.append(quarantine_prefix(line)); numbers.append(lineno); errors.append("line_too_long")
                elif not stripped.strip():  # counted, not skipped: ingest drops it as `blank_line`
                    lines.append(None); numbers.append(lineno); errors.append("blank_line")
                else:
                    lines.append(stripped); numbers.append(lineno); errors.append(None)
                if len(lines) >= batch_rows:
                    yield flush()
        except (zstandard.ZstdError, EOFError, gzip.BadGzipFile, zlib.error, lzma.LZMAError, _Bz2Damaged,
                _TrailingGarbage) as e:
            # truncated/corrupt compressed stream: keep what was read, record the failure.
            # (Any other OSError is storage failing, not the file: it propagates, never "truncated".)
            # nothing decoded at all: not this format (a `.gz` that is no gzip), not a file cut short
            # (found in review: a plain text file named .gz was "truncated_file: BadGzipFile")
            never = lineno == 0 and pos == 0 and not isinstance(e, EOFError)
            if not never and _failed_checksum(e):
                # found in review: a .gz with one flipped byte kept all its lines (one with another
                # user_id, which an opt-out list would no longer match) and was reported "truncated":
                # the lines before the check are not known to be right, so the file is refused
                raise InputError(f"{url}: the compressed file failed its integrity check ({type(e).__name__}: "
                                 f"{str(e)[:120]}) after line {lineno}: its bytes are damaged and the lines read "
                                 "from it may be wrong; replace the file, or remove it from the input") from None
            if len(offsets) > len(lines):  # the failing read was counted as a line start
                offsets.pop()
            lines.append(None); numbers.append(lineno + 1); offsets.append(pos)
            errors.append(f"{'unreadable_file' if never else 'truncated_file'}: {type(e).__name__}")
        if lines:
            yield flush()


BATCH_BYTES = 8 << 20  # uncompressed bytes per batch of a Parquet input: the batch size of a 2 KB-per-row JSONL read


def parquet_batch_rows(pf: pq.ParquetFile, target_bytes: int = BATCH_BYTES) -> int:
    """Rows per batch so that one batch holds ~`target_bytes` of data (256..65536).

    Why by bytes: every stage makes a few copies of its batch (texts, normalized bytes, keys), so
    a fixed 65536 rows of 2 KB code records made a 20k-record file one 40 MB batch and added
    ~200 MB to a dedup run's peak; 64 K rows of small events stay one batch as before."""
    meta = pf.metadata
    size = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
    per_row = size / max(1, meta.num_rows)
    return int(min(65536, max(256, target_bytes // max(1.0, per_row))))


def read_parquet_table(url: str, columns: list[str] | None = None) -> pa.Table:
    """One whole Parquet file of any storage (a small table: state, a side output's part). Why a helper:
    `pq.read_table` given a path without its filesystem looks on local disk (found in review: `datakit
    forget` on an s3:// dataset failed reading its dedup state, and the deleted user's rows stayed)."""
    fs, p = filesystem(url)
    return pq.read_table(p, columns=columns, filesystem=arrow_filesystem(fs))


def iter_parquet(url: str, batch_rows: int | None = None, columns: list[str] | None = None) -> Iterator[pa.RecordBatch]:
    """Yield batches of one Parquet file, with `_source_file`/`_source_line` (row number, 1-based);
    `batch_rows` None: `parquet_batch_rows` (about 8 MB of data per batch)."""
    fs, p = filesystem(url)
    try:
        pf = pq.ParquetFile(p, filesystem=arrow_filesystem(fs))
    except FileNotFoundError:
        raise InputError(f"input not found: {url}") from None
    except Exception as e:  # pyarrow raises ArrowInvalid for non-Parquet bytes
        raise InputError(f"cannot read Parquet file {url}: {e}") from None
    row = 0
    shown = hide_url_secrets(url)  # the rows' `_source_file`: a presigned URL's signature is not recorded
    for batch in pf.iter_batches(batch_size=batch_rows or parquet_batch_rows(pf), columns=columns):
        n = batch.num_rows
        batch = batch.append_column("_source_file", pa.array([shown] * n, pa.string())) if "_source_file" not in batch.schema.names else batch
        if "_source_line" not in batch.schema.names:
            batch = batch.append_column("_source_line", pa.array(range(row + 1, row + n + 1), pa.int64()))
        row += n
        yield batch


def iter_source(url: str, fmt: str, schema: pa.Schema | None) -> Iterator[pa.RecordBatch]:
    """The batches of one Source file, the same on both engines.

    JSON Lines and Parquet *raw events* (a Source declared with the `RAW_LINES`
    schema, i.e. read for the ingest stage) yield `RAW_LINES`; other Parquet
    yields the file's own batches, which the engine conforms to the contract.
    """
    if fmt == "jsonl":
        yield from iter_raw_lines(url)
    elif schema is not None and schema.equals(RAW_LINES):
        yield from iter_parquet_rows(url)
    else:
        yield from iter_parquet(url)


def _json_default(v):
    """JSON for the Python values Arrow hands out that JSON has no type for.

    Timestamps and dates become ISO-8601 strings (a typed timestamp *is* a
    timestamp); every other non-JSON value (bytes, decimals, durations) becomes
    a tagged object, so the validator sees "not a string" and quarantines the
    row as `wrong_type` instead of guessing a conversion.
    """
    if isinstance(v, (_dt.datetime, _dt.date)):
        return v.isoformat()
    if isinstance(v, (bytes, bytearray)):
        return {"$binary": base64.b64encode(bytes(v)).decode()}
    if isinstance(v, decimal.Decimal):
        return {"$decimal": str(v)}
    return {"$value": type(v).__name__}


def _column_values(col: pa.Array) -> tuple[list, list[bool]]:
    """Python values of one column; values Arrow cannot convert (a timestamp beyond year 9999,
    say) are None with a flag, so one bad cell costs its row, never the batch.

    A nanosecond timestamp is truncated to microseconds first: Arrow hands one out as a pandas
    Timestamp when pandas is loaded and refuses it otherwise, so the same file was a kept event in a
    script that had imported pandas and `bad_value` through the `datakit` command, which keeps pandas
    out (found in review). Ingest keeps milliseconds, so the truncation changes no output."""
    if pa.types.is_timestamp(col.type) and col.type.unit == "ns":
        col = col.cast(pa.timestamp("us", col.type.tz), safe=False)
    try:
        return col.to_pylist(), [False] * len(col)
    except Exception:  # noqa: BLE001 - any conversion error is that cell's problem
        vals, bad = [], []
        for i in range(len(col)):
            try:
                vals.append(col[i].as_py()); bad.append(False)
            except Exception:  # noqa: BLE001
                vals.append(None); bad.append(True)
        return vals, bad


def _same_json(a, b) -> bool:
    """Whether two cells of one column name are the same value *as JSON*, the rule ingest applies to a
    JSON key given twice. Found in review: Python says `0 == False` and `5 == 5.0`, so a row with an int64
    `privacy_mode` column 0 then a bool one false kept `false` (JSON Lines: `duplicate_key`), and in the
    other column order the row was `wrong_type` instead; an equal repeat is still harmless."""
    if a is b:
        return True
    try:
        return _as_json(a) == _as_json(b)
    except (ValueError, TypeError, RecursionError):
        return False


def _as_json(v) -> str:
    return json.dumps(v, sort_keys=True, default=_json_default, ensure_ascii=True)


def _rows_as_json(batch: pa.RecordBatch, known: frozenset[str]) -> tuple[list[bytes | None], list[str | None]]:
    """Encode each row of a Parquet batch as one JSON object (bytes), or give the row's read error.

    Two columns with the same name are read like duplicate JSON keys: equal values
    are fine, different values make the row `duplicate_key` (a second
    `privacy_mode` column must never be able to turn privacy off).
    """
    n = batch.num_rows
    names = batch.schema.names
    cols = [_column_values(c) for c in batch.columns]
    raws: list[bytes | None] = []
    errs: list[str | None] = []
    for i in range(n):
        row: dict = {}
        err = None
        for name, (vals, bad) in zip(names, cols):
            label = name if name in known else "(other column)"
            if bad[i]:
                err = err or f"bad_value: {label}"
            elif name in row and not _same_json(row[name], vals[i]):
                err = err or f"duplicate_key: {label}"
            else:
                row[name] = vals[i]
        if err is None:
            try:
                raws.append(json.dumps(row, default=_json_default, ensure_ascii=False).encode("utf-8"))
            except (ValueError, TypeError, RecursionError) as e:
                raws.append(None); errs.append(f"bad_value: {type(e).__name__}")
                continue
            errs.append(None)
        else:
            raws.append(None); errs.append(err)
    return raws, errs


def iter_parquet_rows(url: str, batch_rows: int = DEFAULT_BATCH_ROWS) -> Iterator[pa.RecordBatch]:
    """Yield RAW_LINES batches for one Parquet file of editor events: one JSON object per row.

    A file that is not Parquet at all is one `unreadable_file` row; a row group
    that cannot be decoded is one `damaged_row_group` row per row it held (its
    rows read before the damage kept), and the file's other row groups are read:
    every row the footer counts is a row in or a reason.
    """
    known = frozenset(EDITOR_EVENT_V1.names)
    fs, p = filesystem(url)
    row = 0
    shown = hide_url_secrets(url)  # the rows' `_source_file`: a presigned URL's signature is not recorded

    def batch_of(raws, errs, start) -> pa.RecordBatch:
        return pa.RecordBatch.from_arrays(
            [pa.array(raws, pa.binary()), pa.array([shown] * len(raws), pa.string()),
             pa.array(range(start + 1, start + len(raws) + 1), pa.int64()), pa.array(errs, pa.string()),
             pa.nulls(len(raws), pa.int64())],
            schema=RAW_LINES)

    try:
        pf = pq.ParquetFile(p, filesystem=arrow_filesystem(fs))
    except FileNotFoundError:
        raise InputError(f"input not found: {url}") from None
    except Exception as e:  # noqa: BLE001 - pyarrow raises ArrowInvalid/OSError for non-Parquet bytes
        if not _parquet_damage(e):
            raise
        # pyarrow's reason, which names no data ("Parquet magic bytes not found", "schema too deeply
        # nested"): the row said only `OSError` (found in review)
        why = (str(e).strip().splitlines() or [""])[0][:200]
        yield batch_of([None], [f"unreadable_file: {type(e).__name__}" + (f": {why}" if why else "")], 0)
        return
    # One row group at a time: a damaged one costs its own rows, each a `damaged_row_group` row (the
    # footer says how many), and the row groups after it are still read. Found in review: the reader
    # cut batches across row groups and stopped at the damage, so one bad row group at the end of a
    # 3000-row file lost the 2500 readable rows before it, and the lost rows were counted nowhere.
    groups = pf.metadata.num_row_groups
    for g in range(groups):
        size = pf.metadata.row_group(g).num_rows
        done = 0
        try:
            for batch in pf.iter_batches(batch_size=batch_rows, row_groups=[g]):
                raws, errs = _rows_as_json(batch, known)
                yield batch_of(raws, errs, row + done)
                done += batch.num_rows
        except Exception as e:  # noqa: BLE001 - a corrupt page: this row group's other rows are lost
            if not _parquet_damage(e):
                raise
            lost = max(size - done, 1)
            why = f"damaged_row_group: row group {g + 1} of {groups} unreadable ({type(e).__name__})"
            for start in range(0, lost, batch_rows):
                n = min(batch_rows, lost - start)
                yield batch_of([None] * n, [why] * n, row + done + start)
        row += max(size, done)


def _parquet_damage(e: BaseException) -> bool:
    """pyarrow's own errors mean the bytes are not (valid) Parquet; errors raised by the storage
    stack under it (botocore, aiohttp, s3fs) mean reading failed and must not pass as bad input.

    pyarrow reports a page it cannot decode ("Corrupt snappy compressed data.", "Invalid
    BYTE_ARRAY value") as a plain `OSError` with no errno, which is how its IOError status without
    an OS error code reaches Python; an operating system's read failure carries its errno, s3fs
    gives an unknown error EIO or a subclass (PermissionError, FileNotFoundError, TimeoutError), and
    an exception a Python file object raised comes back as itself. Such a page was reported as a
    storage error and failed the run with exit 3 (found in review)."""
    if (type(e).__module__ or "").startswith("pyarrow"):
        return True
    return type(e) is OSError and e.errno is None and e.__cause__ is None
