"""Storage through fsspec: an S3 API served by moto on loopback, and fsspec's memory:// filesystem."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from datakit import Pipeline
from datakit.io.dataset import read_output
from tests.eventgen import make_event, write_jsonl


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _forget_s3_clients() -> None:
    """Drop fsspec's cached S3 filesystems (their clients keep the endpoint they were made with)."""
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()


@pytest.fixture(scope="module")
def s3_endpoint():
    """A moto S3 server on 127.0.0.1, with credentials in the environment (worker processes inherit them)."""
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    env = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": url}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    _forget_s3_clients()  # fsspec caches S3FileSystem instances: one made for an earlier server would stay
    try:
        deadline = time.monotonic() + 120  # a loaded CI machine can take many seconds to start it
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the moto S3 server did not start on port {port}") from None
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        _forget_s3_clients()
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_pipeline_reads_and_writes_s3(s3_endpoint, tmp_path):
    import s3fs

    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": s3_endpoint})
    fs.mkdir("logs-bucket")
    local = write_jsonl(tmp_path / "a.jsonl.zst", [make_event(i) for i in range(25)] + [b"nope"])
    fs.put(str(local), "logs-bucket/raw/dt=2026-11-01/a.jsonl.zst")
    p = (Pipeline("s3").input("s3://logs-bucket/raw/dt=*/*.jsonl.zst").add({"kind": "ingest"})
         .output("s3://logs-bucket/out", shards=2))
    res = p.run(workers=2)
    assert res.stage("ingest")["rows_out"] == 25 and res.stage("ingest")["dropped"] == {"bad_json": 1}
    fs.invalidate_cache()
    names = sorted(f.rsplit("/", 1)[1] for f in fs.ls("logs-bucket/out"))
    assert "manifest.json" in names and "README.md" in names and "_run.json" in names
    assert sorted(f.rsplit("/", 1)[1] for f in fs.ls("logs-bucket/out/data")) == ["part-00000.parquet",
                                                                                 "part-00001.parquet"]
    assert not [n for n in names if n.startswith(".tmp-")]
    assert read_output("s3://logs-bucket/out").num_rows == 25
    run = json.loads(fs.cat_file("logs-bucket/out/_run.json"))
    assert run["stages"][0]["rows_in"] == 26


def test_plain_jsonl_on_s3_is_read(s3_endpoint, tmp_path):
    """Found while measuring issue 18's work folder: an uncompressed `.jsonl` input on S3 failed every
    task with `AbstractBufferedFile.readline() takes 1 positional argument` (a traceback, exit 1)."""
    import s3fs

    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": s3_endpoint})
    fs.mkdir("plain-bucket")
    local = write_jsonl(tmp_path / "a.jsonl", [make_event(i) for i in range(7)] + [b"nope"])
    fs.put(str(local), "plain-bucket/raw/a.jsonl")
    res = Pipeline("p").input("s3://plain-bucket/raw/a.jsonl").add({"kind": "ingest"}).output(str(tmp_path / "o")).run(
        workers=1)
    assert res.stage("ingest")["rows_in"] == 8 and res.stage("ingest")["rows_out"] == 7


def test_memory_filesystem_round_trip(tmp_path):
    import fsspec

    mem = fsspec.filesystem("memory")
    local = write_jsonl(tmp_path / "a.jsonl", [make_event(i) for i in range(10)])
    mem.pipe("/mlogs/a.jsonl", local.read_bytes())
    res = Pipeline("m").input("memory://mlogs/*.jsonl").add({"kind": "ingest"}).output("memory://mout").run(workers=1)
    assert res.stage("ingest")["rows_out"] == 10
    assert read_output("memory://mout").column("event_id").to_pylist() == sorted(f"ev-{i:06d}" for i in range(10))


def test_a_split_join_on_an_object_store_output_gives_the_local_bytes(s3_endpoint, tmp_path, monkeypatch):
    """Dedup with every join split into bucket joins (a zero memory budget), output on S3 (the engine then keeps
    a durable work folder there): the same dataset bytes and counts as the unsplit run to a local folder."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import s3fs

    from datakit.contracts import TRAINING_RECORD_V1
    from datakit.engines.local import partitioned_join
    from datakit.io.sinks import output_checksums

    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": s3_endpoint})
    fs.mkdir("split-bucket")
    texts = [f"def f{k}(x):\n" + "\n".join(f"    y{j} = x * {j} + {k}" for j in range(60)) for k in range(3)]
    rows = [{"doc_id": f"{i:04d}", "kind": "code",
             "segments": [{"text": texts[i % 3] + ("" if i < 20 else f"\n# note {i}"), "train": True, "role": None}],
             "chosen": None, "rejected": None, "source": None, "meta": "{}"} for i in range(40)]
    pq.write_table(pa.Table.from_pylist(rows, schema=TRAINING_RECORD_V1), tmp_path / "r.parquet")

    from datakit.engines.local.engine import LocalEngine

    splits: list = []
    real = LocalEngine._partitioned_join
    monkeypatch.setattr(LocalEngine, "_partitioned_join", lambda self, *a: splits.append(a[0]) or real(self, *a))

    def run(out: str, budget_mb: str):
        monkeypatch.setenv(partitioned_join.MEMORY_ENV, budget_mb)
        return (Pipeline("split").input(str(tmp_path / "r.parquet"), format="parquet", schema="training_record.v1")
                .add({"kind": "dedup", "minhash": {"threshold": 0.7, "verify": "exact"}}).output(out, shards=2)
                .run(workers=2).stage("dedup"))

    split = run("s3://split-bucket/out", "0")
    n_split = len(splits)
    assert n_split >= 3  # the verification joins and the marking joins ran as bucket joins
    whole = run(str(tmp_path / "o"), "1e12")
    assert len(splits) == n_split  # (and none in the run it is compared with)
    assert whole["dropped"].get("near_duplicate") and whole["dropped"].get("exact_duplicate")
    assert {k: split[k] for k in ("rows_in", "rows_out", "dropped")} == {k: whole[k] for k in ("rows_in", "rows_out", "dropped")}
    assert output_checksums("s3://split-bucket/out") == output_checksums(str(tmp_path / "o"))


def test_a_missing_bucket_is_one_line_exit_2_for_input_and_output(s3_endpoint, tmp_path):
    """Found in review: a bucket that does not exist (input or output) was a traceback, exit 1."""
    local = write_jsonl(tmp_path / "logs" / "a.jsonl", [make_event(i) for i in range(3)])
    for inp, out, needle in (("s3://no-such-bucket-in/raw/dt=*/*.jsonl.zst", str(tmp_path / "o1"), "no-such-bucket-in"),
                             (str(local), "s3://no-such-bucket-out/x", "cannot create the output there")):
        (tmp_path / "p.yaml").write_text(f"name: b\ninput: {{path: '{inp}'}}\nstages: [{{kind: ingest}}]\n"
                                         f"output: {{path: '{out}'}}\n")
        r = subprocess.run([sys.executable, "-m", "datakit.cli", "run", str(tmp_path / "p.yaml"), "--workers", "1"],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 2, r.stderr[-2000:]
        assert needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr[-2000:]


def test_a_packed_dataset_on_an_object_store_says_it_is_read_locally(s3_endpoint):
    """Found in review: Path("s3://b/x") became the local path s3:/b/x: "no manifest.json" from inspect
    and PackedDataset, a traceback with exit 1 (= contaminated) from contamination-check."""
    from datakit.loader import DatasetError, PackedDataset

    with pytest.raises(DatasetError, match="read from a local folder"):
        PackedDataset("s3://some-bucket/packed")
    for cmd in (["inspect", "s3://some-bucket/packed"],):
        r = subprocess.run([sys.executable, "-m", "datakit.cli", *cmd], capture_output=True, text=True, timeout=300)
        assert r.returncode == 2 and "read from a local folder" in r.stderr, r.stderr[-2000:]


def test_forget_on_an_s3_append_dataset_removes_the_users_rows(s3_endpoint, tmp_path):
    """Found in review: `datakit forget s3://...` (the command docs/scheduling.md shows) failed, exit 3, reading its
    dedup state from local disk; the deleted user's rows stayed served."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import s3fs

    from datakit.forget_snapshots import forget
    from tests.test_snapshots import DEDUP, urec
    from tests.stages.test_dedup_stage import words, write_records

    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": s3_endpoint})
    fs.mkdir("forget-bucket")
    t, n = "def shared():\n    return 42\n", words(0, 100)
    days = {"2026-11-01": [urec("a1", t, "gone"), urec("b1", n, "gone"), urec("c1", "x = 1\n", "u2")],
            "2026-11-02": [urec("a2", t, "u3"), urec("d2", "y = 2\n", "gone"), urec("e2", "z = 3\n", "u3")]}
    for day, rows in days.items():
        inp = write_records(tmp_path / "logs" / f"dt={day}", rows)
        (Pipeline("daily").input(inp, format="parquet", schema="training_record.v1").add(dict(DEDUP))
         .output("s3://forget-bucket/ds", mode="append").run(workers=1))
    assert sorted(read_output("s3://forget-bucket/ds", ["doc_id"]).column("doc_id").to_pylist()) == \
        ["a1", "b1", "c1", "d2", "e2"]
    pq.write_table(pa.table({"user_id": ["gone"]}), tmp_path / "deletions.parquet")
    fs.put(str(tmp_path / "deletions.parquet"), "forget-bucket/privacy/deletions.parquet")
    removed = forget("s3://forget-bucket/ds", "s3://forget-bucket/privacy/deletions.parquet", workers=1)
    assert removed == {"dt=2026-11-01": 2, "dt=2026-11-02": 1}
    fs.invalidate_cache()
    assert sorted(read_output("s3://forget-bucket/ds", ["doc_id"]).column("doc_id").to_pylist()) == ["c1", "e2"]


def test_a_packed_output_with_an_index_on_an_object_store_is_refused_before_any_work(tmp_path):
    """Found in review: `format: packed, index: true` to s3:// ran the whole pipeline, published the dataset, then
    exited 2 at the index build (a packed dataset is read from a local folder); a retry did it all again."""
    from datakit.pipeline import PipelineError

    p = (Pipeline("x").input(str(tmp_path / "*.jsonl")).add({"kind": "ingest"}).add({"kind": "extract"})
         .add({"kind": "tokenize", "tokenizer": "datakit:demo-bpe", "seq_len": 256})
         .output("s3://bucket/packed", format="packed", index=True))
    (tmp_path / "a.jsonl").write_text("")
    with pytest.raises(PipelineError, match="output.index: true on a packed dataset needs a local output folder"):
        p.compile()


def test_an_http_input_is_read(tmp_path):
    """Found in review: every http(s):// input ("any fsspec URL") crashed, exit 3: the listing made
    `http://http://host/...` of it (HTTP's filesystem keeps the whole URL as its path)."""
    import functools
    import http.server
    import threading

    served = tmp_path / "served" / "dt=2026-11-01"
    write_jsonl(served / "a.jsonl.zst", [make_event(i) for i in range(9)] + [b"nope"])
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path / "served"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}/dt=2026-11-01"
        for url in (f"{base}/a.jsonl.zst", f"{base}/*.jsonl.zst"):
            out = tmp_path / f"o{len(url)}"
            res = Pipeline("h").input(url).add({"kind": "ingest"}).output(str(out)).run(workers=1)
            assert res.stage("ingest")["rows_in"] == 10 and res.stage("ingest")["rows_out"] == 9
            assert [i["path"] for i in json.loads((out / "manifest.json").read_text())["inputs"]] == [f"{base}/a.jsonl.zst"]
    finally:
        server.shutdown()


def test_read_output_with_the_store_down_raises_a_storage_error(monkeypatch):
    """Found in review: `read_output("s3://...")` with the endpoint down raised botocore's own
    EndpointConnectionError, not the documented `DatakitError`."""
    from datakit import DatakitError
    from datakit.io.storage import StorageError

    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{_free_port()}")  # nothing listens there
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    monkeypatch.setenv("DATAKIT_STORAGE_RETRIES", "1")
    import s3fs.core

    # the retry count is set on the class once per process (storage.install): after an earlier test's S3
    # use it is the default 12, whose backoff took ~59 s here
    monkeypatch.setattr(s3fs.core.S3FileSystem, "retries", 1)
    _forget_s3_clients()
    try:
        with pytest.raises(StorageError, match="storage error: cannot read s3://down-bucket/ds") as e:
            read_output("s3://down-bucket/ds")
        assert isinstance(e.value, DatakitError)
    finally:
        _forget_s3_clients()


def test_folder_markers_are_neither_foreign_files_nor_inputs(s3_endpoint, tmp_path):
    """Found in review: an output folder made by a console's "Create folder" (the zero-byte key `out/`) was refused
    as holding files no datakit run wrote; an input folder's markers were recorded in the manifest as files read."""
    import s3fs

    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": s3_endpoint})
    fs.mkdir("marker-bucket")
    fs.pipe_file("marker-bucket/out/", b"")
    fs.pipe_file("marker-bucket/logs/dt=2026-11-01/", b"")
    fs.put(str(write_jsonl(tmp_path / "a.jsonl", [make_event(i) for i in range(5)])),
           "marker-bucket/logs/dt=2026-11-01/a.jsonl")
    res = (Pipeline("m").input("s3://marker-bucket/logs").add({"kind": "ingest"})
           .output("s3://marker-bucket/out", shards=1).run(workers=1))
    assert res.stage("ingest")["rows_out"] == 5
    fs.invalidate_cache()
    m = json.loads(fs.cat_file("marker-bucket/out/manifest.json"))
    assert [i["path"] for i in m["inputs"]] == ["s3://marker-bucket/logs/dt=2026-11-01/a.jsonl"]


def test_inspect_of_a_records_dataset_on_s3_says_it_is_not_tokenized(s3_endpoint, tmp_path):
    """Found in review: `datakit inspect s3://.../records` said "a packed dataset is read from a local folder";
    the same dataset on local disk gets "format 'parquet' is not a tokenized dataset"."""
    import s3fs

    from datakit.cli.inspect import inspect_dataset

    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": s3_endpoint})
    fs.mkdir("inspect-bucket")
    write_jsonl(tmp_path / "l" / "a.jsonl", [make_event(i) for i in range(3)])
    Pipeline("i").input(str(tmp_path / "l")).add({"kind": "ingest"}).output("s3://inspect-bucket/recs").run(workers=1)
    with pytest.raises(ValueError, match="format 'parquet' is not a tokenized dataset"):
        inspect_dataset("s3://inspect-bucket/recs")


def test_a_presigned_urls_signature_is_recorded_nowhere(tmp_path):
    """Found in review: an input signed for reading (a presigned S3 URL: its X-Amz-Signature and credential
    grant access until it expires) was recorded verbatim in the manifest, in `_run.json`'s pipeline and in
    every quarantined row's `source_file`. Now the secret parameters' values are `...` wherever the URL is
    recorded (io/url_secrets.py), the others (versionId) kept; two signings of one object are recorded alike."""
    import functools
    import http.server
    import threading

    served = tmp_path / "served"
    write_jsonl(served / "a.jsonl.zst", [make_event(i) for i in range(9)] + [b"nope"])
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)  # (it ignores the query, as S3 does not)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    secrets = ("AKIAIOSFODNN7EXAMPLE", "5d672d79c15b13162d9279b0855cfba6789a8edb4c82c400e06b5924a6f2b5d7",
               "AKIAI44QH8DHBEXAMPLE", "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0")
    try:
        obj = f"http://127.0.0.1:{server.server_address[1]}/a.jsonl.zst"
        shown = f"{obj}?versionId=7&X-Amz-Credential=...&X-Amz-Date=20261207T000000Z&X-Amz-Signature=..."
        manifests = []
        for key, sig in (secrets[:2], secrets[2:]):
            url = f"{obj}?versionId=7&X-Amz-Credential={key}%2F20261207%2Fus-east-1%2Fs3%2Faws4_request" \
                  f"&X-Amz-Date=20261207T000000Z&X-Amz-Signature={sig}"
            out = tmp_path / f"out-{sig[:4]}"
            res = Pipeline("h").input(url).add({"kind": "ingest"}).output(str(out)).run(workers=1)
            assert res.stage("ingest")["rows_in"] == 10 and res.stage("ingest")["rows_out"] == 9
            manifest = json.loads((out / "manifest.json").read_text())
            assert [i["path"] for i in manifest["inputs"]] == [shown]
            assert manifest["pipeline"]["input"]["path"] == shown
            assert json.loads((out / "_run.json").read_text())["pipeline"]["input"]["path"] == shown
            assert __import__("pyarrow.parquet").parquet.read_table(out / "_quarantine").column("source_file").to_pylist() == [shown]
            for f in out.rglob("*"):
                if f.is_file():
                    data = f.read_bytes()
                    assert not any(s.encode() in data for s in secrets), f
            manifests.append(manifest)
        assert manifests[0]["inputs"] == manifests[1]["inputs"]
        assert manifests[0]["input_digest"] == manifests[1]["input_digest"]
    finally:
        server.shutdown()


@pytest.mark.parametrize("url,shown", [
    ("https://b.s3.amazonaws.com/k.parquet?X-Amz-Security-Token=IQoJb3JpZ2luX2VjEJr&X-Amz-Expires=60",
     "https://b.s3.amazonaws.com/k.parquet?X-Amz-Security-Token=...&X-Amz-Expires=60"),
    ("https://storage.googleapis.com/b/o?X-Goog-Credential=sa%40p.iam&X-Goog-Signature=0a1b2c",
     "https://storage.googleapis.com/b/o?X-Goog-Credential=...&X-Goog-Signature=..."),
    ("https://acct.blob.core.windows.net/c/f.parquet?sv=2022-11-02&sp=r&sig=Zm9vYmFy%3D",
     "https://acct.blob.core.windows.net/c/f.parquet?sv=2022-11-02&sp=r&sig=..."),
    ("https://d111.cloudfront.net/f?Expires=1&Signature=abc~def&Key-Pair-Id=K2JCJMDEHXQW5F",
     "https://d111.cloudfront.net/f?Expires=1&Signature=...&Key-Pair-Id=..."),
    ("reading https://h/x.jsonl?token=t0k3n#frag failed", "reading https://h/x.jsonl?token=...#frag failed"),
    ("https://h/data?page=2&sort=asc", "https://h/data?page=2&sort=asc"),  # nothing secret: unchanged
])
def test_url_secrets_are_hidden_and_the_rest_kept(url, shown):
    from datakit.io.url_secrets import hide_url_secrets
    from datakit.logs import _redact

    assert hide_url_secrets(url) == shown
    assert _redact(url) == shown  # log and error lines
    from datakit.io.url_secrets import has_hidden_secret

    assert has_hidden_secret(shown) == (shown != url) and not has_hidden_secret(url)  # a record, not a link


@pytest.mark.parametrize("path,name,glob,one_object", [
    ("https://b.s3.amazonaws.com/d.parquet?X-Amz-Signature=ab*c", "https://b.s3.amazonaws.com/d.parquet", False, True),
    ("HTTPS://h/a/d.jsonl.zst?token=t#part", "HTTPS://h/a/d.jsonl.zst", False, True),
    ("https://h/a/d.jsonl#frag", "https://h/a/d.jsonl", False, False),
    ("http://h/logs/*.jsonl", "http://h/logs/*.jsonl", True, False),
    ("https://h/logs/", "https://h/logs/", False, False),
    ("/data/day?.jsonl", "/data/day?.jsonl", True, False),  # a local path or a bucket key: `?` is a pattern
    ("s3://b/day?.jsonl", "s3://b/day?.jsonl", True, False),
])
def test_a_urls_name_pattern_and_object_are_read_before_its_query(path, name, glob, one_object):
    from datakit.io.fs import is_glob, names_one_object, url_path

    assert (url_path(path), is_glob(path), names_one_object(path)) == (name, glob, one_object)
