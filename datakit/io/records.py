"""Reading the texts of a dataset someone hands us: records Parquet/JSON Lines, any table with a text column.

Why here (not in the contamination check): the check's scan and the n-gram index build read the
same files and must see the same texts, the same skipped lines and the same errors; both go
through this module. Files are read in sorted order; a Parquet file may be read by row groups
(so a few big files still split into many tasks).

Which columns: the caller's `ColumnChoice`, asked once per Parquet file (its schema) and once
per batch of JSON Lines (the keys of its objects).
"""
from __future__ import annotations

import json
from typing import Any, Callable, Iterator, Sequence

import pyarrow as pa

from datakit.io.fs import InputError, arrow_filesystem, expand, filesystem, names_one_object, url_path

# JSON Lines under every compression the reader reads (io/readers.compression_of), also named `.json.gz`
# and so on as Dolma and RedPajama shards are: found in review, a folder's `shard-0001.json.gz` and
# `shard-0003.jsonl.bz2`, holding 60 HumanEval items, were left out of a check without a word (a plain
# `.json` stays out: it is as often one JSON document, a manifest or a config; a check names what it skips)
_JSON_LINES_COMPRESSIONS = (".gz", ".gzip", ".zst", ".zstd", ".bz2", ".xz")
DATA_SUFFIXES = (".parquet", ".jsonl", ".ndjson",
                 *(f"{base}{c}" for base in (".jsonl", ".ndjson", ".json") for c in _JSON_LINES_COMPRESSIONS))
LINE_COLUMN = "__line"  # JSON Lines tables: each row's line number in its file (for locators)
# (column names, file url) -> the columns to read; the caller's rule (the texts of a record are a
# stage's business: `datakit.stages.texts`), raising InputError when a file has none
ColumnChoice = Callable[[Sequence[str], str], list[str]]


def data_files(paths: str | Sequence[str]) -> list[str]:
    """The data files of `paths` (files, folders, globs, fsspec URLs), sorted; InputError if none."""
    return expand(paths, suffixes=DATA_SUFFIXES)


def open_parquet(url: str):
    import pyarrow.parquet as pq

    fs, p = filesystem(url)
    try:
        return pq.ParquetFile(p, filesystem=arrow_filesystem(fs))
    except FileNotFoundError:
        raise InputError(f"input not found: {url}") from None
    except Exception as e:  # ArrowInvalid for non-Parquet bytes
        raise InputError(f"cannot read Parquet file {url}: {type(e).__name__}") from None


def iter_tables(url: str, columns: ColumnChoice, batch_rows: int = 8192, stats: dict | None = None,
                row_groups: Sequence[int] | None = None) -> Iterator[tuple[int, pa.Table]]:
    """(first row, batch of the `columns` it chose) of one data file; `row_groups`: only those (Parquet).

    JSON Lines: blank lines are not data; lines that are not JSON objects are skipped and counted
    in `stats["skipped_lines"]`; a truncated compressed file is an InputError (a gate must not answer
    for data it never saw)."""
    if not url_path(url).endswith(".parquet"):
        yield from _jsonl_tables(url, columns, batch_rows, stats)
        return
    pf = open_parquet(url)
    cols = columns(pf.schema_arrow.names, url)
    row = 0
    groups = list(row_groups) if row_groups is not None else None
    for rb in pf.iter_batches(batch_size=batch_rows, row_groups=groups, columns=cols):
        yield row, pa.Table.from_batches([rb])
        row += rb.num_rows


def _jsonl_tables(url: str, columns: ColumnChoice, batch_rows: int, stats: dict | None) -> Iterator[tuple[int, pa.Table]]:
    from datakit.io.readers import iter_raw_lines

    rows: list[dict] = []
    lines: list[int] = []
    first = 0
    for rb in iter_raw_lines(url, batch_rows=batch_rows):
        for raw, err, lineno in zip(rb.column("_raw").to_pylist(), rb.column("_read_error").to_pylist(),
                                    rb.column("_source_line").to_pylist()):
            if err is not None and err.startswith("truncated_file"):
                raise InputError(f"{url}: truncated or corrupt compressed file (unreadable from line {lineno}); "
                                 "the file is refused (a verdict or an index of part of it would answer for lines "
                                 "never read)")
            if err == "blank_line":  # not data: never counted as a skipped line
                continue
            if err == "line_too_long":  # data this reader does not read: never a shorter dataset
                from datakit.io.readers import MAX_LINE_BYTES

                raise InputError(f"{url}: line {lineno} is longer than {MAX_LINE_BYTES >> 20} MiB, more than this "
                                 "reader reads; the file is refused (store records that large as Parquet)")
            try:
                if err is not None or raw is None:
                    raise ValueError
                try:
                    obj = json.loads(raw)
                except UnicodeDecodeError:
                    # one byte that is not UTF-8 (a latin-1 `é` in a comment) skipped the whole line, and the
                    # document in it went unread (found in review): read it with U+FFFD for the bad bytes,
                    # and count it
                    obj = json.loads(raw.decode("utf-8", "replace"))
                    if stats is not None:
                        stats["lines_not_utf8"] = stats.get("lines_not_utf8", 0) + 1
                if not isinstance(obj, dict):
                    raise ValueError
            except (ValueError, RecursionError):  # RecursionError: nesting deeper than the JSON parser goes
                if stats is not None:
                    stats["skipped_lines"] = stats.get("skipped_lines", 0) + 1
                continue
            rows.append(obj)
            lines.append(lineno)
            if len(rows) >= batch_rows:
                yield first, _rows_table(url, rows, columns, lines, stats)
                first += len(rows)
                rows, lines = [], []
    if rows:
        yield first, _rows_table(url, rows, columns, lines, stats)


def _rows_table(url: str, rows: list[dict], columns: ColumnChoice, lines: list[int] | None = None,
                stats: dict | None = None) -> pa.Table:
    """The batch's chosen columns. Why per row, not per batch, for the text: JSON Lines rows need not
    share keys. A row with `content` in a batch whose first text key was `text` was read as empty, so
    the same rows split over two files got another verdict; `segments` written as a string was read
    one character per segment (found in review). Every generic text key of a batch is a column of its
    own when the caller chooses them automatically, so a row's text is read under its own key.

    A row that holds none of the text keys is not a document of empty text: it is skipped and counted
    with the unreadable lines (`skipped_lines`, and `rows_without_text`), so a verdict never covers text
    it did not read (found in review: a chat row, `{"messages": [...]}`, among `{"text": ...}` rows was
    scanned as empty and the file checked clean)."""
    names = set().union(*(r.keys() for r in rows))
    chosen = columns(sorted(names), url)
    texts = [c for c in chosen if c not in ("doc_id", "id")] or chosen
    keys = set(texts)
    plain = getattr(columns, "plain_text_fields", ())  # (decontaminate.check.Columns: what a plain row holds)
    if plain and "segments" in chosen:
        rows = _plain_rows_as_segments(rows, texts, plain)
    has_text = [any(r.get(k) is not None for k in keys) for r in rows]
    if not all(has_text):
        if stats is not None:
            n = has_text.count(False)
            stats["skipped_lines"] = stats.get("skipped_lines", 0) + n
            stats["rows_without_text"] = stats.get("rows_without_text", 0) + n
        rows = [r for r, ok in zip(rows, has_text) if ok]
        if lines is not None:
            lines = [ln for ln, ok in zip(lines, has_text) if ok]
    data: dict[str, Any] = {}
    for c in chosen:
        if c == "segments":
            data[c] = pa.array([_segments(r.get(c)) for r in rows], pa.list_(pa.struct([("text", pa.string())])))
        else:
            data[c] = _texts_of([r.get(c) for r in rows])
    if lines is not None:
        data[LINE_COLUMN] = pa.array(lines, pa.int64())
    return pa.table(data)


def _plain_rows_as_segments(rows: list[dict], record_columns: Sequence[str], plain: Sequence[str]) -> list[dict]:
    """Rows of a batch read as training records (its key set holds `segments`) that hold none of the
    `record_columns` but a `plain` text field (`text`, `content`, `code`): read as one-segment
    records. Why: the text columns are chosen from the batch's keys, so a `{"text": ...}` row in a
    batch with `segments` rows was skipped as a row without text, and whether it was scanned depended
    on which rows shared its batch (found in review)."""
    out = []
    for r in rows:
        if all(r.get(c) is None for c in record_columns):
            k = next((f for f in plain if r.get(f) is not None), None)
            if k is not None:
                r = {**r, "segments": [{"text": _str(r[k])}]}
        out.append(r)
    return out


def _segments(v: Any) -> list[dict[str, str | None]]:
    """A JSON row's `segments` as [{text}]: a list of segment objects (or strings), one object, or one
    string: every text the row holds, never a string read one character at a time."""
    if v is None:
        return []
    if isinstance(v, dict):
        return [{"text": _str(v.get("text"))}]
    if not isinstance(v, list):
        return [{"text": _str(v)}]
    return [{"text": _str(s.get("text")) if isinstance(s, dict) else _str(s)} for s in v]


def _texts_of(values: list[Any]) -> pa.Array:
    """One column of JSON values as Parquet's reader sees the same column (`stages.texts.text_piece`):
    strings, or, when any row holds a list, a list of texts per row (each element a text of its own,
    `_str`; a scalar or object row one text). Why: a JSON row's list was one "\n"-joined text while a
    Parquet list column's elements are texts of their own, so n-grams spanning two chat messages
    matched in JSON Lines only: the same rows got another verdict in another format."""
    if not any(isinstance(v, list) for v in values):
        return pa.array([_str(v) for v in values], pa.string())
    return pa.array([None if v is None else [_str(e) for e in v] if isinstance(v, list) else [_str(v)]
                     for v in values], pa.list_(pa.string()))


def _str(v: Any) -> str | None:
    """A JSON value's text, as `stages.texts.as_text` reads the same value from Parquet: an object's
    `text`, else its `content` (a chat message), else its values' texts joined by "\n"; a list's
    elements' texts joined by "\n"; a scalar as Arrow casts it. (A list or object was read as its JSON
    source, escapes and all, so a Parquet copy of the same rows was read as other text.)"""
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, dict):
        for key in ("text", "content"):
            if key in v:
                return _str(v[key])
        parts = [t for t in map(_str, v.values()) if t is not None]
        return "\n".join(parts) if parts else None
    if isinstance(v, list):
        return "\n".join(t if t is not None else "" for t in map(_str, v))
    return str(v)


def dataset_format(path: str) -> str | None:
    """The `format` a datakit dataset's manifest names (packed, megatron, ...), or None (no manifest)."""
    if names_one_object(str(path)):
        return None
    try:
        fs, p = filesystem(str(path))
        mf = f"{p.rstrip('/')}/manifest.json"
        fmt = json.loads(fs.cat_file(mf)).get("format") if fs.exists(mf) else None
    except (OSError, ValueError, AttributeError):
        return None
    return fmt if isinstance(fmt, str) else None


def refuse_token_only_formats(path: str) -> None:
    """InputError for a datakit dataset whose files hold token ids only (megatron, mds): there is no text
    to read, and the check's "no text to scan ... pass --text-field" misled (found in review)."""
    fmt = dataset_format(path)
    if fmt in ("megatron", "mds"):
        raise InputError(f"{path} is a {fmt} dataset (token ids without their records): check or index the "
                         "record-level (parquet) dataset it was tokenized from, or a packed one")


def is_packed(path: str) -> bool:
    """True for a packed token dataset folder (its manifest says `format: packed`)."""
    return dataset_format(path) == "packed"


def packed_preference_files(path: str) -> list[str]:
    """The preference-pair Parquet files of a packed dataset (each shard's `preference_file` in its
    manifest): their `prompt`/`chosen`/`rejected` are text beside the token arrays, which hold none of
    them (found in review: a check of a packed dataset never read the pairs and said clean)."""
    fs, p = filesystem(str(path))
    try:
        shards = json.loads(fs.cat_file(f"{p.rstrip('/')}/manifest.json")).get("shards") or []
    except (OSError, ValueError, AttributeError):
        return []
    root = str(path).rstrip("/")
    return [f"{root}/{s['preference_file']}" for s in shards if isinstance(s, dict) and s.get("preference_file")]
