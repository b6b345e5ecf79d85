"""Files read at run time ship inside the package, and the repository's top-level copies cannot drift.

The documented contracts (schemas/, quality/) are symlinks into datakit/: one source of
truth that the wheel carries to every cluster node. Replacing a link with a copy fails here.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from datakit import resources
from datakit.stages.tokenize.tokenizers import TokenizerError, load_tokenizer

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("link, target", [
    ("schemas", "datakit/schemas"),
    ("quality", "datakit/quality/suites"),
    ("tests/data/tokenizer/tokenizer.json", "datakit/tokenizers/demo-bpe.json"),
])
def test_top_level_contract_folders_are_links_into_the_package(link, target):
    p = ROOT / link
    assert p.is_symlink(), f"{link} must stay a symlink to {target} (one source of truth, shipped in the wheel)"
    assert p.resolve() == (ROOT / target).resolve()
    assert not os.path.isabs(os.readlink(p)), "a relative link works in every clone"


def test_every_packaged_data_file_is_listed_in_package_data():
    """pyproject's package-data globs cover every non-Python file under datakit/ (else the wheel lacks it)."""
    import fnmatch
    import tomllib

    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["datakit"]
    data = [p.relative_to(ROOT / "datakit").as_posix() for p in (ROOT / "datakit").rglob("*")
            if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts]
    assert data, "the package has data files"
    missing = [f for f in data if not any(fnmatch.fnmatch(f, g) and f.count("/") == g.count("/") for g in globs)]
    assert missing == []


def test_resources_list_the_shipped_files():
    assert {"editor_event.v1", "training_record.v1", "run_report.v1", "pipeline.v1"} <= set(resources.schema_names())
    assert {"editor_event.v1", "training_record.v1", "consented_events"} <= set(resources.suite_names())
    assert resources.schema_document("editor_event.v1")["x-required-by-type"]
    assert resources.suite_document("no-such-suite") is None
    with pytest.raises(FileNotFoundError, match="known: .*editor_event.v1"):
        resources.schema_document("editor_event.v9")


def test_builtin_tokenizer_is_the_test_tokenizer_and_unknown_names_fail_clearly():
    builtin = load_tokenizer("datakit:demo-bpe")
    by_path = load_tokenizer(str(ROOT / "tests" / "data" / "tokenizer" / "tokenizer.json"))
    assert builtin.sha256 == by_path.sha256 and builtin.name == "datakit:demo-bpe"
    with pytest.raises(TokenizerError, match="known: datakit:demo-bpe"):
        load_tokenizer("datakit:nope")
    with pytest.raises(TokenizerError, match="known: datakit:demo-bpe"):
        load_tokenizer("datakit:../schemas/pipeline.v1")


def test_pipeline_names_a_builtin_tokenizer_without_resolving_it_as_a_path(tmp_path):
    """`tokenizer: datakit:demo-bpe` in a pipeline file is a name, not a path relative to the file."""
    from datakit import Pipeline
    from datakit.stages.base import CompileContext

    yml = tmp_path / "p.yaml"
    yml.write_text("name: t\ninput: {path: 'x/*.jsonl', format: jsonl}\nstages:\n"
                   "  - {kind: tokenize, tokenizer: 'datakit:demo-bpe', seq_len: 64}\n"
                   "output: {path: out, format: packed}\n")
    stage = Pipeline.from_yaml(str(yml)).config.stages[0]
    assert stage.load(CompileContext(base_dir=tmp_path)).name == "datakit:demo-bpe"
