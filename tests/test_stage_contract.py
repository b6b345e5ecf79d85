"""A batch off its stage's declared schema fails the run (issue #12 item 2): one line naming the stage
and the column, nothing committed -- on both engines."""
from __future__ import annotations

from typing import Literal

import pyarrow as pa
import pytest
from typer.testing import CliRunner

from datakit import CompileContext, Pipeline, StageConfig, register_stage
from datakit.cli import app
from datakit.contracts import EDITOR_EVENT_V1
from datakit.engines.contract import StageOutputError, check_stage_output, conform_output
from tests.eventgen import make_event, write_jsonl


class _Break:
    """Drops or retypes one declared column of editor_event.v1."""

    def __init__(self, how: str) -> None:
        self.how = how

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        if self.how == "lose_event_id":
            return batch.drop_columns(["event_id"])
        if self.how == "number_as_string":
            i = batch.schema.get_field_index("user_id")
            return batch.set_column(i, "user_id", pa.array(range(batch.num_rows), pa.int64()))
        if self.how == "null_event_id":
            i = batch.schema.get_field_index("event_id")
            return batch.set_column(i, "event_id", pa.nulls(batch.num_rows, pa.string()))
        if self.how == "return_none":
            return None
        if self.how == "int_drop_reason":
            return batch.append_column("_drop", pa.array([1] * batch.num_rows))
        if self.how == "empty_drop_reason":  # found in review: '' dropped every row, reason ''
            return batch.append_column("_drop", pa.array([""] * batch.num_rows))
        return batch


@register_stage
class BreakSchema(StageConfig):
    kind: Literal["test_break_schema"] = "test_break_schema"
    how: str = "lose_event_id"
    consumes = "editor_event.v1"
    produces = "editor_event.v1"

    def compile(self, rel, ctx: CompileContext):
        return rel.map_batches(_Break(self.how), EDITOR_EVENT_V1, name="break_schema")


@pytest.fixture
def logs(tmp_path):
    return write_jsonl(tmp_path / "logs" / "a.jsonl", [make_event(i) for i in range(6)])


def _pipe(logs, out, how) -> Pipeline:
    return (Pipeline("contract").input(str(logs)).add({"kind": "ingest"})
            .add({"kind": "test_break_schema", "how": how}).output(str(out)))


@pytest.mark.parametrize("how, needle", [("lose_event_id", "without column 'event_id'"),
                                         ("number_as_string", "column 'user_id' is int64, declared string"),
                                         # found in review: committed with one shard, failed in the sink's key
                                         # hash with two; None: an AttributeError; ints: reasons named "1"
                                         ("null_event_id", "kept 6 row\\(s\\) of a batch with no event_id"),
                                         ("return_none", "returned NoneType, not a pyarrow RecordBatch"),
                                         ("int_drop_reason", "_drop column of int64"),
                                         ("empty_drop_reason", "empty _drop reason")])
def test_local_engine_fails_and_commits_nothing(tmp_path, logs, how, needle):
    out = tmp_path / "out"
    with pytest.raises(StageOutputError, match=f"stage 'test_break_schema' .*{needle}"):
        _pipe(logs, out, how).run(workers=1)
    assert not (out / "manifest.json").exists() and not (out / "_SUCCESS").exists()


def test_cli_says_it_in_one_line_exit_3(tmp_path, logs):
    (tmp_path / "p.yaml").write_text(f"name: c\ninput: {{path: {logs}}}\nstages: [{{kind: ingest}}, "
                                     "{kind: test_break_schema}]\noutput: {path: out}\n")
    r = CliRunner().invoke(app, ["run", str(tmp_path / "p.yaml"), "--workers", "1"])
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("datakit: error")]  # (progress lines aside)
    assert r.exit_code == 3 and len(errors) == 1 and "Traceback" not in r.stderr, r.output
    assert "'event_id'" in errors[0] and "test_break_schema" in errors[0]
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_the_rule():
    schema = pa.schema([("s", pa.string()), ("n", pa.int32()),
                        ("seg", pa.list_(pa.struct([("text", pa.string()), ("train", pa.bool_())])))])
    ok = pa.RecordBatch.from_arrays(
        [pa.array(["a"], pa.large_string()), pa.array([1], pa.int64()),
         pa.array([[{"text": "t", "train": True}]], pa.large_list(pa.struct([("text", pa.large_string()),
                                                                             ("train", pa.bool_())])))],
        names=["s", "n", "seg"])
    assert conform_output(ok, schema, "st", "op").schema == schema  # same kinds: cast
    nulls = pa.RecordBatch.from_arrays([pa.nulls(1), pa.nulls(1), pa.nulls(1)], names=["s", "n", "seg"])
    check_stage_output(nulls, schema, "st", "op")  # an all-null column stands for any type
    lost_child = pa.RecordBatch.from_arrays([pa.array(["a"]), pa.array([1], pa.int32()),
                                             pa.array([[{"text": "t"}]])], names=["s", "n", "seg"])
    with pytest.raises(StageOutputError, match=r"'seg\[\]\.train' of the declared schema is missing"):
        check_stage_output(lost_child, schema, "st", "op")
    overflow = pa.RecordBatch.from_arrays([pa.array(["a"]), pa.array([1 << 40], pa.int64()), pa.nulls(1)],
                                          names=["s", "n", "seg"])
    with pytest.raises(StageOutputError, match="column 'n' cannot be cast"):
        conform_output(overflow, schema, "st", "op")


@pytest.mark.spark
def test_spark_engine_fails_too(spark, tmp_path, logs):
    from datakit.engines.spark_session import SparkJobError

    out = tmp_path / "out"
    with pytest.raises(SparkJobError, match="StageOutputError: stage 'test_break_schema'.*'event_id'"):
        _pipe(logs, out, "lose_event_id").run(engine="spark", partitions=1)
    assert not (out / "manifest.json").exists()


class _Raises:
    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        raise ValueError("boom on jane.doe@example.com")


@register_stage
class RaisesInTheMiddle(StageConfig):
    kind: Literal["test_raises_in_the_middle"] = "test_raises_in_the_middle"
    consumes = "editor_event.v1"
    produces = "editor_event.v1"

    def compile(self, rel, ctx: CompileContext):
        return rel.map_batches(_Raises(), EDITOR_EVENT_V1, name="raises")


def test_a_stage_that_raises_is_named_in_one_redacted_line(tmp_path, logs):
    """Found in review: the local engine named no stage, Spark the last stage of the fused chain; the
    CLI printed the stage's exception (which may quote data) as a traceback, exit 1."""
    from datakit.engines.core import StageError

    with pytest.raises(StageError, match=r"stage 'test_raises_in_the_middle' \(raises\) failed: ValueError: boom on "
                                         r".*\(at test_stage_contract.py:\d+ in __call__\)"):
        (Pipeline("r").input(str(logs)).add({"kind": "ingest"}).add({"kind": "test_raises_in_the_middle"})
         .add({"kind": "consent"}).output(str(tmp_path / "out"))).run(workers=1)
    (tmp_path / "p.yaml").write_text(f"name: c\ninput: {{path: {logs}}}\nstages: [{{kind: ingest}}, "
                                     "{kind: test_raises_in_the_middle}, {kind: consent}]\noutput: {path: out}\n")
    r = CliRunner().invoke(app, ["run", str(tmp_path / "p.yaml"), "--workers", "1"])
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("datakit: error")]
    assert r.exit_code == 3 and len(errors) == 1 and "Traceback" not in r.stderr, r.output
    assert "test_raises_in_the_middle" in errors[0] and "jane.doe@example.com" not in r.stderr


@pytest.mark.spark
def test_spark_names_the_stage_that_raised_not_the_chains_last(spark, tmp_path, logs):
    from datakit.engines.spark_session import SparkJobError

    p = (Pipeline("r").input(str(logs)).add({"kind": "ingest"}).add({"kind": "test_raises_in_the_middle"})
         .add({"kind": "consent"}).output(str(tmp_path / "out")))
    with pytest.raises(SparkJobError, match=r"^Spark failed: stage 'test_raises_in_the_middle' \(raises\) failed: "
                                            r"ValueError"):
        p.run(engine="spark", partitions=1)
    # the log the error points to is redacted too (found in review: Spark's task-failure lines in it
    # quoted the exception, 4 copies of an email that stderr showed as <EMAIL>)
    from datakit.engines.spark_session import log_file

    text = log_file().read_text(errors="replace")
    assert "boom on" in text and "jane.doe@example.com" not in text


class _UserFault:
    """Faults a researcher's own stage makes (found in review): a missing vocab file read in the batch
    function or in setup(), a ValueError in setup(), rows filtered away without a `_drop` reason."""

    def __init__(self, mode: str) -> None:
        self.mode = mode

    def setup(self) -> None:
        if self.mode == "setup_oserror":
            open("/nonexistent/datakit-test/model.bin", "rb")
        if self.mode == "setup_value":
            raise ValueError("bad threshold in setup")

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        if self.mode == "oserror":
            open("/nonexistent/datakit-test/vocab.txt")
        return batch.slice(0, batch.num_rows // 2) if self.mode == "filter" else batch


@register_stage
class UserFault(StageConfig):
    kind: Literal["test_user_fault"] = "test_user_fault"
    consumes = "editor_event.v1"
    produces = "editor_event.v1"
    mode: str

    def compile(self, rel, ctx: CompileContext):
        return rel.map_batches(_UserFault(self.mode), EDITOR_EVENT_V1, name="faulty")


@pytest.mark.parametrize("mode,message", [
    ("oserror", r"stage 'test_user_fault' \(faulty\) failed: FileNotFoundError: .*vocab.txt.* \(at test_stage_contract"),
    ("setup_oserror", r"stage 'test_user_fault' \(faulty\): its setup\(\) failed: FileNotFoundError: .*model.bin"),
    ("setup_value", r"stage 'test_user_fault' \(faulty\): its setup\(\) failed: ValueError: bad threshold in setup "
                    r"\(at test_stage_contract.py:\d+ in setup\)"),
    ("filter", r"stage 'test_user_fault': rows_in \d+ != rows_out \d+ \+ dropped 0; nothing was committed .*_drop"),
])
def test_a_user_stages_own_faults_are_one_line_naming_the_stage(tmp_path, logs, mode, message):
    """Before: the OSErrors were a bare FileNotFoundError (or a storage error blaming a work file), the
    setup() ValueError bare, and from the command each was a traceback with exit 1 ("a check failed")."""
    import re

    (tmp_path / "p.yaml").write_text(f"name: c\ninput: {{path: {logs}}}\nstages: [{{kind: ingest}}, "
                                     f"{{kind: test_user_fault, mode: {mode}}}]\noutput: {{path: out}}\n")
    r = CliRunner().invoke(app, ["run", str(tmp_path / "p.yaml"), "--workers", "1"])
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("datakit: error")]
    assert r.exit_code == 3 and len(errors) == 1 and "Traceback" not in r.stderr, r.output
    assert re.search(message, errors[0]), errors[0]
    work = tmp_path / "out" / "_work"  # kept for the resume; its spills before scrub_pii hold raw text
    if work.exists():
        import stat

        assert stat.S_IMODE(work.stat().st_mode) == 0o700
        assert all(stat.S_IMODE(d.stat().st_mode) == 0o700 for d in work.iterdir() if d.is_dir())


class _HoldsALock:
    def __init__(self) -> None:
        import threading

        self.lock = threading.Lock()

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        return batch


@register_stage
class HoldsALock(StageConfig):
    kind: Literal["test_holds_a_lock"] = "test_holds_a_lock"
    consumes = "editor_event.v1"
    produces = "editor_event.v1"

    def compile(self, rel, ctx: CompileContext):
        return rel.map_batches(_HoldsALock(), EDITOR_EVENT_V1, name="locked")


def test_a_batch_function_that_cannot_be_pickled_fails_at_compile_naming_the_stage(tmp_path, logs):
    """Found in review: it ran on a sample (in-process) and failed on the full input (pool workers, Spark)
    with a bare TypeError naming no stage."""
    from datakit.pipeline import PipelineError

    p = (Pipeline("r").input(str(logs)).add({"kind": "ingest"}).add({"kind": "test_holds_a_lock"})
         .output(str(tmp_path / "out")))
    with pytest.raises(PipelineError, match=r"stage 'test_holds_a_lock' \(locked\): its batch function cannot be "
                                            r"pickled \(TypeError: cannot pickle '_thread.lock' object\).*setup\(\)"):
        p.compile()


SECRET_EMAIL, SECRET_TOKEN = "jane.doe@example.com", "ghp_" + "abcdefghijklmnopqrstuvwxyz0123456789"


class _LeaksInItsError:
    """Raises with personal data in the message, in `__call__` or in `setup()`."""

    def __init__(self, where: str) -> None:
        self.where = where

    def setup(self) -> None:
        if self.where == "setup":
            raise ValueError(f"bad config from {SECRET_EMAIL} key {SECRET_TOKEN}")

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        try:
            {}["k"]
        except KeyError:  # a chain of the stage's own: each link keeps its frames, none its text
            raise ValueError(f"bad record from {SECRET_EMAIL} key {SECRET_TOKEN}")


@register_stage
class LeaksInItsError(StageConfig):
    kind: Literal["test_leaks_in_its_error"] = "test_leaks_in_its_error"
    consumes = "editor_event.v1"
    produces = "editor_event.v1"
    where: str = "call"

    def compile(self, rel, ctx: CompileContext):
        return rel.map_batches(_LeaksInItsError(self.where), EDITOR_EVENT_V1, name="leaks")


def _chain(e: BaseException | None) -> list[BaseException]:
    seen: list[BaseException] = []
    while e is not None and e not in seen:
        seen.append(e)
        e = e.__cause__ or e.__context__
    return seen


@pytest.mark.parametrize("where,workers", [("call", 1), ("call", 2), ("setup", 1), ("setup", 2)])
def test_a_stage_errors_traceback_keeps_its_frames_not_its_text(tmp_path, where, workers):
    """Found in a Python API review: the StageError's line was redacted, but `from e` chained the raw
    exception, so the default traceback printed the e-mail and token (with a pool, inside the worker's
    `_RemoteTraceback` text). The chain now holds the stage's frames with redacted text only."""
    import traceback

    from datakit.engines.core import StageError

    for day in range(2):  # two files: two tasks, so workers=2 runs them in the pool
        write_jsonl(tmp_path / "logs" / f"{day}.jsonl", [make_event(day * 10 + i) for i in range(6)])
    p = (Pipeline("r").input(str(tmp_path / "logs" / "*.jsonl")).add({"kind": "ingest"})
         .add({"kind": "test_leaks_in_its_error", "where": where}).output(str(tmp_path / "out")))
    with pytest.raises(StageError) as ei:
        p.run(workers=workers)
    text = "".join(traceback.format_exception(ei.value))
    assert SECRET_EMAIL not in text and SECRET_TOKEN not in text, text
    for e in _chain(ei.value):  # nothing reachable from the error holds the text either
        assert SECRET_EMAIL not in str(e) and SECRET_TOKEN not in str(e), repr(e)
    assert "<EMAIL>" in text and "<GITHUB_TOKEN>" in text
    assert "test_stage_contract.py" in text and f"in {'setup' if where == 'setup' else '__call__'}" in text, text
    if where == "call":
        assert "KeyError" in text  # the stage's own chain, its frames kept
    assert ("_RemoteTraceback" in text) == (workers == 2), text  # the pool path was the one tested


@pytest.mark.parametrize("workers", [1, 2])
def test_a_scripts_uncaught_stage_error_prints_no_personal_data(tmp_path, workers):
    """The review's repro: a script whose custom stage raises; Python prints the uncaught traceback."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    for day in range(2):
        write_jsonl(tmp_path / "logs" / f"{day}.jsonl", [make_event(day * 10 + i) for i in range(6)])
    (tmp_path / "boom.py").write_text(f'''
from typing import Literal
from datakit import Pipeline, StageConfig, register_stage
from datakit.contracts import EDITOR_EVENT_V1
class Fn:
    def __call__(self, b): raise ValueError(open("record.txt").read())
@register_stage
class Boom(StageConfig):
    kind: Literal["boom"] = "boom"
    consumes = "editor_event.v1"
    produces = "editor_event.v1"
    def compile(self, rel, ctx): return rel.map_batches(Fn(), EDITOR_EVENT_V1, name="boom")
if __name__ == "__main__":
    (Pipeline("p").input("logs/*.jsonl").add({{"kind": "ingest"}}).add(Boom()).output("o_pii").run(workers={workers}))
''')
    # (the message comes from data, as a real one does: Python prints a frame's source line, and a
    # literal there is the script's own text, not the exception's)
    (tmp_path / "record.txt").write_text(f"bad record from {SECRET_EMAIL} key {SECRET_TOKEN}")
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "boom.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 1 and "StageError" in r.stderr, r.stderr
    assert SECRET_EMAIL not in r.stderr and SECRET_TOKEN not in r.stderr, r.stderr
    assert 'boom.py", line 6, in __call__' in r.stderr, r.stderr  # the stage's own frame
    assert "RedactedError: ValueError: bad record from <EMAIL> key <GITHUB_TOKEN>" in r.stderr, r.stderr


def test_a_pool_workers_traceback_text_is_redacted():
    """Any task error's `_RemoteTraceback` (the worker's formatted chain) is redacted, not only a StageError's."""
    from concurrent.futures.process import _RemoteTraceback

    from datakit.watchdog import _redact_remote_traceback

    e = RuntimeError("x")
    e.__cause__ = _RemoteTraceback(f'Traceback:\n  File "t.py", line 1, in f\nKeyError: {SECRET_EMAIL}\n')
    _redact_remote_traceback(e)
    assert SECRET_EMAIL not in str(e.__cause__) and 'File "t.py", line 1, in f' in str(e.__cause__)
