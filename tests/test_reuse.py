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


def test_changed_datakit_code_refuses_reuse(tmp_path, records, monkeypatch):
    """datakit's own files are part of the config hash: its version string stayed 0.1.0 for hundreds of
    commits, so a run under one checkout reused the shards and tasks of the code before it."""
    out = tmp_path / "o"
    first = _pipe(records, out, fmt="parquet").run(workers=1)
    assert first.manifest["environment"]["code"]["datakit"] == identity.package_digest()
    monkeypatch.setattr(identity, "package_digest", lambda: "0" * 64)
    b = _pipe(records, out, fmt="parquet")
    assert b.compile().config_hash != first.manifest["pipeline_hash"]
    assert b.run(workers=1).extra["reused_shards"] == 0


_EDITABLE_STAGE = '''
import os
from typing import Literal

import pyarrow as pa
import pyarrow.compute as pc

from datakit import StageConfig
from datakit.contracts import EDITOR_EVENT_V1
from datakit.plan import DROP

LIMIT = {limit}


class _Short:
    def __call__(self, batch):
        if os.environ.get("DATAKIT_TEST_FAIL") and any(f.endswith("part-2.jsonl")
                                                         for f in batch.column("_source_file").to_pylist()):
            raise RuntimeError("simulated crash")
        keep = pc.less_equal(pc.utf8_length(batch.column("event_id")), LIMIT)
        return batch.append_column(DROP, pc.if_else(keep, pa.scalar(None, pa.string()),
                                                    pa.scalar("too_long", pa.string())))


class Short(StageConfig):
    kind: Literal["short"] = "short"
    consumes = produces = "editor_event.v1"

    def compile(self, rel, ctx):
        return rel.map_batches(_Short(), EDITOR_EVENT_V1, name="short")
'''


def _stage_module(tmp_path, monkeypatch, name: str, limit: int):
    """A custom stage module `name` (kind `name:Short`) beside four plain JSON Lines input files;
    its function fails on the third file while DATAKIT_TEST_FAIL is set: a run killed part-way."""
    import sys

    from tests.eventgen import make_event, write_jsonl

    for f in range(4):
        write_jsonl(tmp_path / "logs" / f"part-{f}.jsonl", [make_event(f * 1000 + i) for i in range(50)])
    site = tmp_path / "site"
    site.mkdir()
    module = site / f"{name}.py"
    module.write_text(_EDITABLE_STAGE.format(limit=limit))
    monkeypatch.syspath_prepend(str(site))
    sys.modules.pop(name, None)

    def pipe(out):
        return (Pipeline("t").input(str(tmp_path / "logs")).add({"kind": "ingest", "drop_duplicate_events": False})
                .add({"kind": f"{name}:Short"}).output(str(out), shards=2))
    return module, pipe


def _crash_then_rerun(tmp_path, monkeypatch, pipe, change) -> tuple[dict, dict, dict]:
    """Crash a run after some of its tasks finished, `change()` something, rerun into the same folder;
    return the rerun's extra and {file: sha256} of the rerun and of a fresh run of the changed setup."""
    monkeypatch.setenv("DATAKIT_TEST_FAIL", "1")
    with pytest.raises(Exception, match="simulated crash"):
        pipe(tmp_path / "o").run(workers=1)
    monkeypatch.delenv("DATAKIT_TEST_FAIL")
    change()
    rerun = pipe(tmp_path / "o").run(workers=1)
    pipe(tmp_path / "fresh").run(workers=1)
    return rerun.extra, output_checksums(str(tmp_path / "o")), output_checksums(str(tmp_path / "fresh"))


def test_resume_is_refused_after_a_custom_stage_module_was_edited(tmp_path, monkeypatch):
    """A custom stage's source file is part of the run's identity (found in review: a killed run
    resumed 33 tasks computed by the stage's code before an edit of it)."""
    module, pipe = _stage_module(tmp_path, monkeypatch, "dk_editable_stage", 40)
    before = pipe(tmp_path / "x").compile().environment["code"]["modules"]
    assert list(before) == ["dk_editable_stage"]

    def edit():  # what a user does between the killed run and the rerun (which a new process would import)
        module.write_text(_EDITABLE_STAGE.format(limit=4))

    extra, rerun, fresh = _crash_then_rerun(tmp_path, monkeypatch, pipe, edit)
    assert pipe(tmp_path / "x").compile().environment["code"]["modules"] != before
    assert extra["reused_tasks"] == 0
    assert rerun == fresh


def test_resume_is_refused_after_an_input_was_edited_to_the_same_size_and_mtime(tmp_path, monkeypatch):
    """Size and mtime do not prove a file unchanged (an editor or `touch -r` can put both back): the
    run id also holds the file's status-change time, so the rerun reads the new bytes (found in
    review: the rerun kept 13 lines of the file as they were before the edit)."""
    _, pipe = _stage_module(tmp_path, monkeypatch, "dk_crashing_stage", 40)

    def edit():  # part-0 finished before the crash; the same number of bytes, one event id changed
        target = tmp_path / "logs" / "part-0.jsonl"
        st = os.stat(target)
        text = target.read_bytes()
        assert b'"event_id": "ev-000007"' in text
        target.write_bytes(text.replace(b'"event_id": "ev-000007"', b'"event_id": "ev-00000X"'))
        os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
        after = os.stat(target)
        assert (after.st_size, after.st_mtime_ns) == (st.st_size, st.st_mtime_ns)

    extra, rerun, fresh = _crash_then_rerun(tmp_path, monkeypatch, pipe, edit)
    assert extra["reused_tasks"] == 0
    assert rerun == fresh


def test_resume_is_refused_after_a_module_the_custom_stage_imports_was_edited(tmp_path, monkeypatch):
    """Found in review: only the module defining a stage was digested, so after a killed run and an edit
    of a `helper.py` beside it (imported by the stage), the rerun reused the finished tasks and committed
    one dataset made by both versions of the helper."""
    import sys

    module, pipe = _stage_module(tmp_path, monkeypatch, "dk_stage_with_helper", 40)
    helper = module.parent / "dk_limits_helper.py"
    helper.write_text("LIMIT = 40\n")
    sys.modules.pop("dk_limits_helper", None)
    module.write_text(module.read_text().replace("LIMIT = 40", "from dk_limits_helper import LIMIT"))
    before = pipe(tmp_path / "x").compile().environment["code"]["modules"]
    assert list(before) == ["dk_limits_helper", "dk_stage_with_helper"]
    # installed code (pyarrow, datakit) and modules outside the stage's folder are not digested
    assert not any(m.startswith(("pyarrow", "datakit", "tests")) for m in before)

    def edit():
        helper.write_text("LIMIT = 4\n")

    extra, rerun, fresh = _crash_then_rerun(tmp_path, monkeypatch, pipe, edit)
    after = pipe(tmp_path / "x").compile().environment["code"]["modules"]
    assert after["dk_limits_helper"] != before["dk_limits_helper"]
    assert after["dk_stage_with_helper"] == before["dk_stage_with_helper"]
    assert extra["reused_tasks"] == 0
    assert rerun == fresh
