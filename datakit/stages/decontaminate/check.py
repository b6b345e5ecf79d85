"""The contamination check: which items of which eval sets occur in a training set.

Why item-level answers: an engineer about to run an eval needs "12 of 164
HumanEval problems leaked (7.3%)" and which ones, not a list of documents. An
item is contaminated when the *whole* training set shares at least the rule's
n-grams with it (union over all documents), exactly what a training-set index
can answer without the documents; a full scan additionally names the
documents (`matches`, top few per item, with a PII-redacted snippet).

Data can be a records dataset (training_record.v1 Parquet/JSONL, or any table
with a `text`/`content`/`code` column; globs and fsspec URLs), a packed token
dataset (decoded with its tokenizer; needs `datakit.loader`), or an n-gram
index (`index.py`). A dataset folder with an index beside it (`_ngram_index/`)
is checked through the index when the settings agree.
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any, Iterator, Sequence

import numpy as np
import pyarrow as pa

from datakit import progress
from datakit.io.fs import InputError, expand, filesystem, refuse_empty_path, url_path
from datakit.io.url_secrets import has_hidden_secret, hide_url_secrets
from datakit.io.verify import verify_if_committed
from datakit.io.records import (DATA_SUFFIXES, LINE_COLUMN, data_files, is_packed, iter_tables, packed_preference_files,
                                refuse_token_only_formats)
from datakit.stages.decontaminate.evals import EvalSet
from datakit.stages.decontaminate.matcher import (EvalTable, TextSource, default_rule, match_batch, merge_spans,
                                             text_sources)
from datakit.stages.decontaminate.normalize import DEFAULT_NORMALIZATIONS, flags_of, names_of
from datakit.stages.decontaminate.evidence import EXCERPT_CHARS, eval_excerpt, item_hashes, shared_spans
from datakit.stages.decontaminate.redact import Redaction, clip, excerpt, redact
from datakit.stages.texts import GENERIC_TEXT_FIELDS, text_columns
from datakit.stages.decontaminate.result import CheckResult, EvalResult, ItemResult, Match, NearItem

log = logging.getLogger("datakit.decontam.check")

NEAR_LISTED = 20  # near-threshold items listed per eval
DEFAULT_NGRAM = 13


# ---------------------------------------------------------------------------------------------
# reading data
# ---------------------------------------------------------------------------------------------

@dataclass
class TextBatch:
    """A batch of documents reduced to what the matcher needs."""

    file: str
    rows: int
    doc_col: pa.Array | None    # doc_id/id column when the data has one
    first_row: int
    sources: list[TextSource]
    lines: pa.Array | None = None  # JSON Lines: each row's line number in its file
    name: str | None = None        # the file as the report names it (default: its base name)

    def doc_id(self, row: int) -> str:
        """The row's doc_id/id, else `<file>:<line>` (JSON Lines: the line in the file, blank and unreadable
        lines counted; Parquet: the row number), the file named relative to the --data path it came from.

        Why: the row counter skipped blank and unreadable lines, so `lines.jsonl:2` pointed at `{broken`
        when the leak was on line 4, and files of the same name in two folders were both `part-00000.parquet`
        (found in review)."""
        if self.doc_col is not None:
            v = self.doc_col[row].as_py()
            if v is not None:
                return str(v)
        where = self.lines[row].as_py() if self.lines is not None else self.first_row + row + 1
        return f"{self.name or PurePosixPath(self.file.split('://', 1)[-1]).name}:{where}"


def iter_text_batches(paths: str | Sequence[str], text_fields: Sequence[str] | None = None,
                      batch_rows: int = 8192, stats: dict | None = None,
                      seen: set[str] | None = None) -> Iterator[TextBatch]:
    """Stream the texts of a records dataset, file by file in sorted order (deterministic).

    `seen`: files already read (through an earlier --data path; `same_file` spellings): skipped, then
    added. Why: `--data d1 --data 'd1/*.parquet'` read every file twice and counted each leak twice
    (found in review), and so did a link to d1 beside d1."""
    columns = Columns(tuple(text_fields) if text_fields else None)
    roots = [paths] if isinstance(paths, str) else list(paths)
    for url in data_files(paths):
        if seen is not None:
            if same_file(url) in seen:
                if stats is not None:
                    stats["repeated_files"] = stats.get("repeated_files", 0) + 1
                continue
            seen.add(same_file(url))
        name = _name_under(url, roots)
        for first, table in iter_tables(url, columns, batch_rows, stats):
            tb = to_text_batch(url, table, first, text_fields)
            tb.name = name
            yield tb


def _name_under(url: str, roots: Sequence[str]) -> str:
    """`url` relative to the folder of the --data path it came from (a file given itself: its base name)."""
    import os

    plain = url.split("://", 1)[-1]
    for root in roots:
        r = root.split("://", 1)[-1].rstrip("/")
        if "://" not in root and not os.path.isabs(r):
            r = os.path.abspath(r)
        if plain.startswith(r + "/"):
            return plain[len(r) + 1:]
    return PurePosixPath(url_path(url).split("://", 1)[-1]).name  # (a presigned URL: not its signature)


@dataclass(frozen=True)
class Columns:
    """What to read from a data file with columns `names`: its id column, then `text_columns`.
    Picklable: the index build's tasks read with it in workers and on executors."""

    text_fields: tuple[str, ...] | None = None

    @property
    def plain_text_fields(self) -> tuple[str, ...]:
        """The fields a plain JSON row holds its text under, read as one segment in a batch of records
        (io/records._rows_table), when the text columns were chosen automatically."""
        return GENERIC_TEXT_FIELDS if self.text_fields is None else ()

    def __call__(self, names: Sequence[str], url: str) -> list[str]:
        try:
            wanted = text_columns(names, self.text_fields, every_generic=True)
        except KeyError as e:
            raise InputError(f"{url}: {e.args[0]}") from None
        if not wanted:
            raise InputError(f"{url}: no text to scan (expected training records or a text/content/code "
                             f"column; pass --text-field)")
        id_col = next((c for c in ("doc_id", "id") if c in names), None)
        return ([id_col] if id_col else []) + wanted


def to_text_batch(url: str, rb: pa.RecordBatch | pa.Table, first_row: int,
                  text_fields: Sequence[str] | None) -> TextBatch:
    names = rb.schema.names
    id_col = next((c for c in ("doc_id", "id") if c in names), None)
    doc_col = rb.column(id_col) if id_col else None
    if isinstance(doc_col, pa.ChunkedArray):
        doc_col = doc_col.combine_chunks()
    try:
        sources = text_sources(rb, text_fields, every_generic=not text_fields)
    except (KeyError, TypeError) as e:  # a column missing, or one whose type holds no text
        raise InputError(f"{url}: {e.args[0]}") from None
    lines = rb.column(LINE_COLUMN) if LINE_COLUMN in names else None
    if isinstance(lines, pa.ChunkedArray):
        lines = lines.combine_chunks()
    return TextBatch(url, rb.num_rows, doc_col, first_row, sources, lines)


# ---------------------------------------------------------------------------------------------
# the check
# ---------------------------------------------------------------------------------------------

def check(data: str | Sequence[str], evals: Sequence[str | EvalSet], *, ngram: int | None = None,
          normalizations: Sequence[str] | None = None, min_ngrams: int = 1, min_fraction: float | None = None,
          threshold: float = 0.0, eval_fields: Sequence[str] | None = None, text_fields: Sequence[str] | None = None,
          use_index: bool = True, max_examples: int = 5, batch_rows: int = 8192,
          max_items_per_ngram: int = 1, robust: bool = True, min_ngrams_any: int | None = None,
          min_fraction_loose: float | None = None, reference: str | None = "stdlib",
          eval_id_fields: dict[str | None, str] | None = None) -> CheckResult:
    """Check eval sets against one or more datasets; see the module docstring.

    `ngram`/`normalizations` default to 13 and whitespace+case, or to an index's
    settings when every data path is an index. `robust` adds the comment-free
    and identifier-insensitive views and decodes escaped text (scans only: an
    index holds one view); `min_ngrams_any` (default 6 when robust, else off)
    matches an item on an absolute count of its distinctive n-grams;
    `reference` ("stdlib" or None) drops n-grams common in code at large.
    `eval_id_fields`: {eval name or None for every eval file: its id column} (`--eval-id-field`).
    Raises `InputError` for missing or unreadable inputs and unknown evals.
    """
    from datakit.stages.decontaminate.stage import load_evals

    t0 = time.perf_counter()
    paths = [data] if isinstance(data, str) else list(data)
    if not paths:
        raise InputError("no --data given")
    for p in paths:
        refuse_empty_path(p)  # (it was the current folder: every file below it scanned)
    if not evals:
        raise InputError("no --eval given")
    if min_fraction is not None and not 0.0 <= min_fraction <= 1.0:
        raise InputError(f"min fraction must be in [0, 1], got {min_fraction}")
    if not 0.0 <= threshold <= 1.0:
        raise InputError(f"threshold must be in [0, 1], got {threshold}")
    if ngram is not None and ngram < 1:
        raise InputError(f"ngram must be >= 1, got {ngram}")
    try:
        flags_req = flags_of(normalizations) if normalizations is not None else None
    except ValueError as e:
        raise InputError(str(e)) from None
    evalsets = [e for e in evals if isinstance(e, EvalSet)]
    specs = [e for e in evals if not isinstance(e, EvalSet)]
    if specs:
        try:
            fields = eval_fields if isinstance(eval_fields, dict) else list(eval_fields) if eval_fields else None
            evalsets += load_evals(list(specs), None, fields, eval_id_fields)
        except ValueError as e:
            raise InputError(str(e)) from None

    plan, n, flags = _plan_inputs(paths, ngram, flags_req, text_fields, use_index)
    if min_ngrams < 1:
        raise InputError(f"min n-grams must be >= 1, got {min_ngrams}")
    if min_ngrams_any is not None and min_ngrams_any < 0:
        raise InputError(f"min n-grams (any fraction) must be >= 0, got {min_ngrams_any}")
    if min_fraction_loose is not None and not 0.0 <= min_fraction_loose <= 1.0:
        raise InputError(f"min fraction (renamed) must be in [0, 1], got {min_fraction_loose}")
    rule = default_rule(flags, robust, min_ngrams, min_fraction, min_ngrams_any, min_fraction_loose)
    if max_items_per_ngram < 0:
        raise InputError(f"max items per n-gram must be >= 0, got {max_items_per_ngram}")
    if reference not in (None, "stdlib"):
        raise InputError(f"unknown reference corpus {reference!r}; known: stdlib (or none)")
    table = EvalTable.build(evalsets, n, flags, max_items_per_ngram, robust=robust, reference=reference)
    for e_no, es in enumerate(evalsets):  # a verdict on an eval none of whose items can match is no verdict
        mine = table.item_ngrams[table.item_eval == e_no]
        if len(mine) and not mine.any():
            raise InputError(f"eval {es.name!r}: none of its {len(mine)} items has a {n}-gram to look for (too short "
                             f"for n={n}, or every n-gram is common code); nothing was checked: lower --ngram")

    index_h: list[np.ndarray] = []      # (item, item position, hidx) found through indexes (union semantics)
    doc_hits: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (item, doc ordinal, shared) passing the rule
    cand: dict[tuple[int, int], Match] = {}  # (item, doc ordinal) -> match with snippet
    near: dict[int, tuple[int, str]] = {}  # item -> (places shared, document) of its closest non-passing pair
    doc_names: list[str] = []
    data_report: list[dict[str, Any]] = []
    seen_files: set[str] = set()  # each data file is read once, however many --data paths name it
    # per --data path: documents read and lines skipped; a path with no readable document is an error (the
    # scan's rule: never "clean" about data nobody could read), judged for the path, not for each snapshot
    # of an append-mode dataset (found in review: one empty night made every check of the dataset exit 2)
    read_docs: dict[str, int] = {}
    read_skipped: dict[str, int] = {}
    via_index: dict[str, str] = {}
    repeated: set[str] = set()
    from datakit.stages.decontaminate.index import answered_files  # (index imports this module)

    for kind, p, idx, group in plan:
        read_docs.setdefault(group, 0)
        # what an index or a packed dataset answers for is not read again through another --data path
        # (found in review: the data beside its own index, or a link to it, counted every document twice)
        answers = ({same_file(f) for f in answered_files(idx.path)} if kind == "index" else
                   {same_file(f"{p.rstrip('/')}/manifest.json")} if kind == "packed" else set())
        if answers and answers <= seen_files:
            repeated.add(group)
            continue
        seen_files |= answers
        if kind == "index":
            found = idx.contains(table.hashes)
            hidx = np.nonzero(found)[0]
            pos, items, ipos, weak = table.expand(hidx)
            index_h.append(np.stack([items.astype(np.int64), ipos, hidx[pos]], axis=1)[~weak])
            skipped = int(idx.meta.get("skipped_lines") or 0)
            read_docs[group] += int(idx.meta.get("documents") or 0)
            read_skipped[group] = read_skipped.get(group, 0) + skipped
            via_index.setdefault(group, idx.path)
            entry = {"path": hide_url_secrets(p), "mode": "index", "index": idx.path, "documents": idx.meta.get("documents"),
                     "texts": idx.meta.get("texts"), "bytes": idx.meta.get("bytes"),
                     "text_fields": idx.meta.get("text_fields"),
                     "index_ngrams": idx.meta.get("ngrams"), "fp_rate_per_ngram": idx.fp_rate}
            if robust:  # asked for, but an index holds one view (found in review: the report said robust, unqualified)
                entry["robust"] = False
            if skipped:  # counted when it was built: the verdict covers only what was read, said as a scan says it
                entry["skipped_lines"] = skipped
                if idx.meta.get("rows_without_text"):  # the warning names them as a scan's does
                    entry["rows_without_text"] = int(idx.meta["rows_without_text"])
            data_report.append(entry)
            continue
        stats: dict[str, Any] = {}
        if kind == "packed":
            batches = packed_batches(p, batch_rows)
        else:
            batches = iter_text_batches(p, text_fields, batch_rows, stats, seen_files)
        docs = texts = nbytes = 0
        columns_read: set[str] = set()
        # documents read so far, as a bar on stderr when it is a terminal (found in review: a scan of a large
        # dataset printed nothing until its verdict); the path only, never data
        st = progress.step(f"contamination-check: scanning {p}")
        for tb in batches:
            docs += tb.rows
            st.advance(tasks=0, rows=tb.rows)
            columns_read.update(s.name for s in tb.sources)
            texts += sum(len(s.offsets) - 1 for s in tb.sources)
            nbytes += sum(int(s.offsets[-1] - s.offsets[0]) for s in tb.sources if len(s.offsets))
            m = match_batch(table, tb.sources, parallel=True)
            tot = table.item_ngrams[m.items]
            ok = rule.passes(m.shared, tot, m.loose)
            for j in np.nonzero(~ok & rule.near(m.shared, tot, m.loose))[0].tolist():
                it, got = int(m.items[j]), int(m.loose[j])
                was = near.get(it)
                if got <= 0 or (was is not None and got < was[0]):
                    continue
                doc = tb.doc_id(int(m.rows[j]))
                # ties go to the smallest document name, whatever order the rows came in (the report's
                # bytes depended on it: found in review)
                if was is None or got > was[0] or doc < was[1]:
                    near[it] = (got, doc)
            if not ok.any():
                continue
            rows_u, inv = np.unique(m.rows[ok], return_inverse=True)
            base = len(doc_names)
            doc_names.extend(tb.doc_id(int(r)) for r in rows_u)
            ords = base + inv
            doc_hits.append((m.items[ok].astype(np.int64), ords, m.loose[ok]))
            _collect_snippets(table, tb, m, ok, ords, doc_names, p, max_examples, cand)
        st.finish(rows=docs)
        read_docs[group] += docs
        read_skipped[group] = read_skipped.get(group, 0) + int(stats.get("skipped_lines", 0))
        if stats.get("repeated_files"):
            repeated.add(group)
        entry: dict[str, Any] = {"path": hide_url_secrets(p), "mode": kind, "documents": docs, "texts": texts, "bytes": nbytes,
                                 "text_columns": sorted(columns_read)}
        if stats.get("skipped_lines"):
            entry["skipped_lines"] = stats["skipped_lines"]
        if stats.get("rows_without_text"):  # counted in skipped_lines too: rows with none of the text keys
            entry["rows_without_text"] = stats["rows_without_text"]
        if stats.get("lines_not_utf8"):
            entry["lines_not_utf8"] = stats["lines_not_utf8"]
        ignored = _ignored_files(p) if kind == "scan" else []
        if ignored:
            entry["ignored_files"] = len(ignored)
            entry["ignored_examples"] = ignored[:3]
        data_report.append(entry)

    for group, docs in read_docs.items():
        if docs == 0 and group not in repeated:
            skipped = read_skipped.get(group, 0)
            where = f"{group}: its n-gram index {via_index[group]} holds" if group in via_index else f"{group}:"
            raise InputError(f"{where} no readable document" + (f" ({skipped} unreadable line{'s' * (skipped != 1)} "
                                                                f"skipped)" if skipped else "") + "; nothing was checked")

    # scans decide per document (some document passes the rule with the item); indexes have no
    # documents, so they decide on the union of the data: an upper bound of the scan's answer
    best = np.zeros(table.n_items, np.int64)
    docs_per_item = np.zeros(table.n_items, np.int64)
    di = dd = ds = np.zeros(0, np.int64)
    if doc_hits:
        di = np.concatenate([d[0] for d in doc_hits])
        dd = np.concatenate([d[1] for d in doc_hits])
        ds = np.concatenate([d[2] for d in doc_hits])
        np.maximum.at(best, di, ds)
        docs_per_item = np.bincount(di, minlength=table.n_items)
    bad = best > 0
    union = np.zeros(table.n_items, np.int64)
    pairs_idx = np.zeros((0, 3), np.int64)
    if index_h:
        pairs_idx = np.unique(np.concatenate(index_h), axis=0)
        places = np.unique(pairs_idx[:, :2], axis=0)
        union = np.bincount(places[:, 0], minlength=table.n_items).astype(np.int64)
        bad |= rule.passes(union, table.item_ngrams) & (union > 0)
    bad &= table.item_ngrams > 0
    any_scan = any(k != "index" for k, _, _, _ in plan)
    results: list[EvalResult] = []
    for e_no, es in enumerate(evalsets):
        mine = np.nonzero(table.item_eval == e_no)[0]
        er = EvalResult(es.name, es.source, list(es.fields), len(mine), int((table.item_ngrams[mine] == 0).sum()))
        for it in mine[bad[mine]].tolist():
            tot = int(table.item_ngrams[it])
            shared = int(max(best[it], union[it]))
            # documents: how many scanned documents hold it; null when it was found through an index only
            # (found in review: 0 there when another path was scanned, which reads as "in no document")
            er.contaminated.append(ItemResult(table.item_ids[it], tot, shared, round(shared / tot, 6),
                                              int(docs_per_item[it]) if any_scan and best[it] > 0 else None))
            er.matches.extend(_top_matches(it, table, di, dd, ds, doc_names, cand, max_examples))
            if best[it] == 0:
                er.matches.append(_index_match(it, table, pairs_idx, plan))
        close = sorted((it for it in mine.tolist() if it in near and not bad[it]),
                       key=lambda it: (-near[it][0] / max(int(table.item_ngrams[it]), 1), table.item_ids[it]))
        er.near_threshold = [NearItem(table.item_ids[it], int(table.item_ngrams[it]), near[it][0],
                                      round(near[it][0] / max(int(table.item_ngrams[it]), 1), 6), near[it][1])
                             for it in close[:NEAR_LISTED]]
        results.append(er)
    redaction = _redact_matches(results, table)
    return CheckResult(n, names_of(flags), rule, threshold, data_report, results, max_items_per_ngram,
                       table.ignored_common, time.perf_counter() - t0, redaction, robust=robust,
                       views=[f"{vn}:{'+'.join(names_of(vf))}" for vn, vf in table.views], reference=table.reference,
                       ignored_reference=table.ignored_reference)


def _plan_inputs(paths: list[str], ngram: int | None, flags_req: int | None, text_fields, use_index: bool
                 ) -> tuple[list[tuple[str, str, Any, str]], int, int]:
    """Classify every data path (index / packed / scan) and settle n and normalizations.

    An index fixes its own settings: explicit settings that differ are an error
    for an index given directly, and a fall-back to scanning for one found beside
    a dataset. An index found beside a dataset is used only with the settings the
    check runs with (the explicit ones, else the defaults), and an index given
    directly lends its settings to the check only when nothing else is scanned:
    found in review, a 40-gram index of one folder, given beside another folder
    with no index, made the whole check - that folder's scan included - look for
    40-grams, and a verbatim HumanEval solution there checked clean.
    """
    from datakit.io.snapshots import member_paths
    from datakit.stages.decontaminate.index import INDEX_DIRNAME, NgramIndex, is_index, stale_reason

    # an append-mode dataset: each snapshot (and its index), under the --data path it came from; a path
    # named twice is read once (found in review: `--data X --data X` counted X's documents twice through
    # its index, while a scan reads each file once)
    members: dict[str, str] = {}
    for given in paths:
        for q in member_paths(given):
            members.setdefault(_same_path(q), given)
    plan: list[tuple[str, str, Any, str]] = []  # (kind, path, index-or-None, the --data path it came from)
    want_n = ngram if ngram is not None else DEFAULT_NGRAM
    want_f = flags_req if flags_req is not None else flags_of(DEFAULT_NORMALIZATIONS)
    for p, group in members.items():
        if is_index(p):
            _check_beside_its_data(p)
            idx = NgramIndex(p)
            built_from = list(idx.meta.get("text_fields") or [])
            if text_fields and list(text_fields) != built_from:
                # (found in review: an index of `meta` only, named with --text-field segments, answered clean)
                read = ", ".join(built_from) or "the columns chosen automatically"
                raise InputError(f"{p}: index built from the text of {read}, not of --text-field "
                                 f"{','.join(text_fields)}; check the data itself, or build an index with that "
                                 "--text-field")
            plan.append(("index", p, idx, group))
            continue
        side = f"{p.rstrip('/')}/{INDEX_DIRNAME}"
        if use_index and not any(c in p for c in "*?[") and not is_index(side) and _exists(f"{side}/index.json"):
            log.warning("not using the n-gram index %s: its index.json is not readable; scanning the data instead "
                        "(rebuild it with `datakit build-index %s`)", side, p)
        if use_index and not any(c in p for c in "*?[") and is_index(side):
            idx = NgramIndex(side)
            # an index answers for the texts it read: the same text fields (found in review: one built with
            # --text-field src was never used by a check with --text-field src)
            same_texts = list(text_fields or []) == list(idx.meta.get("text_fields") or [])
            if idx.ngram == want_n and idx.flags == want_f and same_texts:
                stale = stale_reason(side, p)
                if stale is None:
                    plan.append(("index", p, idx, group))
                    continue
                log.warning("not using the n-gram index %s: %s; scanning the data instead (rebuild it with "
                            "`datakit build-index %s`)", side, stale, p)
        refuse_token_only_formats(p)
        if is_packed(p):
            plan.append(("packed", p, None, group))
            # its preference pairs are records beside the token arrays, read as a scan reads records
            plan.extend(("scan", f, None, group) for f in packed_preference_files(p))
            continue
        expand(p, suffixes=DATA_SUFFIXES)  # fail fast (exit 2) on a missing input, before any work
        verify_if_committed(p)  # a datakit dataset missing a file is refused (exit 2), not half-checked
        plan.append(("scan", p, None, group))
    idx_settings = {(x.ngram, x.flags) for k, _, x, _ in plan if k == "index"}
    if len(idx_settings) > 1:
        raise InputError("the indexes given were built with different n-gram settings; check them separately")
    if idx_settings:
        i_n, i_f = next(iter(idx_settings))
        if ngram is not None and ngram != i_n:
            raise InputError(f"index built with ngram={i_n}; pass --ngram {i_n} (or scan the dataset)")
        if flags_req is not None and flags_req != i_f:
            raise InputError(f"index built with normalizations {'+'.join(names_of(i_f)) or 'none'}; "
                             f"pass the same --normalize (or scan the dataset)")
        scanned = [p for k, p, _, _ in plan if k != "index"]
        if scanned and (i_n, i_f) != (want_n, want_f):
            given = next(p for k, p, _, _ in plan if k == "index")
            raise InputError(f"{given}: index built with ngram={i_n} and normalizations "
                             f"{'+'.join(names_of(i_f)) or 'none'}, but {scanned[0]} is scanned, which would then be "
                             f"checked with those settings too: pass --ngram {i_n} --normalize "
                             f"{','.join(names_of(i_f)) or 'none'} to check everything so, or check the index alone")
        return plan, i_n, i_f
    n = ngram if ngram is not None else DEFAULT_NGRAM
    flags = flags_req if flags_req is not None else flags_of(DEFAULT_NORMALIZATIONS)
    return plan, n, flags


# a datakit dataset's own files at its root, which are not data (schemas/output_layout.md)
_DATASET_ROOT_FILES = ("README.md", "manifest.json", "tokenizer.json")


def _ignored_files(path: str) -> list[str]:
    """The files a --data folder or glob holds that the check does not read (no data file suffix), by name
    under it; a datakit dataset's own root files, hidden and `_` names aside.

    Why: found in review, a folder's `shard-0002.json` (JSON Lines under a plain `.json` name) held
    HumanEval items and was left out without a word; the check now says which files it did not read."""
    try:
        every = expand(path)
    except InputError:
        return []
    names = (_name_under(f, [path]) for f in every if not url_path(f).endswith(DATA_SUFFIXES))
    return sorted(n for n in names if n not in _DATASET_ROOT_FILES)  # (a root file's name has no folder in it)


def _present(path: str) -> bool:
    """Whether `path` (a file, folder or glob) names data on this machine: a glob, when it matches a file
    (found in review: a copied index built from a glob was refused as "N removed" instead of warned about)."""
    if has_hidden_secret(path):  # a signed URL as an index recorded it, without its signature: not readable
        return False
    if not any(c in path for c in "*?["):
        return _exists(path)
    try:
        return bool(data_files(path))
    except InputError:
        return False


def same_file(url: str) -> str:
    """One spelling per file: a local path with its links resolved (a URL as it is)."""
    return url if "://" in url else os.path.realpath(url)


def _same_path(p: str) -> str:
    """`p` as one spelling: without a trailing slash, a local path absolute (a URL as it is)."""
    p = str(p).rstrip("/") or "/"
    return p if "://" in p else os.path.abspath(p)


def _exists(url: str) -> bool:
    fs, p = filesystem(url)
    return fs.exists(p)


def _check_beside_its_data(index_path: str) -> None:
    """An index given directly that sits beside its dataset (`DATA/_ngram_index`) must still answer for
    DATA as it is now: found in review, `--data DATA/_ngram_index` (the form the docs show) used an
    index built before a leak was added to DATA, without a word, where `--data DATA` warned and scanned.
    A stale one is an error (the user named the index, so a scan of something else would surprise); one
    written before indexes recorded their sources is used, with a warning."""
    from datakit.stages.decontaminate.index import INDEX_DIRNAME, stale_reason

    path = index_path.rstrip("/")
    if "/" not in path or path.rsplit("/", 1)[1] != INDEX_DIRNAME:
        _check_against_recorded_data(path)
        return
    data = path.rsplit("/", 1)[0]
    stale = stale_reason(path, data)
    if stale is None:
        return
    if stale.startswith("it records no source"):
        log.warning("the n-gram index %s %s: it cannot be checked against %s", path, stale, data)
        return
    raise InputError(f"the n-gram index {path} does not answer for {data} as it is now ({stale}); "
                     f"rebuild it with `datakit build-index {data}`, or check {data} itself")


def _check_against_recorded_data(path: str) -> None:
    """An index built elsewhere (`build-index DATA --out IDX`) against the DATA it recorded, when DATA is
    here: found in review, a file added to DATA after the build held a HumanEval item and `--data IDX`
    said clean, exit 0. A changed DATA is an error; a DATA not found here (the index was copied to
    another machine) is a warning, and the index answers as built."""
    from datakit.stages.decontaminate.index import outdated_reason, recorded_data, stale_reason

    outdated = outdated_reason(path)
    if outdated is not None:  # its n-grams are not the ones a check hashes now, wherever its data is
        raise InputError(f"the n-gram index {path} cannot answer this check ({outdated}); rebuild it with "
                         f"`datakit build-index`")
    rec = recorded_data(path)
    if rec is None:
        return  # an index from before indexes recorded their data: nothing to compare
    data, root = rec
    if not any(_present(d) for d in data):
        log.warning("the n-gram index %s was built from %s, which is not here: it answers for that data as it "
                    "was when built", path, ", ".join(data))
        return
    stale = stale_reason(path, data[0] if len(data) == 1 else data, root)
    if stale is not None:
        where = ", ".join(data)
        raise InputError(f"the n-gram index {path} does not answer for {where} as it is now ({stale}); rebuild it "
                         f"with `datakit build-index {where} --out {path}`, or check {where} itself")


def _collect_snippets(table: EvalTable, tb: TextBatch, m, ok: np.ndarray, ords: np.ndarray, doc_names: list[str],
                      path: str, k: int, cand: dict[tuple[int, int], Match]) -> None:
    """Snippets for the batch's top-k passing (item, doc) pairs per item; the global top-k is among them."""
    rows_ok = m.rows[ok]
    items, shared = m.items[ok].tolist(), m.loose[ok].tolist()
    order = sorted(range(len(items)), key=lambda j: (items[j], -shared[j], doc_names[int(ords[j])]))
    taken: dict[int, int] = {}
    for j in order:
        it = items[j]
        if taken.get(it, 0) >= k:
            continue
        taken[it] = taken.get(it, 0) + 1
        row = int(rows_ok[j])
        sel = np.nonzero((m.hit_row == row) & (m.hit_item == it))[0]
        # the text with the most shared n-grams is the evidence (the first hit's text was: a preference
        # record whose `chosen` was a verbatim copy showed the one line its prompt quoted; found in review)
        keys = m.hit_source[sel].astype(np.int64) * (1 << 32) + m.hit_string[sel].astype(np.int64)
        uniq, first, counts = np.unique(keys, return_index=True, return_counts=True)
        best = sel[first[np.lexsort((first, -counts))[0]]]  # most hits; ties: the one hit first
        src, s = int(m.hit_source[best]), int(m.hit_string[best])
        same = sel[(m.hit_source[sel] == src) & (m.hit_string[sel] == s)]
        spans = merge_spans(list(zip(m.hit_a[same].tolist(), m.hit_b[same].tolist())))
        a, b = max(spans, key=lambda ab: (ab[1] - ab[0], -ab[0]))  # the longest overlapping run
        text = m.sources[src].strings[s].as_py() or ""
        snippet, _, _, line = excerpt(text, a, b)  # whole lines, unclipped: redacted first, clipped after
        tot = int(table.item_ngrams[it])
        hashes = item_hashes(table, m.hit_hidx[sel])
        f, eline, etext = eval_excerpt(table, it, hashes)
        mt = Match(table.item_ids[it], doc_names[int(ords[j])], hide_url_secrets(path), round(shared[j] / max(tot, 1), 6), shared[j],
                   snippet, doc_line=line, doc_excerpt=snippet, eval_field=f, eval_line=eline, eval_excerpt=etext)
        mt._hashes = hashes  # type: ignore[attr-defined]  # for the spans, after redaction (not serialized)
        cand[(it, int(ords[j]))] = mt


def _top_matches(it: int, table: EvalTable, di, dd, ds, doc_names, cand, k: int) -> list[Match]:
    sel = np.nonzero(di == it)[0]
    if not len(sel):
        return []
    names = np.array([doc_names[x] for x in dd[sel]], dtype=object)
    order = sorted(range(len(sel)), key=lambda j: (-int(ds[sel[j]]), names[j]))[:k]
    out = []
    for j in order:
        mt = cand.get((it, int(dd[sel[j]])))
        if mt is not None:
            out.append(mt)
    return out


def _index_match(it: int, table: EvalTable, pairs: np.ndarray, plan) -> Match:
    """A match without a document (index mode): the eval-side text that was found."""
    mine = pairs[pairs[:, 0] == it]
    hashes = item_hashes(table, mine[:, 2])
    f, eline, etext = eval_excerpt(table, it, hashes)
    tot = int(table.item_ngrams[it])
    shared = len(np.unique(mine[:, 1]))
    src = next((p for k, p, _, _ in plan if k == "index"), "")
    mt = Match(table.item_ids[it], None, src, round(shared / max(tot, 1), 6), shared, etext or "",
               eval_field=f, eval_line=eline, eval_excerpt=etext)
    mt._hashes = hashes  # type: ignore[attr-defined]
    return mt


def _redact_matches(results: list[EvalResult], table: EvalTable) -> Redaction:
    """Redact every excerpt (whole lines), then clip (a clip never cuts through unredacted PII), then
    mark the shared spans on what is shown."""
    info = Redaction()
    ms = [m for e in results for m in e.matches]
    near = [n for e in results for n in e.near_threshold]
    # the documents' ids too: a user's `id` may hold an e-mail (found in review: it reached the JSON, the
    # HTML and the terminal in clear while every snippet was redacted)
    ids = [m.doc_id or "" for m in ms] + [n.doc_id or "" for n in near]
    texts = [m.snippet for m in ms] + [m.eval_excerpt or "" for m in ms] + ids
    red = redact(texts, info, prose=[True] * len(ms) + [False] * (len(ms) + len(ids)))  # names in the data
    for obj, new_id in zip(ms + near, red[2 * len(ms):]):
        if obj.doc_id:
            obj.doc_id = new_id
    red = red[:2 * len(ms)]
    for m, doc, ev in zip(ms, red[:len(ms)], red[len(ms):]):
        hashes = getattr(m, "_hashes", np.zeros(0, np.uint64))
        m.snippet = clip(doc)
        if m.doc_excerpt is not None:
            m.doc_excerpt = clip(doc, EXCERPT_CHARS)
            m.doc_spans = shared_spans(m.doc_excerpt, table, hashes)
        if m.eval_excerpt is not None:
            m.eval_excerpt = clip(ev, EXCERPT_CHARS)
            m.eval_spans = shared_spans(m.eval_excerpt, table, hashes)
    return info


# ---------------------------------------------------------------------------------------------
# packed token datasets
# ---------------------------------------------------------------------------------------------

def _open_packed(path: str):
    try:
        from datakit.loader import PackedDataset
    except ImportError:
        raise InputError(f"{path}: packed token datasets need datakit.loader, which is not available") from None
    return PackedDataset(path)


def packed_windows(path: str, batch_rows: int) -> list[tuple[int, int]]:
    """The sequence ranges `packed_batches` decodes as one batch each (a batch ends once it holds
    `batch_rows` document pieces): independent units of work with the same texts as one pass."""
    ds = _open_packed(path)
    out, start, count = [], 0, 0
    for i in range(len(ds)):
        count += sum(1 for seg in ds.segments(i) if seg["doc_id"] is not None)
        if count >= batch_rows:
            out.append((start, i + 1))
            start, count = i + 1, 0
    if start < len(ds):
        out.append((start, len(ds)))
    return out


def packed_batches(path: str, batch_rows: int, window: tuple[int, int] | None = None) -> Iterator[TextBatch]:
    """Decode a packed dataset (or the sequences of one window) back to text, one document piece per
    string (needs the tokenizer). A document cut across sequences is glued back in offset order
    (n-grams span the cut) within its batch."""
    ds = _open_packed(path)
    decode = _decoder(ds.manifest, path)
    pieces: dict[str, list[tuple[int, str]]] = {}
    count = 0
    first = 0

    def flush() -> TextBatch:
        ids = sorted(pieces)
        texts = ["".join(t for _, t in sorted(pieces[d])) for d in ids]
        return to_text_batch(path, pa.table({"doc_id": ids, "text": texts}), first, None)

    for i in range(*(window or (0, len(ds)))):
        tokens, _, _ = ds.raw(i)
        for seg in ds.segments(i):
            if seg["doc_id"] is None:
                continue
            text = decode(np.asarray(tokens[seg["start"]:seg["end"]]).tolist())
            pieces.setdefault(seg["doc_id"], []).append((int(seg["doc_offset"]), text))
            count += 1
        if count >= batch_rows:
            yield flush()
            first += len(pieces)
            pieces, count = {}, 0
    if pieces:
        yield flush()


def _check_own_tokenizer(path: str, manifest: dict) -> None:
    """The tokenizer file beside packed tokens is the one they were made with (manifest sha256), else an error.

    Why: found in review, another tokenizer.json put beside a packed dataset decoded it to garbage, which
    checked clean (exit 0; the original was exit 1). Raised as `_TokenizerMismatch`, which `_decoder`
    passes on as it is (its other failures are "cannot load")."""
    from datakit.io.verify import DatasetVerifyError, verify_tokenizer_file

    try:
        verify_tokenizer_file(path, manifest)
    except DatasetVerifyError as e:
        raise _TokenizerMismatch(f"{e}; its tokens cannot be read back to text for the check") from None


class _TokenizerMismatch(InputError):
    """The tokenizer file beside a packed dataset is not the one its manifest names."""


def _decoder(manifest: dict, path: str):
    """Token ids -> text with the dataset's own tokenizer (the tokenizer.json beside it when present)."""
    spec = manifest.get("tokenizer") or {}
    name = spec.get("name") if isinstance(spec, dict) else spec
    missing = None  # the dataset's own tokenizer file, when the manifest names one that is not there
    try:
        if isinstance(spec, dict) and spec.get("file") and "://" not in path:
            from tokenizers import Tokenizer

            own = f"{path.rstrip('/')}/{spec['file']}"
            if os.path.exists(own):
                _check_own_tokenizer(path, manifest)
                tok = Tokenizer.from_file(own)
                return lambda ids: tok.decode(ids, skip_special_tokens=True)
            missing = own
        from datakit.stages.tokenize.tokenizers import load_tokenizer

        lt = load_tokenizer(name)
    except _TokenizerMismatch:
        raise
    except ImportError:
        raise InputError(f"{path}: cannot decode packed tokens (no tokenizer library available)") from None
    except Exception as e:
        # found in review: a dataset copied without its tokenizer.json said only "cannot load tokenizer
        # 'datakit:demo-bpe': Exception"
        why = f"{missing} is missing, and {name!r} could not be loaded instead" if missing else \
            f"cannot load tokenizer {name!r}"
        raise InputError(f"{path}: {why} ({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''})"
                         ) from None
    if missing is not None:
        want = spec.get("sha256") if isinstance(spec, dict) else None
        if not want:  # nothing to compare with: decoding with whatever the name loads here could be another vocabulary
            raise InputError(f"{path}: {missing} is missing, and the manifest records no sha256 of the tokenizer to "
                             f"check {name!r} against: restore the file")
        if lt.sha256 != want:
            raise InputError(f"{path}: {missing} is missing, and {name!r} as loaded here is another tokenizer "
                             f"(sha256 {lt.sha256[:12]} against the dataset's {want[:12]}): restore the file")
        log.warning("%s is missing; decoding with %r, the same tokenizer (sha256 %s)", missing, name, want[:12])
    return lt.decode
