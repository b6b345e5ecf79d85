"""Fuzz ingest with hypothesis: whatever the input files hold, `datakit run` exits 0 and every line
(or Parquet row) is accounted for -- kept, or one quarantine row with a reason.

Bounded (few examples, no deadline) so it stays a few seconds of `make test`.
"""
from __future__ import annotations

import gzip
import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from datakit.cli import app
from datakit.contracts import EDITOR_EVENT_V1
from tests.eventgen import make_event

_FIELDS = [f.name for f in EDITOR_EVENT_V1 if not f.name.startswith("_")]

_weird_values = st.one_of(
    st.none(), st.booleans(), st.text(max_size=8), st.just("false"), st.just(""), st.just("a\u0000b"),
    st.integers(min_value=-(2**80), max_value=2**80), st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-05:00", "2026-13-45T99:00:00Z",
                     "+275760-09-13T00:00:00Z", "2026-11-01T10:00:00+23:59"]),
    st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


@st.composite
def _event_line(draw) -> bytes:
    """A valid event, then a few fields replaced by odd values, maybe a repeated key, maybe a surrogate."""
    ev = make_event(draw(st.integers(0, 40)))
    for name in draw(st.lists(st.sampled_from(_FIELDS), max_size=3)):
        ev[name] = draw(_weird_values)
    text = json.dumps(ev)
    if draw(st.booleans()):  # a repeated key, with the same or another value
        key = draw(st.sampled_from(["privacy_mode", "event_id", "latency_ms"]))
        text = text[:-1] + f', "{key}": {json.dumps(draw(_weird_values))}}}'
    if draw(st.integers(0, 5)) == 0:
        text = text.replace('"1.2.3"', '"\\udc80"')  # lone surrogate escape
    return text.encode()


_lines = st.one_of(
    _event_line(),
    st.binary(max_size=40),  # random bytes (may hold \n, \r, \xff ...)
    st.integers(1, 3000).map(lambda d: b"[" * d + b"]" * d),  # deep nesting
    st.integers(1, 5000).map(lambda n: b'{"latency_ms": ' + b"9" * n + b"}"),  # huge numbers
    st.just(b""), st.just(b"   "), st.just(b"null"), st.just(b'"just a string"'),
)


def _jsonl_bytes(lines: list[bytes], crlf: bool, bom: bool) -> bytes:
    data = (b"\r\n" if crlf else b"\n").join(lines) + b"\n"
    return (b"\xef\xbb\xbf" if bom else b"") + data


def _physical_lines(data: bytes) -> int:
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    return data.count(b"\n") + (0 if not data or data.endswith(b"\n") else 1)


def _event_columns_of(evs) -> pa.Table:
    return pa.Table.from_pylist([{k: e.get(k) for k in _FIELDS} for e in evs],
                                schema=pa.schema([EDITOR_EVENT_V1.field(n) for n in _FIELDS]))


@st.composite
def _input_file(draw):
    """(name, bytes, expected rows or None when a corrupt stream makes the count unknowable)."""
    kind = draw(st.sampled_from(["jsonl", "gz", "zst", "parquet_events", "parquet_foreign", "parquet_odd"]))
    if kind.startswith("parquet"):
        if kind == "parquet_foreign":
            t = pa.table({"x": [1, 2], "event_id": [[1], None], "privacy_mode": ["false", "true"]})
        elif kind == "parquet_odd":  # odd Arrow types and two columns of one name
            ev = _event_columns_of([make_event(1), make_event(2)])
            t = pa.Table.from_arrays(
                list(ev.columns) + [pa.array([2**63 + 5, 7], pa.uint64()), pa.array([True, False]),
                                    pa.array([b"\xff", b"ok"], pa.binary()),
                                    pa.array([253402300800 * 1000 * 50, 0], pa.timestamp("ms"))],
                names=ev.schema.names + ["latency_ms", "privacy_mode", "suggestion", "timestamp"])
        else:
            t = _event_columns_of([make_event(i) for i in range(draw(st.integers(1, 5)))])
        buf = io.BytesIO()
        pq.write_table(t, buf)
        data = buf.getvalue()
        if draw(st.booleans()):
            return "p.parquet", data[: draw(st.integers(0, len(data) - 1))], None  # cut: unreadable
        return "p.parquet", data, t.num_rows
    lines = draw(st.lists(_lines, min_size=0, max_size=12))
    plain = _jsonl_bytes(lines, draw(st.booleans()), draw(st.booleans()))
    expected = _physical_lines(plain)
    if kind == "jsonl":
        return "a.jsonl", plain, expected
    data = gzip.compress(plain, mtime=0) if kind == "gz" else zstandard.ZstdCompressor().compress(plain)
    damage = draw(st.sampled_from(["none", "truncate", "garbage"]))
    if damage == "truncate":
        return f"a.jsonl.{kind}", data[: draw(st.integers(1, len(data) - 1))], None
    if damage == "garbage":
        tail = draw(st.binary(min_size=1, max_size=20))
        # zero bytes after a gzip member are padding that gzip itself ignores (`gzip -d`: "trailing zero
        # bytes ignored"): not a damaged line
        padding = kind == "gz" and not tail.strip(b"\x00")
        return f"a.jsonl.{kind}", data + tail, expected + (0 if padding else 1)
    return f"a.jsonl.{kind}", data, expected


def _run_cli(folder: Path, fmt: str):
    (folder / "p.yaml").write_text(
        f"name: fuzz\ninput: {{path: in, format: {fmt}}}\nstages: [{{kind: ingest}}]\n"
        "output: {path: out, shards: 1}\n")
    return CliRunner().invoke(app, ["run", str(folder / "p.yaml"), "--workers", "1", "--json"])


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(files=st.lists(_input_file(), min_size=1, max_size=3))
def test_ingest_never_crashes_and_accounts_for_every_line(tmp_path_factory, files):
    folder = tmp_path_factory.mktemp("fuzz")
    for fmt in ("jsonl", "parquet"):
        chosen = [f for f in files if f[0].endswith(".parquet") == (fmt == "parquet")]
        if not chosen:
            continue
        sub = folder / fmt
        (sub / "in").mkdir(parents=True)
        for i, (name, data, _) in enumerate(chosen):
            (sub / "in" / f"{i}-{name}").write_bytes(data)
        r = _run_cli(sub, fmt)
        assert r.exit_code == 0, (r.output, r.exception)
        ing = json.loads(r.stdout)["stages"][0]
        dropped = ing["dropped"]
        assert ing["rows_in"] == ing["rows_out"] + sum(dropped.values())
        known = [e for _, _, e in chosen]
        if None not in known:
            assert ing["rows_in"] == sum(known)
        q = sub / "out" / "_quarantine" / "part-00000.parquet"
        quarantined = pq.read_table(q).num_rows if q.exists() else 0
        assert quarantined == sum(dropped.values()) - dropped.get("duplicate_event_id", 0)
        assert json.loads((sub / "out" / "manifest.json").read_text())["rows"] == ing["rows_out"]
