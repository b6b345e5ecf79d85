"""Ingest: every malformed-input kind lands in quarantine with its reason, file and line; the job goes on."""
from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
import zstandard

from datakit import Pipeline
from datakit.io.dataset import read_output
from tests.eventgen import make_event, write_jsonl


def _run(tmp_path, pattern, **kw):
    out = tmp_path / "out"
    res = Pipeline("t").input(str(pattern)).add({"kind": "ingest"}).output(str(out), shards=2).run(workers=1, **kw)
    q = out / "_quarantine" / "part-00000.parquet"
    quarantine = pq.read_table(q).to_pylist() if q.exists() else []
    return res, out, quarantine


def test_every_malformed_kind_is_quarantined_with_reason_and_line(tmp_path):
    good = [make_event(i) for i in range(6)]
    missing = make_event(10); del missing["user_id"]
    wrong = make_event(11, latency_ms="slow")
    unknown = make_event(12, event_type="telepathy")
    badts = make_event(13, timestamp="yesterday")
    no_msgs = make_event(14); no_msgs["event_type"] = "chat_turn"; no_msgs.pop("messages", None)
    rows = [good[0], b'{"event_id": "x", ', good[1], b"\xff\xfe not utf8", missing, wrong, good[2],
            unknown, badts, b"[1, 2, 3]", good[3], no_msgs]
    f = write_jsonl(tmp_path / "logs" / "a.jsonl", rows)
    res, out, q = _run(tmp_path, f)
    st = res.stage("ingest")
    assert st["rows_in"] == len(rows)
    assert st["rows_out"] == 4
    assert st["dropped"] == {"bad_json": 1, "bad_utf8": 1, "missing_field": 2, "wrong_type": 1,
                             "unknown_event_type": 1, "bad_timestamp": 1, "not_an_object": 1}
    by_line = {r["source_line"]: r for r in q}
    assert by_line[2]["reason"] == "bad_json" and by_line[2]["raw"] == b'{"event_id": "x", '
    assert by_line[4]["reason"] == "bad_utf8"
    assert by_line[5]["reason"] == "missing_field" and by_line[5]["detail"] == "user_id"
    assert by_line[6]["detail"] == "latency_ms"
    assert by_line[12]["detail"] == "messages"
    assert all(r["source_file"] == str(f) for r in q)
    assert read_output(str(out)).num_rows == 4


def test_truncated_zstd_keeps_lines_before_the_cut(tmp_path):
    # zstd decodes whole blocks (128 KiB): make enough distinct text that the cut leaves complete blocks
    import random

    rnd = random.Random(0)
    data = b"".join(json.dumps(make_event(i, suggestion="".join(rnd.choice("abcdefgh ") for _ in range(300)))).encode()
                    + b"\n" for i in range(2000))
    blob = zstandard.ZstdCompressor().compress(data)
    path = tmp_path / "logs" / "cut.jsonl.zst"
    path.parent.mkdir(parents=True)
    path.write_bytes(blob[: len(blob) // 2])
    res, out, q = _run(tmp_path, path)
    st = res.stage("ingest")
    assert st["dropped"].get("truncated_file") == 1
    assert 0 < st["rows_out"] < 2000
    assert st["rows_in"] == st["rows_out"] + sum(st["dropped"].values())
    assert [r["reason"] for r in q if r["reason"] == "truncated_file"] == ["truncated_file"]


@pytest.mark.parametrize("name", ["empty.jsonl.zst", "empty.jsonl.gz"])
def test_a_zero_byte_compressed_file_is_a_truncated_file_not_an_empty_day(tmp_path, name):
    """Found in review: a 0-byte .zst/.gz (what a failed upload leaves) read as a day without events,
    exit 0. A compressed empty text has a header; no bytes at all is a truncated file. An empty plain
    .jsonl, and a compressed file holding no lines, are still empty inputs."""
    import gzip

    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / name).write_bytes(b"")
    res, _out, q = _run(tmp_path, tmp_path / "logs" / name)
    assert res.stage("ingest")["dropped"] == {"truncated_file": 1} and res.stage("ingest")["rows_out"] == 0
    assert [(r["reason"], r["source_line"]) for r in q] == [("truncated_file", 1)]
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "plain.jsonl").write_bytes(b"")
    (empty / "no-lines.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(b""))
    with gzip.open(empty / "no-lines.jsonl.gz", "wb"):
        pass
    res, _out, q = _run(tmp_path, empty / "*")
    assert res.stage("ingest")["rows_in"] == 0 and q == []


@pytest.mark.parametrize("name", ["notgzip.jsonl.gz", "notzstd.jsonl.zst"])
def test_a_file_that_is_not_its_compression_format_is_unreadable_not_truncated(tmp_path, name):
    """Found in review: a plain text file named `.gz` was `truncated_file: BadGzipFile`; nothing of it
    could ever be read, so it is an `unreadable_file` (as a `.parquet` that is not Parquet)."""
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / name).write_bytes(b'{"not": "compressed"}\n' * 3)
    res, _out, q = _run(tmp_path, tmp_path / "logs" / name)
    assert res.stage("ingest")["dropped"] == {"unreadable_file": 1} and res.stage("ingest")["rows_out"] == 0
    assert [r["reason"] for r in q] == ["unreadable_file"] and q[0]["detail"] in ("BadGzipFile", "ZstdError")


def test_gz_and_zst_and_plain_read_alike(tmp_path):
    rows = [make_event(i) for i in range(30)]
    for suffix in ("a.jsonl", "b.jsonl.gz", "c.jsonl.zst"):
        write_jsonl(tmp_path / "logs" / suffix, [dict(r, event_id=f"{suffix}-{r['event_id']}") for r in rows])
    res, out, q = _run(tmp_path, tmp_path / "logs")
    assert res.stage("ingest")["rows_out"] == 90 and q == []


def test_fifty_megabyte_line_is_quarantined_not_fatal(tmp_path):
    huge = json.dumps(make_event(99, suggestion="x" * (50 * 1024 * 1024))).encode()
    f = write_jsonl(tmp_path / "logs" / "big.jsonl", [make_event(1), huge, make_event(2)])
    res, out, q = _run(tmp_path, f)
    st = res.stage("ingest")
    assert st["rows_out"] == 2 and st["dropped"] == {"line_too_long": 1}
    assert q[0]["source_line"] == 2 and len(q[0]["raw"]) <= 4096


@pytest.mark.parametrize("key_starts_before_cut", [30, 4000])
def test_a_secret_the_line_too_long_cut_goes_through_leaves_no_piece(tmp_path, key_starts_before_cut):
    """Found in review: the kept 4096-byte prefix ended inside an API key, whose first 30 characters
    were too few for the scrubber to recognise, and were stored as they were."""
    key = b"sk-proj-HoStIlE9f8e7d6c5b4a3928171605abcdefABCDEF"
    head = b'{"event_id": "x", "junk": "'
    line = head + b"a" * (4096 - len(head) - key_starts_before_cut) + b" " + key + b" " + b"b" * (9 * 1024 * 1024) + b'"}'
    f = write_jsonl(tmp_path / "logs" / "big.jsonl", [make_event(1), line])
    res, out, q = _run(tmp_path, f)
    assert res.stage("ingest")["dropped"] == {"line_too_long": 1}
    raw = q[0]["raw"]
    assert raw.startswith(head) and len(raw) <= 4096
    assert not any(key[i:i + 8] in raw for i in range(len(key) - 8))


def test_parquet_events_are_validated_too(tmp_path):
    import pyarrow as pa

    from datakit.contracts import EDITOR_EVENT_V1

    evs = [make_event(i) for i in range(8)]
    evs[3]["user_id"] = None
    names = [f.name for f in EDITOR_EVENT_V1 if not f.name.startswith("_")]
    t = pa.Table.from_pylist([{k: e.get(k) for k in names} for e in evs],
                             schema=pa.schema([EDITOR_EVENT_V1.field(n) for n in names]))
    path = tmp_path / "in" / "ev.parquet"
    path.parent.mkdir()
    pq.write_table(t, path)
    out = tmp_path / "out"
    res = (Pipeline("t").input(str(path), format="parquet").add({"kind": "ingest"})
           .output(str(out)).run(workers=1))
    assert res.stage("ingest")["dropped"] == {"missing_field": 1}
    assert res.stage("ingest")["rows_out"] == 7


def test_timestamps_normalized_to_utc():
    from datakit.stages.ingest import normalize_timestamp

    assert normalize_timestamp("2026-11-01T12:00:00+02:00") == "2026-11-01T10:00:00.000Z"
    assert normalize_timestamp("2026-11-01T10:00:00Z") == "2026-11-01T10:00:00.000Z"
    with pytest.raises(ValueError):
        normalize_timestamp("nope")


def test_repeated_event_ids_keep_the_first_copy(tmp_path):
    a = [make_event(i) for i in range(10)]
    b = [make_event(i, suggestion="retried copy") for i in (3, 4, 11)]
    write_jsonl(tmp_path / "logs" / "a.jsonl", a)
    write_jsonl(tmp_path / "logs" / "b.jsonl", b + [make_event(3)])
    res, out, q = _run(tmp_path, tmp_path / "logs")
    st = res.stage("ingest")
    assert st["rows_in"] == 14 and st["rows_out"] == 11 and st["dropped"] == {"duplicate_event_id": 3}
    t = read_output(str(out))
    assert sorted(t.column("event_id").to_pylist()) == sorted({e["event_id"] for e in a + b})
    kept = {r["event_id"]: r["_source_file"] for r in t.select(["event_id", "_source_file"]).to_pylist()}
    assert kept["ev-000003"].endswith("a.jsonl") and kept["ev-000011"].endswith("b.jsonl")


def test_of_copies_that_disagree_on_privacy_mode_the_private_one_stays(tmp_path):
    """Found in review: two copies of one event, the later one (by file name) with `privacy_mode: true`,
    kept the first read, so the event was trained on. A conflicting privacy flag never means off: the
    private copy stays, and consent drops it."""
    from datakit import Pipeline

    write_jsonl(tmp_path / "logs" / "a.jsonl", [make_event(i) for i in range(4)])
    write_jsonl(tmp_path / "logs" / "b.jsonl", [make_event(1, privacy_mode=True), make_event(2)])
    res, out, _q = _run(tmp_path, tmp_path / "logs")
    assert res.stage("ingest")["dropped"] == {"duplicate_event_id": 2}
    kept = {r["event_id"]: (r["_source_file"].rsplit("/", 1)[-1], r["privacy_mode"])
            for r in read_output(str(out)).to_pylist()}
    assert kept["ev-000001"] == ("b.jsonl", True) and kept["ev-000002"] == ("a.jsonl", False)
    res = (Pipeline("t").input(str(tmp_path / "logs")).add({"kind": "ingest"}).add({"kind": "consent"})
           .output(str(tmp_path / "c"), shards=1).run(workers=1))
    assert sorted(read_output(str(tmp_path / "c")).column("event_id").to_pylist()) == ["ev-000000", "ev-000002",
                                                                                       "ev-000003"]


def test_a_zstd_bomb_is_read_in_bounded_pieces(tmp_path, monkeypatch):
    """Found in review: 16 KB of zstd (512 MB of one letter, no newline) took 27 s and 1.5 GB: each
    decompress call returned all it could make of 256 KB of input, and every read copied the rest of
    that buffer. The input is now fed in steps sized from the ratio seen, so no call's output is more
    than ~43 MB (zstd's most per KB of input), and the line is one `line_too_long` row."""
    from datakit.io import readers

    path = tmp_path / "bomb.jsonl.zst"
    path.write_bytes(zstandard.ZstdCompressor(level=3).compress(b"a" * (128 << 20)))
    assert path.stat().st_size < 16 << 10
    largest = [0]
    more = readers._ZstdFrames._more

    def watched(self):
        went = more(self)
        largest[0] = max(largest[0], len(self._buf))
        return went

    monkeypatch.setattr(readers._ZstdFrames, "_more", watched)
    rows = [r for b in readers.iter_raw_lines(str(path)) for r in b.to_pylist()]
    assert [r["_read_error"] for r in rows] == ["line_too_long"]
    assert 0 < largest[0] <= 48 << 20
