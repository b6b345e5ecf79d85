"""Every option is checked when the pipeline loads or the engine is built (issue #12 item 3):
one line, exit 2, before any work, and no output or work folder left behind."""
from __future__ import annotations

import pytest
from typer.testing import CliRunner

from datakit import Pipeline, PipelineError
from datakit.cli import app
from tests.eventgen import make_event, write_jsonl


@pytest.fixture
def logs(tmp_path):
    return write_jsonl(tmp_path / "logs" / "a.jsonl", [make_event(i) for i in range(5)])


def _yaml(tmp_path, output: str) -> str:
    f = tmp_path / "p.yaml"
    f.write_text(f"name: v\ninput: {{path: logs/*.jsonl}}\nstages: [{{kind: ingest}}]\noutput: {output}\n")
    return str(f)


def _one_line_exit_2(result, *needles: str) -> None:
    assert result.exit_code == 2, result.output
    err = result.stderr.strip()  # nothing ran, so nothing else was logged: exactly one line
    assert err.startswith("datakit: error:") and "\n" not in err and "Traceback" not in err, err
    for n in needles:
        assert n in err, err


@pytest.mark.parametrize("output, needle", [
    ("{path: out, format: parqet}", "unknown output format 'parqet'"),
    ("{path: out, shards: 0}", "shards must be a positive number"),
    ("{path: out, shards: -3}", "shards must be a positive number"),
    ("{path: out, shard: 2}", "shard"),
    ("{path: out, key: nope}", "key 'nope' is not a column"),
    ("{path: out, quality: no_such_suite}", "no quality suite"),
])
def test_bad_output_options_fail_at_load(tmp_path, logs, output, needle):
    f = _yaml(tmp_path, output)
    for cmd in (["run", f, "--workers", "1"], ["explain", f]):
        _one_line_exit_2(CliRunner().invoke(app, cmd), needle)
    assert not (tmp_path / "out").exists()  # nothing ran: no output, no work folder


@pytest.mark.parametrize("workers", ["0", "-2"])
def test_bad_worker_counts_fail_before_any_work(tmp_path, logs, workers):
    r = CliRunner().invoke(app, ["run", _yaml(tmp_path, "{path: out}"), "--workers", workers])
    _one_line_exit_2(r, "workers must be a positive number")
    assert not (tmp_path / "out").exists()


def test_bad_engine_options_in_python(tmp_path, logs):
    p = Pipeline("v").input(str(logs)).add({"kind": "ingest"}).output(str(tmp_path / "out"))
    with pytest.raises(PipelineError, match="workers must be a positive number"):
        p.run(workers=0)
    with pytest.raises(PipelineError, match="partitions must be a positive number"):
        p.run(engine="spark", partitions=0)
    with pytest.raises(PipelineError, match="shards must be"):
        Pipeline.from_dict({"input": {"path": str(logs)}, "stages": [{"kind": "ingest"}],
                            "output": {"path": "o", "shards": 0}})
    assert not (tmp_path / "out").exists()


def test_options_of_the_wrong_type_in_python(tmp_path, logs):
    """Found in a Python API review: `run(workers=1, keep_work="no", progress="sure")` ran (and "no", being
    truthy, kept the unscrubbed spill under the output's _work/), `run(output=123)`/`run(input=123)` were
    `TypeError: 'int' object is not iterable`, `Pipeline("x", base_dir=123)` a TypeError and
    `Pipeline.from_yaml_string(None)` an AttributeError. Each is one PipelineError before any work."""
    p = Pipeline("v").input(str(logs)).add({"kind": "ingest"}).output(str(tmp_path / "out"))
    for options, needle in (({"keep_work": "no"}, "v: engine option keep_work must be True or False, not str"),
                            ({"progress": "sure"}, "engine option progress must be True or False or None, not str"),
                            ({"work_dir": 123}, "engine option work_dir must be a folder path"),
                            ({"output": 123}, "output must be a path (str or os.PathLike), not int"),
                            ({"output": [str(tmp_path / "o")]}, "output must be a path (str or os.PathLike), not list"),
                            ({"input": 123}, "input must be a path (str or os.PathLike) or a non-empty list of them, "
                                             "not int"),
                            ({"input": [str(logs), 7]}, "not list holding 7 (int)")):
        with pytest.raises(PipelineError) as e:
            p.run(workers=1, **options)
        assert needle in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(PipelineError, match="output_override must be a path"):
        p.compile(output_override=5)
    assert not (tmp_path / "out").exists() and not (tmp_path / "o").exists()
    with pytest.raises(PipelineError, match=r"base_dir must be a folder path \(str or os.PathLike\), not int"):
        Pipeline("x", base_dir=123)
    with pytest.raises(PipelineError, match="from_yaml_string takes the YAML text \\(a str\\), not NoneType"):
        Pipeline.from_yaml_string(None)
    with pytest.raises(PipelineError, match=r"use Pipeline.from_yaml\(path\)"):
        Pipeline.from_yaml_string(tmp_path / "p.yaml")
    # what was accepted still is: a Path, a tuple of paths, bytes of YAML
    assert Pipeline("x", base_dir=tmp_path).base_dir == tmp_path
    assert Pipeline.from_yaml_string(b"name: y\n").config.name == "y"
    assert p.compile(input_override=(logs,), output_override=tmp_path / "o2").sink.path == str(tmp_path / "o2")
