"""A `manifest.json` that is a JSON object with a field of the wrong type: one line naming the field, exit 2.

Found in a hostile-input review: `"shards": "x"`, `"shards": [1]` or `"pipeline": "x"` made `datakit
validate`, `diff`, `inspect` and `report` fail with "failed unexpectedly (TypeError|AttributeError); this
is a bug", exit 3, where a manifest that is not JSON, or not an object, was already one line, exit 2.
"""
from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from datakit import Pipeline
from datakit.io.dataset import read_output
from datakit.cli import app
from datakit.io.atomic import DamagedJSONError, manifest_shape_error
from tests.eventgen import make_event, write_jsonl

TOKENIZER = "tests/data/tokenizer/tokenizer.json"


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("out")
    write_jsonl(root / "logs" / "a.jsonl", [make_event(i) for i in range(20)])
    base = Pipeline("p").input(str(root / "logs")).add({"kind": "ingest"}).add({"kind": "extract", "kinds": ["code"]})
    base.output(str(root / "parquet"), format="parquet", shards=2).run(workers=1)
    (Pipeline("q").input(str(root / "logs")).add({"kind": "ingest"}).add({"kind": "extract", "kinds": ["code"]})
     .add({"kind": "tokenize", "tokenizer": TOKENIZER, "seq_len": 128})
     .output(str(root / "packed"), format="packed", shards=2).run(workers=1))
    return root


def _damaged(src, tmp_path, key, value):
    bad = tmp_path / "bad"
    shutil.copytree(src, bad)
    m = json.loads((bad / "manifest.json").read_text())
    node = m
    for k in key[:-1]:
        node = node[k]
    node[key[-1]] = value
    (bad / "manifest.json").write_text(json.dumps(m))
    return str(bad)


@pytest.mark.parametrize("fmt", ["parquet", "packed"])
@pytest.mark.parametrize("key,value,named", [
    (["shards"], "x", "shards is a string, not an array"),
    (["shards"], [1], "shards/0 is a number, not an object"),
    (["pipeline"], "x", "pipeline is a string, not an object"),
    (["shards", 0, "files"], {"a": 1}, "shards/0/files is an object, not an array"),
    (["shards", 1, "sha256"], ["x"], "shards/1/sha256 is an array, not an object"),
    (["rows"], True, "rows is a boolean, not a number"),
])
def test_every_reader_names_the_field_exit_2(outputs, tmp_path, fmt, key, value, named):
    src = outputs / fmt
    bad = _damaged(src, tmp_path, key, value)
    commands = [["validate", bad], ["diff", str(src), bad], ["diff", bad, str(src)], ["report", bad],
                ["inspect", bad]]
    for args in commands:
        r = CliRunner().invoke(app, args)
        lines = [ln for ln in r.stderr.splitlines() if ln.startswith("datakit: error:")]
        assert r.exit_code == 2 and len(lines) == 1, (args, r.exit_code, r.stderr)
        assert "this is a bug" not in lines[0] and f"manifest.json is damaged: {named}" in lines[0], lines[0]
    if fmt == "parquet":
        with pytest.raises(DamagedJSONError, match=named):
            read_output(bad)


def test_intact_manifests_of_every_kind_fit(outputs):
    for fmt in ("parquet", "packed"):
        m = json.loads((outputs / fmt / "manifest.json").read_text())
        assert manifest_shape_error(m) is None
        assert CliRunner().invoke(app, ["validate", str(outputs / fmt)]).exit_code == 0


def test_the_error_never_quotes_the_value():
    assert manifest_shape_error({"pipeline": "jane.doe@example.com"}) == "pipeline is a string, not an object"
    assert "jane" not in (manifest_shape_error({"shards": [{"files": ["a", {"jane.doe@example.com": 1}]}]}) or "")
