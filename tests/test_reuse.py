"""Reuse of earlier work is keyed on everything that determines the bytes (issue #12 item 1).

Each test reruns into a finished folder: when nothing that matters changed the shards are reused
(proved by the run's counter and unchanged file mtimes); when anything changed the output is the
same as a fresh run of the new config, byte for byte, and nothing was reused.
"""
from __future__ import annotations

import json
import os

import pyarrow.parquet as pq
import pytest

from datakit import Pipeline
from datakit.io import identity
from datakit.io.sinks import output_checksums
from tests.stages.test_tokenize import TOKENIZER, code_records, sft_record, table

BASE = {"tokenizer": TOKENIZER, "seq_len": 64, "packing": "concat"}


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    rows = code_records(24, max_chars=700)
    rows += [sft_record(f"s{i:03d}", [("user", f"question {i}?"), ("assistant", f"answer {i}\n" * (i % 4 + 1))])
             for i in range(8)]
    path = tmp_path_factory.mktemp("in") / "records.parquet"
    pq.write_table(table(rows), path)
    return str(path)


def _pipe(records: str, out, tok=None, shards=2, seed=0, fmt="packed") -> Pipeline:
    return (Pipeline("reuse", seed=seed).input(records, format="parquet", schema="training_record.v1")
            .add({"kind": "tokenize", **BASE, **(tok or {})})
            .output(str(out), format=fmt, shards=shards, allow_unmasked=fmt == "megatron"))


def _mtimes(folder) -> dict[str, int]:
    m = json.loads((folder / "manifest.json").read_text())
    return {f: (folder / f).stat().st_mtime_ns for s in m["shards"] for f in s["files"]}


def test_unchanged_rerun_reuses_every_shard(tmp_path, records):
    out = tmp_path / "o"
    first = _pipe(records, out).run(workers=1)
    before, mtimes = output_checksums(str(out)), _mtimes(out)
    again = _pipe(records, out).run(workers=1)
    assert first.extra["reused_shards"] == 0
    assert again.extra["reused_shards"] == 2  # reused...
    assert _mtimes(out) == mtimes  # ...not rewritten
    assert output_checksums(str(out)) == before


@pytest.mark.parametrize("change", [
    pytest.param({"tok": {"packing": "best_fit"}}, id="packing"),
    pytest.param({"tok": {"seq_len": 128}}, id="seq_len"),
    pytest.param({"shards": 3}, id="shards"),
    pytest.param({"tok": {"special_tokens": {"eos": "<|user|>"}}}, id="tokenizer"),
    pytest.param({"tok": {"fim_rate": 0.5}}, id="stage_option"),
    pytest.param({"seed": 7}, id="seed"),
    pytest.param({"fmt": "megatron"}, id="format"),
])
def test_changed_setting_rewrites_and_output_follows(tmp_path, records, change):
    out = tmp_path / "o"
    _pipe(records, out).run(workers=1)
    old = output_checksums(str(out))
    rerun = _pipe(records, out, **change).run(workers=1)
    fresh_dir = tmp_path / "fresh"
    _pipe(records, fresh_dir, **change).run(workers=1)
    assert rerun.extra["reused_shards"] == 0
    assert output_checksums(str(out)) == output_checksums(str(fresh_dir))  # the bytes follow the config
    assert output_checksums(str(out)) != old
    m = json.loads((out / "manifest.json").read_text())
    for k, v in (change.get("tok") or {}).items():
        if k in ("packing", "seq_len"):
            assert m[k] == v  # and the manifest tells the truth about them


def test_changed_library_version_refuses_reuse(tmp_path, records, monkeypatch):
    """A library that shapes bytes (here: pyarrow writes its version into every Parquet footer) is part
    of the config hash; a run under another version reuses nothing from one under this version."""
    out = tmp_path / "o"
    a = _pipe(records, out, fmt="parquet")
    first = a.run(workers=1)
    real = identity.library_version
    monkeypatch.setattr(identity, "library_version", lambda n: "0.0-other" if n == "pyarrow" else real(n))
    b = _pipe(records, out, fmt="parquet")
    assert b.compile().config_hash != first.manifest["pipeline_hash"]
    assert b.run(workers=1).extra["reused_shards"] == 0
    m = json.loads((out / "manifest.json").read_text())
    assert m["environment"]["libraries"]["pyarrow"] == "0.0-other"


def test_manifest_records_environment_and_input_files(tmp_path, records):
    res = _pipe(records, tmp_path / "o").run(workers=1)
    m = res.manifest
    assert m["inputs"] == [{"path": records, "size": os.path.getsize(records),
                            "mtime": m["inputs"][0]["mtime"]}]
    env = m["environment"]
    assert env["datakit"] and env["libraries"]["pyarrow"]
    tok = env["stages"]["tokenize"]
    assert tok["tokenizers"] == identity.library_version("tokenizers") and len(tok["tokenizer_sha256"]) == 64


def test_resume_after_a_crash_is_refused_when_a_stage_option_changed(tmp_path, monkeypatch):
    """The other direction of test_local_engine's resume test: finished tasks of a crashed run are
    not reused by a rerun whose config differs (here an ingest option), and its output follows."""
    import tests.test_local_engine as tle

    logs = tle._logs(tmp_path)

    def pipe(out, raw: str):
        return (Pipeline("t").input(str(logs)).add({"kind": "ingest", "drop_duplicate_events": False,
                                                    "quarantine": {"raw": raw}})
                .add({"kind": "test_fail_on"}).output(str(out), shards=2))
    monkeypatch.setenv("DATAKIT_TEST_FAIL", "1")
    with pytest.raises(RuntimeError, match="simulated crash"):
        pipe(tmp_path / "o", "scrubbed").run(workers=1)
    monkeypatch.delenv("DATAKIT_TEST_FAIL")
    changed = pipe(tmp_path / "o", "hash").run(workers=1)
    assert changed.extra["reused_tasks"] == 0
    pipe(tmp_path / "fresh", "hash").run(workers=1)
    assert output_checksums(str(tmp_path / "o")) == output_checksums(str(tmp_path / "fresh"))
    quarantine = "_quarantine/part-00000.parquet"
    assert (tmp_path / "o" / quarantine).read_bytes() == (tmp_path / "fresh" / quarantine).read_bytes()
