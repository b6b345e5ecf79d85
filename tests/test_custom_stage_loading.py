"""Custom stages load from a pipeline file by module path or entry point (issue #13 item 5), with
one-line errors for a bad path; a saved pipeline names the path again so it loads in a new process."""
from __future__ import annotations

import textwrap

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from datakit import Pipeline
from datakit.cli import app
from datakit.pipeline import PipelineError
from tests.eventgen import make_event, write_jsonl

_MODULE = '''
from typing import Literal

import pyarrow as pa

from datakit import StageConfig
from datakit.contracts import TRAINING_RECORD_V1


class _Upper:
    def __call__(self, batch):
        segs = [[dict(s, text=(s["text"] or "").upper()) for s in row] for row in batch.column("segments").to_pylist()]
        return batch.set_column(batch.schema.get_field_index("segments"), "segments",
                                pa.array(segs, batch.schema.field("segments").type))


class {cls}(StageConfig):  # not registered: found by its module path
    kind: Literal["{kind}"] = "{kind}"

    def compile(self, rel, ctx):
        return rel.map_batches(_Upper(), TRAINING_RECORD_V1, name="{kind}")


NOT_A_STAGE = 3
'''


@pytest.fixture
def mystages(tmp_path, monkeypatch):
    """A package `dk_user_stages_<test>` on sys.path (a fresh name per test: imports are cached)."""
    name = f"dk_user_stages_{abs(hash(str(tmp_path))) % 10**8}"
    pkg = tmp_path / "site" / name
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "stages.py").write_text(_MODULE.replace("{cls}", "UpperCase").replace("{kind}", f"{name}_upper"))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    return name


def _yaml(tmp_path, kind: str) -> str:
    logs = write_jsonl(tmp_path / "logs" / "a.jsonl", [make_event(i) for i in range(4)])
    return textwrap.dedent(f"""\
        name: custom
        input: {{path: {logs}}}
        stages: [{{kind: ingest}}, {{kind: extract, kinds: [code]}}, {{kind: "{kind}"}}]
        output: {{path: {tmp_path / 'out'}}}
        """)


def test_module_path_kind_runs_and_saves_as_its_path(tmp_path, mystages):
    p = Pipeline.from_yaml_string(_yaml(tmp_path, f"{mystages}.stages:UpperCase"))
    assert p.config.stages[2].kind == f"{mystages}_upper"
    assert f"kind: {mystages}.stages:UpperCase" in p.to_yaml()  # reloads in a process that never imported it
    assert Pipeline.from_yaml_string(p.to_yaml()) == p
    result = p.run(workers=1)
    assert result.stage(f"{mystages}_upper")["rows_out"] > 0
    texts = [s["text"] for row in pq.read_table(tmp_path / "out" / "data").column("segments").to_pylist() for s in row]
    assert texts and all(t == t.upper() for t in texts)


def test_entry_point_kind(tmp_path, mystages):
    dist = tmp_path / "site" / f"{mystages}-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {mystages}\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[datakit.stages]\n{mystages}_upper = {mystages}.stages:UpperCase\n"
                                          f"{mystages}_misnamed = {mystages}.stages:UpperCase\n")
    p = Pipeline.from_yaml_string(_yaml(tmp_path, f"{mystages}_upper"))
    assert type(p.config.stages[2]).__name__ == "UpperCase"
    assert f"kind: {mystages}_upper\n" in p.to_yaml()  # the entry point's name is enough to load it again
    with pytest.raises(PipelineError, match=f"entry point .* is a stage of kind '{mystages}_upper'"):
        Pipeline.from_yaml_string(_yaml(tmp_path, f"{mystages}_misnamed"))


@pytest.mark.parametrize("suffix, needle", [
    ("nope:UpperCase", "cannot import module '{m}.nope' (ModuleNotFoundError"),
    ("stages:Missing", "module '{m}.stages' has no 'Missing'"),
    ("stages:NOT_A_STAGE", "'NOT_A_STAGE' is not a StageConfig subclass"),
    ("stages:", "expected package.module:ClassName"),
])
def test_bad_module_path_is_one_line(tmp_path, mystages, suffix, needle):
    kind = f"{mystages}.{suffix}"
    with pytest.raises(PipelineError) as e:
        Pipeline.from_yaml_string(_yaml(tmp_path, kind))
    msg = str(e.value)
    assert "\n" not in msg and f"stage 3: stage kind '{kind}'" in msg and needle.format(m=mystages) in msg


def test_cli_bad_path_exit_2(tmp_path, mystages):
    (tmp_path / "p.yaml").write_text(_yaml(tmp_path, "no_such_pkg_xyz.mod:Stage"))
    r = CliRunner().invoke(app, ["run", str(tmp_path / "p.yaml"), "--workers", "1"])
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert "cannot import module 'no_such_pkg_xyz.mod'" in r.output


def test_the_example_pipeline_file_runs(tmp_path, monkeypatch):
    """examples/custom_stage.yaml names examples/custom_stage.py's stage by module path."""
    from pathlib import Path

    examples = Path(__file__).resolve().parents[1] / "examples"
    monkeypatch.syspath_prepend(str(examples))
    logs = write_jsonl(tmp_path / "logs" / "a.jsonl", [make_event(i) for i in range(8)])
    p = Pipeline.from_yaml(examples / "custom_stage.yaml")
    result = p.run(workers=1, input=str(logs), output=str(tmp_path / "out"))
    assert result.stage("drop_long")["rows_in"] == result.stage("extract")["emitted"] > 0


def test_a_stage_added_as_a_class_saves_its_path_and_the_hash_does_not_depend_on_history(tmp_path, mystages):
    """Found in review: a stage added with `.add(Class())` was saved as its bare kind, which a fresh
    process cannot load, and the same Pipeline's hash changed once another pipeline in the process
    had named the stage by path (so its shards were not reused)."""
    import importlib
    import subprocess
    import sys

    from datakit import register_stage

    cls = register_stage(importlib.import_module(f"{mystages}.stages").UpperCase)
    p = Pipeline.from_yaml_string(_yaml(tmp_path, "ingest"))  # (stage 3 replaced by the class below)
    p.config.stages[2] = cls()
    before = p.compile().config_hash
    Pipeline.from_yaml_string(_yaml(tmp_path, f"{mystages}.stages:UpperCase"))  # another pipeline names it by path
    assert p.compile().config_hash == before
    text = p.to_yaml()
    assert f"kind: {mystages}.stages:UpperCase" in text
    (tmp_path / "saved.yaml").write_text(text)
    code = f"from datakit import Pipeline; print(type(Pipeline.from_yaml({str(tmp_path / 'saved.yaml')!r}).config.stages[2]).__name__)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**__import__("os").environ, "PYTHONPATH": str(tmp_path / "site")})
    assert r.stdout.strip() == "UpperCase", r.stderr[-2000:]


def test_a_custom_stage_may_not_take_a_built_in_kind_or_another_stages_kind(mystages):
    from typing import Literal

    from datakit import StageConfig, register_stage

    with pytest.raises(TypeError, match="kind 'dedup' is a built-in stage"):
        @register_stage
        class MyDedup(StageConfig):  # noqa: F811
            kind: Literal["dedup"] = "dedup"

    @register_stage
    class First(StageConfig):
        kind: Literal["test_kind_once"] = "test_kind_once"

    register_stage(First)  # the same class again (a module reloaded, a notebook cell rerun)
    with pytest.raises(TypeError, match="kind 'test_kind_once' is already the stage"):
        @register_stage
        class Second(StageConfig):
            kind: Literal["test_kind_once"] = "test_kind_once"
