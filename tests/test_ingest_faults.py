"""One bad line or row never kills the job (issue 18): each value that used to crash ingest, or slip
through it, is now exactly one quarantine row with a precise reason, and the good lines go on."""
from __future__ import annotations

import json
import pickle

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datakit import Pipeline
from datakit.contracts import EDITOR_EVENT_V1
from tests.eventgen import make_event, write_jsonl


def _run(tmp_path, path, fmt="jsonl"):
    out = tmp_path / "out"
    res = (Pipeline("t").input(str(path), format=fmt).add({"kind": "ingest"})
           .output(str(out), shards=1).run(workers=1))
    q = out / "_quarantine" / "part-00000.parquet"
    return res.stage("ingest"), (pq.read_table(q).to_pylist() if q.exists() else [])


def _line(i: int, **over) -> bytes:
    return json.dumps(make_event(i, **over)).encode()


# (raw line, reason, detail): each crashed the job (first four) or was accepted though wrong before
BAD_LINES = {
    "utc_before_year_1": (_line(50, timestamp="0001-01-01T00:00:00+01:00"), "bad_timestamp", "timestamp"),
    "utc_after_year_9999": (_line(51, timestamp="9999-12-31T23:30:00-05:00"), "bad_timestamp", "timestamp"),
    "int_beyond_int64": (_line(52, latency_ms=2**70), "bad_value", "latency_ms"),
    "lone_surrogate": (_line(53, client_version="X").replace(b'"X"', b'"a\\ud800"'), "bad_utf8",
                       "lone surrogate escape"),
    "negative_latency": (_line(54, latency_ms=-5), "bad_value", "latency_ms"),
    "nul_in_event_id": (_line(55, event_id="ev\u0000x"), "bad_value", "event_id"),
    "empty_user_id": (_line(56, user_id=""), "bad_value", "user_id"),
    "unit_separator_in_session_id": (_line(61, session_id="s\u001fp.py"), "bad_value", "session_id"),
    "privacy_conflict": (_line(57, privacy_mode=True)[:-1] + b', "privacy_mode": false}', "duplicate_key",
                         "privacy_mode"),
    "privacy_as_string": (_line(58, privacy_mode="false"), "wrong_type", "privacy_mode"),
    # found in review: a role outside the contract's enum (here an email address) reached the records'
    # segments, which scrub_pii does not read; an unknown outcome was called a type error
    "role_not_in_enum": (json.dumps(make_event(59, event_type="chat_turn", messages=[
        {"role": "jane.doe@example.com", "content": "hi"}])).encode(), "bad_value", "messages.role"),
    "outcome_not_in_enum": (_line(60, outcome="weird"), "bad_value", "outcome"),
    # found in review: a partial acceptance whose kept text is not a prefix of the suggestion was trained
    "partial_not_a_prefix": (_line(64, suggestion="return x + 1", outcome="partial",
                                   accepted_text="print(x)"), "bad_value", "accepted_text"),
    # found in review: an acceptance of another text than the suggestion became FIM middles, chosen sides and
    # reward-1 feedback of text the model never suggested (line ends and trailing blanks may differ)
    "accepted_not_the_suggestion": (_line(65, suggestion="return 3.14 * r * r", outcome="accepted",
                                          accepted_text="import os"), "bad_value", "accepted_text"),
}


@pytest.mark.parametrize("case", sorted(BAD_LINES))
def test_bad_line_is_one_quarantine_row(tmp_path, case):
    raw, reason, detail = BAD_LINES[case]
    f = write_jsonl(tmp_path / "in" / "a.jsonl", [make_event(1), raw, make_event(2)])
    st, q = _run(tmp_path, f)
    assert (st["rows_in"], st["rows_out"], st["dropped"]) == (3, 2, {reason: 1})
    assert [(r["source_line"], r["reason"], r["detail"]) for r in q] == [(2, reason, detail)]


def test_equal_duplicate_keys_are_harmless(tmp_path):
    raw = _line(60)[:-1] + b', "privacy_mode": false}'  # the same value twice: no conflict
    st, q = _run(tmp_path, write_jsonl(tmp_path / "in" / "a.jsonl", [raw]))
    assert st["rows_out"] == 1 and q == []


def test_fields_the_contract_does_not_name_are_not_read_and_are_counted(tmp_path):
    """The contract lists every field (additionalProperties: false); ingest does not read others, so a newer
    client's fields never cost its events, but they were silently ignored (found in review): the run counts
    the events that held some, at the top level, in a struct or in a message, and the value never appears."""
    plain = make_event(1)
    top = {**make_event(2), "client_os": "jane@example.com"}
    nested = make_event(3)
    nested["file"] = {**(nested.get("file") or {}), "encoding": "utf-8"}
    chat = make_event(4, event_type="chat_turn", messages=[{"role": "user", "content": "hi", "lang": "en"}])
    f = write_jsonl(tmp_path / "in" / "a.jsonl", [plain, top, nested, chat])
    st, q = _run(tmp_path, f)
    assert (st["rows_in"], st["rows_out"], q) == (4, 4, [])
    assert st["metrics"] == {"events_with_unknown_fields": 3}
    out = pq.read_table(tmp_path / "out" / "data" / "part-00000.parquet") if (tmp_path / "out" / "data").exists() \
        else pq.read_table(next((tmp_path / "out").glob("part-*.parquet")))
    assert "client_os" not in out.column_names and "jane@example.com" not in (tmp_path / "out" / "_run.json").read_text()


def test_blank_lines_are_counted_and_a_bom_is_not_an_error(tmp_path):
    data = b"\xef\xbb\xbf" + _line(1) + b"\r\n\r\n" + _line(2) + b"\n   \n" + _line(3) + b"\n"
    f = tmp_path / "in" / "a.jsonl"
    f.parent.mkdir()
    f.write_bytes(data)
    st, q = _run(tmp_path, f)
    assert (st["rows_in"], st["rows_out"], st["dropped"]) == (5, 3, {"blank_line": 2})
    assert sorted(r["source_line"] for r in q) == [2, 4]


def _event_columns(evs, overrides: dict[str, pa.Field] | None = None) -> pa.Table:
    names = [f.name for f in EDITOR_EVENT_V1 if not f.name.startswith("_")]
    fields = [(overrides or {}).get(n, EDITOR_EVENT_V1.field(n)) for n in names]
    return pa.Table.from_pylist([{n: e.get(n) for n in names} for e in evs], schema=pa.schema(fields))


def test_parquet_nested_type_where_a_string_is_expected(tmp_path):
    evs = [make_event(i) for i in (2, 1, 3, 6)]  # chat/agent events need no suggestion
    for e in evs:
        e["suggestion"] = {"text": "x"} if e["event_id"] == "ev-000001" else None
    t = _event_columns(evs, {"suggestion": pa.field("suggestion", pa.struct([("text", pa.string())]))})
    (tmp_path / "in").mkdir()
    pq.write_table(t, tmp_path / "in" / "ev.parquet")
    st, q = _run(tmp_path, tmp_path / "in" / "ev.parquet", "parquet")
    assert st["rows_in"] == 4 and st["dropped"] == {"wrong_type": 1}
    assert [(r["source_line"], r["detail"]) for r in q] == [(2, "suggestion")]


def test_parquet_privacy_mode_string_is_quarantined_like_jsonl(tmp_path):
    evs = [make_event(i) for i in range(3)]
    for e in evs:
        e["privacy_mode"] = "false"
    t = _event_columns(evs, {"privacy_mode": pa.field("privacy_mode", pa.string())})
    (tmp_path / "in").mkdir()
    pq.write_table(t, tmp_path / "in" / "ev.parquet")
    st, q = _run(tmp_path, tmp_path / "in" / "ev.parquet", "parquet")
    assert st["rows_out"] == 0 and st["dropped"] == {"wrong_type": 3}
    assert {r["detail"] for r in q} == {"privacy_mode"}


def test_parquet_glob_with_foreign_schema_and_corrupt_file(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    pq.write_table(_event_columns([make_event(i) for i in range(5)]), d / "a.parquet")
    pq.write_table(pa.table({"x": [1, 2], "y": [[1], [2, 3]]}), d / "b.parquet")  # someone else's table
    (d / "c.parquet").write_bytes(b"PAR1 this is not parquet")
    # a timestamp column Arrow cannot turn into a Python datetime (year > 9999)
    far = pa.array([253402300800 * 1000 * 50], pa.timestamp("ms"))
    pq.write_table(_event_columns([make_event(9)]).set_column(2, "timestamp", far), d / "d.parquet")
    st, q = _run(tmp_path, str(d / "*.parquet"), "parquet")
    assert st["rows_in"] == 5 + 2 + 1 + 1 and st["rows_out"] == 5
    assert st["dropped"] == {"missing_field": 2, "unreadable_file": 1, "bad_value": 1}
    assert {(r["source_file"].rsplit("/", 1)[1], r["reason"]) for r in q} == {
        ("b.parquet", "missing_field"), ("c.parquet", "unreadable_file"), ("d.parquet", "bad_value")}
    # pyarrow's reason is kept (the row said only `OSError`, found in review)
    assert [r["detail"] for r in q if r["reason"] == "unreadable_file"][0].startswith("ArrowInvalid: Parquet magic bytes")


def test_parquet_damaged_row_group_costs_its_own_rows_only(tmp_path, caplog):
    """Found in review: pyarrow reports an undecodable page as a plain OSError ("Corrupt snappy
    compressed data."), which was taken for a storage failure: the run exited 3. Then (a later review)
    the reader cut batches across row groups and stopped at the damage: one bad row group lost every
    row of the file's batch and all row groups after it, and the lost rows were counted nowhere. Now the
    damaged row group's rows are `damaged_row_group` rows, one each, and the other row groups are read."""
    d = tmp_path / "in"
    d.mkdir()
    pq.write_table(_event_columns([make_event(i) for i in range(60)]), tmp_path / "ok.parquet", row_group_size=10)
    meta = pq.ParquetFile(tmp_path / "ok.parquet").metadata
    data = bytearray((tmp_path / "ok.parquet").read_bytes())
    at = meta.row_group(2).column(0).data_page_offset  # the third row group's first page
    data[at + 20: at + 60] = bytes(b ^ 0xFF for b in data[at + 20: at + 60])
    (d / "ev.parquet").write_bytes(bytes(data))
    import logging

    with caplog.at_level(logging.WARNING, logger="datakit"):
        st, q = _run(tmp_path, d / "ev.parquet", "parquet")
    assert st["rows_in"] == 60 and st["dropped"] == {"damaged_row_group": 10} and st["rows_out"] == 50
    # said as a warning, which `datakit run -q` keeps (found in review: a damaged input was a silent success)
    assert "damaged input files: damaged_row_group 10" in caplog.text
    assert [r["source_line"] for r in q] == list(range(21, 31))  # rows 21-30: the third row group
    assert q[0]["detail"].startswith("row group 3 of 6 unreadable")


def test_compressed_files_are_read_by_any_suffix_spelling_or_by_their_bytes(tmp_path, caplog):
    """Found in review: `a.jsonl.GZ`, `b.jsonl.gzip`, `c.jsonl.bz2`, `d.jsonl.ZST` and a gzip file named
    `e.jsonl` were read as plain text: every line quarantined as bad UTF-8, exit 0, no warning. The format
    comes from the suffix in any case, else from the file's first bytes; bz2 and xz are read too."""
    import bz2
    import gzip
    import logging
    import lzma

    import zstandard

    d = tmp_path / "in"
    d.mkdir()
    body = b"".join(_line(i) + b"\n" for i in range(6))
    files = {"a.jsonl.GZ": gzip.compress(body), "b.jsonl.gzip": gzip.compress(body), "c.jsonl.bz2": bz2.compress(body),
             "d.jsonl.ZST": zstandard.ZstdCompressor().compress(body), "e.jsonl": gzip.compress(body),
             "f.jsonl.xz": lzma.compress(body), "g.jsonl": zstandard.ZstdCompressor().compress(body)}
    for name, data in files.items():
        (d / name).write_bytes(data)
    st, q = _run(tmp_path, d)
    assert st["rows_in"] == 6 * len(files) and st["rows_out"] == 6 and not q  # one event id, read 7 times
    assert st["dropped"] == {"duplicate_event_id": 6 * (len(files) - 1)}
    (d / "h.jsonl").write_bytes(b"\r".join(_line(i) for i in range(3)))  # a CR-only file: one line, not an event
    for name in files:
        (d / name).unlink()
    with caplog.at_level(logging.WARNING, logger="datakit"):
        st, q = _run(tmp_path, d / "h.jsonl")
    assert st["rows_out"] == 0 and "no input line was a valid event: all 1 were quarantined (bad_json 1)" in caplog.text


def test_a_compressed_file_that_fails_its_checksum_is_refused(tmp_path):
    """Found in review: a .gz with one flipped byte (a user_id changed, which an opt-out list would no
    longer match) kept all its lines and was reported as "truncated": gzip checks its CRC only at the end
    of a member, after the lines were read. The file is refused with one line naming it (exit 2)."""
    import gzip

    from datakit.io.fs import InputError

    body = b"".join(_line(i, user_id="u_17358e9ea8") + b"\n" for i in range(50))
    data = bytearray(gzip.compress(body, compresslevel=0))
    at = data.index(b"u_17358e9ea8")
    data[at + 2] = ord("0")
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl.gz").write_bytes(bytes(data))
    with pytest.raises(InputError, match=r"a\.jsonl\.gz: the compressed file failed its integrity check \(BadGzipFile: "
                                         r"CRC check failed"):
        _run(tmp_path, tmp_path / "in" / "a.jsonl.gz")
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_only_pyarrows_own_errors_count_as_damaged_parquet():
    from datakit.io.readers import _parquet_damage

    assert _parquet_damage(OSError("Corrupt snappy compressed data."))
    assert _parquet_damage(pa.ArrowInvalid("Parquet magic bytes not found"))
    # what the storage stack raises stays an error: an OS read failure, s3fs's unknown error, its mapped ones
    assert not _parquet_damage(OSError(5, "Input/output error"))
    assert not _parquet_damage(PermissionError("Access Denied"))
    assert not _parquet_damage(TimeoutError())
    wrapped = OSError("read failed")
    wrapped.__cause__ = ConnectionResetError(104, "reset")
    assert not _parquet_damage(wrapped)


def test_parquet_typed_timestamps_still_accepted(tmp_path):
    evs = [make_event(i) for i in range(3)]
    t = _event_columns(evs)
    ts = pa.array([1793527200123 + i for i in range(3)], pa.timestamp("ms", tz="UTC"))
    t = t.set_column(t.schema.get_field_index("timestamp"), "timestamp", ts)
    (tmp_path / "in").mkdir()
    pq.write_table(t, tmp_path / "in" / "ev.parquet")
    st, q = _run(tmp_path, tmp_path / "in" / "ev.parquet", "parquet")
    assert st["rows_out"] == 3 and q == []
    from datakit.io.dataset import read_output

    assert read_output(str(tmp_path / "out")).column("timestamp").to_pylist()[0].endswith(".123Z")


SECRET = "AKIAIOSFODNN7EXAMPLE"
EMAIL = "jane.doe@example.com"


def _planted(tmp_path):
    # well-formed events rejected only for a new event type / a bad field: whole conversations
    chat = make_event(2, event_type="voice_note", messages=[{"role": "user", "content": f"key {SECRET} mail {EMAIL}"}])
    bad = make_event(6, latency_ms=-1, messages=[{"role": "user", "content": f"ping {EMAIL}"}])
    return write_jsonl(tmp_path / "in" / "a.jsonl", [make_event(1), chat, bad])


@pytest.mark.parametrize("mode", ["default", "scrubbed", "hash"])
def test_quarantine_never_keeps_planted_secrets_or_emails(tmp_path, mode):
    f = _planted(tmp_path)
    stage = {"kind": "ingest"} if mode == "default" else {"kind": "ingest", "quarantine": {"raw": mode}}
    out = tmp_path / "out"
    res = Pipeline("t").input(str(f)).add(stage).output(str(out)).run(workers=1)
    assert res.stage("ingest")["dropped"] == {"unknown_event_type": 1, "bad_value": 1}
    blob = b"".join(p.read_bytes() for p in (out / "_quarantine").rglob("*"))
    rows = pq.read_table(out / "_quarantine" / "part-00000.parquet").to_pylist()
    assert SECRET.encode() not in blob and EMAIL.encode() not in blob
    raws = [r["raw"] for r in sorted(rows, key=lambda r: r["source_line"])]
    if mode == "hash":
        line2 = f.read_bytes().split(b"\n")[1]
        import hashlib

        start = len(f.read_bytes().split(b"\n")[0]) + 1
        assert raws[0] == f"sha256={hashlib.sha256(line2).hexdigest()};bytes={start}-{start + len(line2)}".encode()
    else:  # scrubbed: the line is still there to read, with placeholders
        assert b"voice_note" in raws[0] and b"ping" in raws[1]


def test_quarantine_verbatim_is_explicit(tmp_path):
    f = _planted(tmp_path)
    out = tmp_path / "out"
    Pipeline("t").input(str(f)).add({"kind": "ingest", "quarantine": {"raw": "verbatim"}}).output(str(out)).run(workers=1)
    rows = pq.read_table(out / "_quarantine" / "part-00000.parquet").to_pylist()
    assert min(rows, key=lambda r: r["source_line"])["raw"] == f.read_bytes().split(b"\n")[1]


def test_arrow_refusing_a_value_costs_that_row_only():
    """The safety net behind the validator: a value Arrow cannot hold quarantines its row (`unconvertible`)."""
    from datakit.stages.ingest import _OUT_FIELDS, _to_arrow

    rows = [dict.fromkeys(_OUT_FIELDS) | {"event_id": f"e{i}", "_source_file": "f", "_source_line": i}
            for i in range(3)]
    rows[1]["latency_ms"] = 2**70  # as if a rule were missing
    drops, details, raws = [None] * 3, [None] * 3, [None] * 3
    t = _to_arrow(rows, drops, details, raws, [b"l0", b"l1", b"l2"])
    assert drops == [None, "unconvertible", None] and details[1] == "OverflowError" and raws[1] == b"l1"
    assert t.column("event_id").to_pylist() == ["e0", None, "e2"]


def test_quarantine_hashes_when_the_scrubber_cannot_load(monkeypatch):
    import datakit.stages.ingest as ingest

    def unavailable():
        raise ImportError("no presidio")

    monkeypatch.setattr(ingest, "quarantine_scrubber", unavailable)
    fn = ingest.IngestFn("scrubbed")
    fn.setup()  # what an engine calls once per worker: the loader fails, so lines are hashed
    out = ingest.quarantine_raw([f"key {SECRET}".encode(), None], [10, None], "scrubbed", fn._scrub)
    assert out[1] is None and out[0].startswith(b"sha256=") and out[0].endswith(b";bytes=10-34")
    monkeypatch.undo()
    fn = pickle.loads(pickle.dumps(ingest.IngestFn("scrubbed")))
    fn.setup()
    out = ingest.quarantine_raw([f"key {SECRET}".encode()], [10], "scrubbed", fn._scrub)
    assert SECRET.encode() not in out[0] and not out[0].startswith(b"sha256=")  # scrubbed, not hashed


def test_quarantine_scrubbing_sees_through_json_escapes():
    """Found in a privacy review: in a quarantined JSON line a secret after a `\\n` or `\\t` escape read as
    one word with the escape's letter (`nAKIA...`) and was kept verbatim, as was an email written with
    `\\u0040`; a line with "version" anywhere kept its phone numbers."""
    import datakit.stages.ingest as ingest

    fn = ingest.IngestFn("scrubbed")
    fn.setup()
    raw = (rb'{"event_id":"q1","x":"keys:\nAKIAF7QCAJ6XUBR7M2GM\n\tghp_5MQ34CCYabcdefghijklmnopqrstuvwxyz12'
           rb'\n219-09-9999","m":"jane.doe\u0040example.com, a \\u0040 sign","client_version":"0.9.1",'
           rb'"p":"call (415) 867-5309"}')
    out = ingest.quarantine_raw([raw], [0], "scrubbed", fn._scrub)[0].decode()
    for leaked in ("AKIAF7QCAJ6XUBR7M2GM", "ghp_5MQ34CCY", "219-09-9999", "jane.doe", "867-5309"):
        assert leaked not in out, out
    # the rest of the line is the line: escapes as they were (an escaped backslash is not decoded)
    assert out.startswith(r'{"event_id":"q1","x":"keys:\n<AWS_ACCESS_KEY>\n\t<GITHUB_TOKEN>\n<SSN>"')
    assert r'a \\u0040 sign' in out and '"client_version":"0.9.1"' in out


def test_quarantine_scrubbing_reads_quoted_values_escaped_slashes_and_every_ascii_escape():
    """Found in review: the default quarantine (`raw: scrubbed`) kept quoted secrets (in a JSON line every
    quote in a string is `\"`, so `DB_PASSWORD = \"...\"` was no assignment), paths and webhook URLs
    written with `\/` (PHP's json_encode), letters P-Z written as `\u0051` (`AKIA\u0051...`) and values
    behind an escaped zero-width space or fullwidth `@`. The detectors read the line's decoded view and
    the findings are replaced in the line as written."""
    import datakit.stages.ingest as ingest
    from datakit.stages.quarantine import json_view

    fn = ingest.IngestFn("scrubbed")
    fn.setup()
    prefix = 'DB_HOST = "db.internal"\nDB_PASSWORD = "s3cr3tP4ssw0rd!"\napi_key = "a8f5f167f44f4964e6c998dee827110c"\n'
    quoted = json.dumps({"event_id": "q-1", "context": {"prefix": prefix}, "latency_ms": -5})
    hook = "https://hooks.slack.com/services/T01ABCDEF/B01ABCDEF/abcdefghijklmnopqrstuvwx"
    slashed = json.dumps({"event_id": "q-3", "prefix": f'open("/Users/janedoe/proj/a.py")\nHOOK = "{hook}"\n'}
                         ).replace("/", "\\/")
    escaped = (r'{"event_id":"q-4","k":"AKIA\u0051WERTYUIOPASDFGH","t":"ghp_5MQ34CCY\u005Aabcdefghijklmnopqrstuvwxyz1",'
               r'"z":"AKIA\u200bQWERTYUIOPASDFGH","m":"zed.hostile\uff20example.org","s":"\ud83d\ude00 ok \ud800"}')
    raws = [quoted.encode(), slashed.encode(), escaped.encode()]
    out = [o.decode() for o in ingest.quarantine_raw(raws, [0, 0, 0], "scrubbed", fn._scrub)]
    for leaked in ("s3cr3tP4ssw0rd", "a8f5f167f44f4964", "janedoe", "T01ABCDEF", "abcdefghijklmnopqrstuvwx",
                   "WERTYUIOPASDFGH", "Zabcdefghijklmnop", "QWERTYUIOPASDFGH", "zed.hostile"):
        assert not any(leaked in o for o in out), (leaked, out)
    # the rest of each line is the line as written: its escapes, its other values
    assert out[0].startswith('{"event_id": "q-1", "context": {"prefix": "DB_HOST = \\"db.internal\\"\\nDB_PASSWORD = \\"')
    assert '\\/proj\\/a.py' in out[1] and out[1].startswith('{"event_id": "q-3"')
    assert out[2].endswith(r'"s":"\ud83d\ude00 ok \ud800"}'), out[2]
    # the view: every escape decoded, a surrogate pair to its character, a lone surrogate left as written
    v = json_view(r'a\"b\/c\\u0040 \u0041\ud83d\ude00\ud800')
    assert v.view == 'a"b/c\\u0040 A\U0001F600\\ud800'
    assert v.span(1, 2) == (1, 3) and v.span(13, 14) == (21, 33)


def test_a_repo_url_password_holding_a_slash_or_an_at_sign_is_removed_whole():
    """Found in review: `https://deploy:wJalr/XUtn...@github.com/o/r` kept its credentials (and scrub_pii left
    `deploy:wJalr/<EMAIL>`), and `https://deploy:p@ssw0rd@github.com/o/r` kept `ssw0rd@`."""
    from datakit.stages.ingest import parse_line

    for given, kept in (("https://deploy:wJalr/XUtnFEMI+K7MDENG@github.com/o/r", "https://github.com/o/r"),
                        ("https://deploy:p@ssw0rd@github.com/o/r", "https://github.com/o/r"),
                        ("https://u:pw@10.0.0.1:8080/o/r", "https://10.0.0.1:8080/o/r"),
                        ("https://registry.npmjs.org/@babel/core", "https://registry.npmjs.org/@babel/core"),
                        ("https://host:8080/@scope/x", "https://host:8080/@scope/x")):
        ev = make_event(71, repo={"repo_id": given, "commit": "c" * 40})
        assert parse_line(json.dumps(ev).encode())["repo"]["repo_id"] == kept, given


def test_a_key_repeated_with_another_json_value_is_a_conflict_even_when_python_calls_them_equal():
    """Found in review: `"privacy_mode": 0, "privacy_mode": false` was accepted as an equal repeat (0 == False
    in Python) while `true, 1` was rejected; `5` and `5.0` alike. Repeats are compared as JSON."""
    from datakit.stages.ingest import InvalidEvent, parse_line

    ev = make_event(72)
    for field in ("privacy_mode", "latency_ms"):
        ev.pop(field, None)
    line = json.dumps(ev).encode()
    for field, a, b in (("privacy_mode", "0", "false"), ("privacy_mode", "true", "1"), ("latency_ms", "5", "5.0")):
        bad = line[:-1] + f', "{field}": {a}, "{field}": {b}}}'.encode()
        with pytest.raises(InvalidEvent) as e:
            parse_line(bad)
        assert e.value.reason == "duplicate_key", (field, a, b)
    same = line[:-1] + b', "privacy_mode": false, "latency_ms": 5, "latency_ms": 5}'
    assert parse_line(same)["latency_ms"] == 5  # an equal repeat stays harmless


def test_a_repo_url_keeps_no_credentials(tmp_path):
    """Found in a privacy review: `source.repo_id` (lineage, which scrub_pii does not read) kept
    `https://x-access-token:ghp_...@github.com/...` in every record of the repository."""
    from datakit.stages.ingest import parse_line

    token = "ghp_5MQ34CCYabcdefghijklmnopqrstuvwxyz12"
    for given, kept in ((f"https://x-access-token:{token}@github.com/o/r", "https://github.com/o/r"),
                        ("org/web", "org/web"), ("git@github.com:o/r.git", "git@github.com:o/r.git")):
        ev = make_event(70, repo={"repo_id": given, "commit": "c" * 40})
        assert parse_line(json.dumps(ev).encode())["repo"]["repo_id"] == kept
    ev = make_event(1, repo={"repo_id": f"https://u:{token}@example.com/o/r", "commit": "c" * 40})
    f = write_jsonl(tmp_path / "in" / "a.jsonl", [ev])
    out = tmp_path / "out"
    Pipeline("t").input(str(f)).add({"kind": "ingest"}).add({"kind": "extract", "kinds": ["code", "fim"]}) \
        .output(str(out)).run(workers=1)
    from datakit.io.dataset import read_output

    assert {r["repo_id"] for r in read_output(str(out)).column("source").to_pylist()} == {"https://example.com/o/r"}
    assert not any(token.encode() in p.read_bytes() for p in out.rglob("*") if p.is_file())


def test_an_acceptance_that_differs_in_line_ends_and_trailing_blanks_only_is_kept(tmp_path):
    f = write_jsonl(tmp_path / "in" / "a.jsonl", [make_event(1, suggestion="def f():\n    pass\n", outcome="accepted",
                                                             accepted_text="def f():  \r\n    pass")])
    st, q = _run(tmp_path, f)
    assert (st["rows_in"], st["rows_out"], q) == (1, 1, [])


@pytest.mark.parametrize("char", ["\u0085", "\u2028", "\u2029", "\u200b", "\u202e", "\ufeff", "\u00ad",
                                  "\U000e0041", "\x9b"])
def test_ids_hold_no_invisible_control_of_any_kind(char):
    """Found in a hostile-input review: C1 controls, the line/paragraph separators, zero-width and
    bidirectional-override characters and the byte-order mark were accepted in ids, although the rule
    (README: "ids hold no control character") says otherwise; an RTL override shows an id reversed."""
    from datakit.stages.ingest import InvalidEvent, parse_line

    for field in ("event_id", "user_id", "org_id", "session_id"):
        ev = make_event(3, **{field: f"id{char}x"})
        with pytest.raises(InvalidEvent) as e:
            parse_line(json.dumps(ev, ensure_ascii=False).encode())
        assert (e.value.reason, e.value.detail) == ("bad_value", field)
    assert parse_line(json.dumps(make_event(3, user_id="usér-ß-東京")).encode())["user_id"] == "usér-ß-東京"


def test_the_id_rule_covers_every_control_format_and_separator_character_of_this_unicode():
    import unicodedata

    from datakit.stages.ingest import _CONTROL

    wanted = [chr(c) for c in range(0x110000) if unicodedata.category(chr(c)) in ("Cc", "Cf", "Zl", "Zp")]
    assert len(wanted) > 200 and all(_CONTROL.search(c) for c in wanted)
    assert not any(_CONTROL.search(c) for c in "aZ09-_.:@/ ßé東")


def test_a_huge_number_in_a_field_nobody_reads_never_costs_the_event():
    """Found in a hostile-input review: a 5,000-digit integer (more than Python makes an int of) in a field
    the contract does not name made the whole line bad_json; in a field it names it is still refused."""
    from datakit.stages.ingest import InvalidEvent, parse_line

    ev = make_event(5)
    line = json.dumps(ev).encode()
    huge = "9" * 5000
    kept = parse_line(line[:-1] + f', "future_counter": {huge}, "neg": -{huge}}}'.encode())
    assert kept["event_id"] == ev["event_id"] and kept["latency_ms"] == ev["latency_ms"]
    ev.pop("latency_ms")
    with pytest.raises(InvalidEvent) as e:
        parse_line(json.dumps(ev).encode()[:-1] + f', "latency_ms": {huge}}}'.encode())
    assert e.value.reason in ("wrong_type", "bad_value")
    with pytest.raises(InvalidEvent) as e:
        parse_line(line[:-1] + b', "x": 12a}')  # not JSON stays bad_json
    assert e.value.reason == "bad_json"


def test_an_address_broken_by_a_byte_that_is_not_utf8_is_masked_whole_in_the_quarantine(tmp_path):
    """Found in a hostile-input review: the line was decoded with U+FFFD for the bad byte, which is no letter, so
    `jose.garc\\xeda@example.com` became `jose.garc\\ufffd<EMAIL>` in _quarantine/, keeping half of the name.
    The byte is read as the Windows-1252 / Latin-1 character it stands for, and the address is one finding."""
    import pyarrow.parquet as pq

    good = json.dumps(make_event(1)).encode()
    bad = good[:-1] + b', "note": "write to jose.garc\xeda@example.com or m\xfcller@beispiel.de"}'
    write_jsonl(tmp_path / "logs" / "a.jsonl", [good, bad])
    (Pipeline("q").input(str(tmp_path / "logs")).add({"kind": "ingest"})
     .output(str(tmp_path / "out"), format="parquet", shards=1).run(workers=1))
    rows = [r for f in sorted((tmp_path / "out" / "_quarantine").rglob("*.parquet"))
            for r in pq.read_table(f).to_pylist()]
    assert [r["reason"] for r in rows] == ["bad_utf8"]
    kept = rows[0]["raw"]
    kept = kept if isinstance(kept, bytes) else kept.encode()
    assert b"<EMAIL>" in kept and b"garc" not in kept and b"ller" not in kept, kept
