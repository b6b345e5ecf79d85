"""Pipeline API and file format: YAML round-trip, validation errors that name file/stage/field, user stages."""
from __future__ import annotations

from typing import Literal

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from datakit import CompileContext, Pipeline, PipelineError, StageConfig, register_stage
from datakit.contracts import EDITOR_EVENT_V1
from datakit.io.dataset import read_output
from tests.eventgen import make_event, write_jsonl

YAML = """
name: quickstart
seed: 7
input: {path: "logs/*.jsonl", format: jsonl, schema: editor_event.v1}
stages:
  - {kind: ingest}
output: {path: "out/", format: parquet, shards: 3}
"""


def test_yaml_round_trip_is_identity(tmp_path):
    p = Pipeline.from_yaml_string(YAML)
    again = Pipeline.from_yaml_string(p.to_yaml())
    assert again == p
    assert again.to_dict()["seed"] == 7 and again.to_dict()["output"]["shards"] == 3
    f = tmp_path / "p.yaml"
    p.to_yaml(str(f))  # saved elsewhere: its relative paths rebased, so they still mean the same files
    assert Pipeline.from_yaml(f) == p
    f.write_text(p.to_yaml())  # the same text in another folder: other files
    assert Pipeline.from_yaml(f) != p and Pipeline.from_yaml(f).to_dict() == p.to_dict()


def test_builder_equals_yaml():
    built = (Pipeline("quickstart", seed=7).input("logs/*.jsonl").add({"kind": "ingest"})
             .output("out/", shards=3))
    assert built == Pipeline.from_yaml_string(YAML)


@pytest.mark.parametrize("text, words", [
    ("name: x\nstages: [{kind: nosuch}]", ["stage 1", "unknown stage kind 'nosuch'"]),
    ("name: x\nstages: [{kind: ingest, bogus: 1}]", ["stage 1 (ingest)", "bogus"]),
    ("name: x\nseed: notanumber", ["seed"]),
    ("name: x\nstages: [ingest]", ["stage 1", "kind"]),
])
def test_validation_errors_name_file_stage_and_field(tmp_path, text, words):
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(PipelineError) as e:
        Pipeline.from_yaml(f)
    msg = str(e.value)
    assert str(f) in msg
    for w in words:
        assert w in msg


def test_stage_order_is_checked(tmp_path):
    write_jsonl(tmp_path / "logs" / "a.jsonl", [make_event(0)])
    p = Pipeline("x").input(str(tmp_path / "logs")).output(str(tmp_path / "o"))
    with pytest.raises(PipelineError, match="ingest"):
        p.compile()
    # a records stage right after ingest says which stage is missing (found in a docs review: no hint)
    p = Pipeline("x").input(str(tmp_path / "logs")).add({"kind": "ingest"}).add({"kind": "dedup"}).output(str(tmp_path / "o"))
    with pytest.raises(PipelineError, match=r"needs training_record.v1 input but gets editor_event.v1 \(add \{kind: extract\} first\)"):
        p.compile()


def test_a_key_given_twice_is_refused(tmp_path):
    """Found in a hostile-input review: `stages:` twice ran the second list without a word (the first held
    scrub_pii, so e-mail addresses reached the output); a repeated `output:` wrote to the second path.
    YAML merge keys (`<<: *base`) may still be overridden, as YAML says."""
    f = tmp_path / "dup.yaml"
    f.write_text("name: t\ninput: {path: in.jsonl, format: jsonl}\n"
                 "stages: [{kind: ingest}, {kind: extract, kinds: [code]}, {kind: scrub_pii}]\n"
                 "output: {path: out, format: parquet}\nstages: [{kind: ingest}, {kind: extract, kinds: [code]}]\n")
    with pytest.raises(PipelineError, match=r"dup.yaml: line 5: key 'stages' is given twice in one mapping \(first on line 3\)"):
        Pipeline.from_yaml(f)
    with pytest.raises(PipelineError, match=r"pipeline: line 2: key 'kind' is given twice"):
        Pipeline.from_yaml_string("stages:\n  - {kind: ingest, kind: dedup}\n")
    merged = Pipeline.from_yaml_string("name: t\ninput: &in {path: a.jsonl, format: jsonl}\n"
                                       "output: {<<: *in, path: out, format: parquet}\nstages: [{kind: ingest}]\n")
    assert merged.config.output.path == "out" and merged.config.output.format == "parquet"


def test_a_pipeline_file_that_is_not_text_is_one_line(tmp_path):
    """Found in a hostile-input review: a binary or UTF-16 file, or a folder, given as the pipeline was
    "failed unexpectedly ... this is a bug", exit 3."""
    (tmp_path / "bin.yaml").write_bytes(b"\xff\xfe\x00junk")
    (tmp_path / "u16.yaml").write_text("name: t\n", encoding="utf-16")
    (tmp_path / "adir").mkdir()
    (tmp_path / "bom.yaml").write_bytes("\ufeffname: t\ninput: {path: a.jsonl}\nstages: [{kind: ingest}]\n"
                                        "output: {path: out}\n".encode("utf-8"))
    for name, needle in (("bin.yaml", "not a UTF-8 text file"), ("u16.yaml", "not a UTF-8 text file"),
                         ("adir", "is a folder; give the pipeline's YAML file")):
        with pytest.raises(PipelineError, match=needle):
            Pipeline.from_yaml(tmp_path / name)
    assert Pipeline.from_yaml(tmp_path / "bom.yaml").config.name == "t"  # a UTF-8 byte order mark is text


def test_an_empty_path_is_refused(tmp_path, monkeypatch):
    """Found in a hostile-input review: `--input ""` (an unset variable) read the whole current folder."""
    from datakit.io.fs import InputError, expand, from_cwd

    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("mine")
    for fn in (from_cwd, expand):
        with pytest.raises(InputError, match="an empty path names no file or folder"):
            fn(" ")
    with pytest.raises(PipelineError, match="input: field path: Value error, an empty path"):
        Pipeline("x").input("")
    p = Pipeline("x").input(str(tmp_path)).add({"kind": "ingest"}).output(str(tmp_path / "o"))
    with pytest.raises(InputError, match="an empty path"):  # an override, as `--input ""` gives it
        p.compile(input_override=[""])


def test_an_empty_output_or_input_list_a_wide_seed_and_records_as_json_lines_are_refused(tmp_path):
    """Found in a Python API review: `output("")` ran every stage, wrote nothing and returned success;
    `input([])` committed an empty dataset; JSON Lines declared as training_record.v1 were ingested as
    editor events (every one quarantined); seeds 0, 2^64 and 2^70 gave the same bytes under other hashes."""
    import jsonschema

    from datakit.contracts import load_contract

    validator = jsonschema.Draft202012Validator(load_contract("pipeline.v1"))
    logs = tmp_path / "logs"
    write_jsonl(logs / "a.jsonl", [make_event(0)])
    cases = [(lambda: Pipeline("x").input(str(logs)).add({"kind": "ingest"}).output(" "),
              "output: field path: Value error, an empty path names no folder", {"output": {"path": " "}}),
             (lambda: Pipeline("x").input([]).add({"kind": "ingest"}).output(str(tmp_path / "o")),
              "input: field path: Value error, no input path given", {"input": {"path": []}}),
             (lambda: Pipeline("x", seed=-1), "field seed: Input should be greater than or equal to 0", {"seed": -1}),
             (lambda: Pipeline("x", seed=2**64), "field seed: Input should be less than", {"seed": 2**64}),
             (lambda: Pipeline("x").input(str(logs), schema="training_record.v1").add({"kind": "dedup"})
              .output(str(tmp_path / "o")).compile(),
              r"JSON Lines input is read as editor events .*training_record.v1 is read from Parquet",
              {"input": {"path": "a", "schema": "training_record.v1"}})]
    for build, needle, doc in cases:
        with pytest.raises(PipelineError, match=needle):
            build()
        full = {"input": {"path": "a"}, "stages": [{"kind": "ingest"}], "output": {"path": "o"}, **doc}
        assert list(validator.iter_errors(full)), doc  # the pipeline file's JSON Schema says the same
    assert not (tmp_path / "o").exists()
    assert Pipeline("x", seed=2**64 - 1).config.seed == 2**64 - 1


def test_yaml_loader_is_safe(tmp_path):
    f = tmp_path / "evil.yaml"
    f.write_text("name: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(PipelineError, match="not valid YAML"):
        Pipeline.from_yaml(f)


# --- a user-registered stage, as a researcher would write it in a script ---------------------

class _DropRejected:
    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        rejected = pc.fill_null(pc.equal(batch.column("outcome"), "rejected"), False)
        drop = pc.if_else(rejected, pa.scalar("rejected_suggestion"), pa.scalar(None, pa.string()))
        return batch.append_column("_drop", drop)


@register_stage
class DropRejected(StageConfig):
    kind: Literal["test_drop_rejected"] = "test_drop_rejected"
    consumes = "editor_event.v1"
    produces = "editor_event.v1"

    def compile(self, rel, ctx: CompileContext):
        return rel.map_batches(_DropRejected(), EDITOR_EVENT_V1, name="drop_rejected")


def test_user_stage_plugs_in_and_accounting_reconciles(tmp_path):
    events = [make_event(i) for i in range(40)]
    write_jsonl(tmp_path / "logs" / "a.jsonl", events)
    res = (Pipeline("x").input(str(tmp_path / "logs")).add({"kind": "ingest"})
           .add({"kind": "test_drop_rejected"}).output(str(tmp_path / "o"), shards=2).run(workers=1))
    n_rejected = sum(1 for e in events if e.get("outcome") == "rejected")
    st = res.stage("test_drop_rejected")
    assert n_rejected > 0 and st["dropped"] == {"rejected_suggestion": n_rejected}
    for s in res.stages:
        assert s["rows_in"] == s["rows_out"] + sum(s["dropped"].values())
    out = read_output(str(tmp_path / "o"))
    assert out.num_rows == 40 - n_rejected
    assert "rejected" not in out.column("outcome").to_pylist()


def test_explain_lists_every_node(tmp_path):
    write_jsonl(tmp_path / "logs" / "a.jsonl", [make_event(0)])
    text = Pipeline("x").input(str(tmp_path / "logs")).add({"kind": "ingest"}).output(str(tmp_path / "o")).explain()
    assert "Sink(parquet" in text and "MapBatches(parse_validate" in text and "Source(jsonl, 1 files" in text


def test_explain_prints_the_dag_once_with_shared_nodes_by_id(tmp_path):
    """A node several others read (the Source, dedup's kept records) is one line, referenced by its #id."""
    import re

    write_jsonl(tmp_path / "logs" / "a.jsonl", [make_event(0)])
    p = (Pipeline("x").input(str(tmp_path / "logs")).add({"kind": "ingest"}).add({"kind": "extract"})
         .add({"kind": "dedup"}).output(str(tmp_path / "o")))
    plan = p.compile()
    text = p.explain()
    lines = text.splitlines()
    assert len(lines) == len(plan.nodes()) + 1  # every node once, plus the sink
    assert sum("Source(" in ln for ln in lines) == 1
    ids = [re.match(r"#(\d+) ", ln).group(1) for ln in lines[:-1]]
    assert ids == [str(k) for k in range(len(ids))]
    refs = [r for ln in lines[:-1] if " <- " in ln for r in re.findall(r"#(\d+)", ln.split(" <- ")[1])]
    shared = {r for r in refs if refs.count(r) > 1}
    assert shared, "dedup reads its kept records twice: some node must be referenced more than once"
    assert lines[-1].startswith("Sink(parquet") and lines[-1].endswith(f"<- #{len(ids) - 1}")

    dot = p.explain("dot")
    declared = set(re.findall(r"^\s+(n\d+) \[label=", dot, re.M))
    edges = re.findall(r"^\s+(n\d+) -> (n\d+|sink);", dot, re.M)
    assert dot.startswith("digraph plan {") and dot.rstrip().endswith("}")
    assert len(declared) == len(plan.nodes())
    assert len(edges) == sum(len(n.inputs) for n in plan.nodes()) + 1
    assert all(a in declared and (b in declared or b == "sink") for a, b in edges)
    with pytest.raises(ValueError, match="unknown explain format"):
        p.explain("svg")


@pytest.mark.parametrize("build, needle", [
    (lambda: Pipeline("x", seed="abc"), "pipeline: field seed"),
    (lambda: Pipeline("x").input(42), "input: field path"),
    (lambda: Pipeline("x").output("o", shards=0), "output: field shards"),
    (lambda: Pipeline("x").output("o", shard=2), "output: field shard"),
    (lambda: Pipeline.from_yaml_string("a: [\n"), "pipeline: not valid YAML"),
])
def test_the_builder_says_what_is_wrong_as_one_pipeline_error(build, needle):
    """Found in review: these raised pydantic's multi-line ValidationError (or a raw yaml ParserError)
    where `.add()` and `from_yaml` raise one-line PipelineErrors."""
    from datakit.pipeline import PipelineError

    with pytest.raises(PipelineError, match=needle):
        build()


def test_an_unset_mds_size_limit_leaves_the_config_and_its_hash_as_before():
    p = Pipeline("x").input("logs/*.jsonl").add({"kind": "ingest"}).output("out")
    assert "mds_size_limit" not in p.to_yaml()


def test_to_yaml_into_another_folder_is_the_same_pipeline(tmp_path, monkeypatch):
    """Found in review: a pipeline built in `s/` and written to `s/sub/p.yaml` wrote its output to
    `s/sub/out_rel` once loaded again (paths in a file are relative to the file's folder)."""
    import yaml

    from datakit.pipeline import Pipeline

    monkeypatch.chdir(tmp_path)
    (tmp_path / "logs").mkdir()
    (tmp_path / "optouts.parquet").write_bytes(b"")
    (tmp_path / "my_eval.jsonl").write_text("")
    p = (Pipeline("r").input("logs/*.jsonl").add({"kind": "ingest"})
         .add({"kind": "consent", "optouts": "optouts.parquet"}).add({"kind": "extract"})
         .add({"kind": "scrub_pii", "ner": "off", "key_file": "pii.key"})  # found in review: not rebased
         .add({"kind": "decontaminate", "evals": ["humaneval", "mine=my_eval.jsonl", {"name": "x", "path": "my_eval.jsonl"}]})
         .add({"kind": "tokenize", "tokenizer": "datakit:demo-bpe"})
         .output("out_rel", format="packed"))
    (tmp_path / "sub").mkdir()
    p.to_yaml(tmp_path / "sub" / "p.yaml")
    saved = yaml.safe_load((tmp_path / "sub" / "p.yaml").read_text())
    assert saved["input"]["path"] == "../logs/*.jsonl" and saved["output"]["path"] == "../out_rel"
    assert saved["stages"][1]["optouts"] == "../optouts.parquet"
    assert saved["stages"][3]["key_file"] == "../pii.key"
    assert saved["stages"][4]["evals"] == ["humaneval", "mine=../my_eval.jsonl", {"name": "x", "path": "../my_eval.jsonl",
                                                                                    "fields": None, "id_field": None}]
    assert saved["stages"][5]["tokenizer"] == "datakit:demo-bpe"  # a name, not a file
    home = Pipeline("h").input("logs/*.jsonl").add({"kind": "scrub_pii", "ner": "off", "key_file": "~/keys/pii.key"})
    home.to_yaml(tmp_path / "sub" / "h.yaml")  # a home-relative path is not the folder's: kept as written
    assert yaml.safe_load((tmp_path / "sub" / "h.yaml").read_text())["stages"][0]["key_file"] == "~/keys/pii.key"
    q = Pipeline.from_yaml(tmp_path / "sub" / "p.yaml")
    from datakit.stages.base import CompileContext

    for ctx_base, cfg in ((p.base_dir, p.config), (q.base_dir, q.config)):
        ctx = CompileContext(base_dir=ctx_base)
        assert ctx.resolve(cfg.output.path) == str(tmp_path / "out_rel")
    # written into its own folder, nothing moves; without a path it is the text as before
    p.to_yaml(tmp_path / "same.yaml")
    assert yaml.safe_load((tmp_path / "same.yaml").read_text())["output"]["path"] == "out_rel"
    assert p.to_yaml() == (tmp_path / "same.yaml").read_text()


def test_a_stage_defined_in_the_script_warns_when_the_pipeline_is_saved(caplog):
    """Found in review: saved as `kind: ident` without a word, which `datakit run` cannot load."""
    import logging
    from typing import Literal

    from datakit import StageConfig, register_stage
    from datakit.pipeline import Pipeline

    class ScriptStage(StageConfig):
        kind: Literal["test_script_stage"] = "test_script_stage"

        def compile(self, rel, ctx):
            return rel

    ScriptStage.__module__ = "__main__"
    register_stage(ScriptStage)
    p = Pipeline("r").add(ScriptStage())
    with caplog.at_level(logging.WARNING, logger="datakit"):
        text = p.to_yaml()
    assert "kind: test_script_stage" in text and "defined in the script itself (__main__)" in caplog.text


def test_paths_may_be_pathlib_paths_everywhere_a_path_is_taken(tmp_path, monkeypatch):
    """Found in review: `run(output=Path("o"))` was a bare `TypeError: 'PosixPath' object is not iterable`
    and `.input(Path(...))` a pydantic type error, while the loaders take a `Path`."""
    from pathlib import Path

    from datakit.io.dataset import read_output
    from datakit.pipeline import Pipeline
    from tests.eventgen import make_event, write_jsonl

    monkeypatch.chdir(tmp_path)
    f = write_jsonl(tmp_path / "logs" / "a.jsonl", [make_event(i) for i in range(4)])
    p = Pipeline("paths").input(Path("logs") / "a.jsonl").add({"kind": "ingest"}).output(Path("o1"))
    assert p.config.input.path == "logs/a.jsonl" and p.config.output.path == "o1"
    assert p.run(workers=1).manifest["rows"] == 4
    r = p.run(workers=1, input=[Path(f)], output=Path("o2"))
    assert r.output_path == str(tmp_path / "o2") and read_output(tmp_path / "o2").num_rows == 4
    assert p.compile(input_override=Path("logs/a.jsonl"), output_override=Path("o3")).sink.path == str(tmp_path / "o3")


def test_the_config_hash_is_of_the_paths_used_not_of_their_spelling(tmp_path, monkeypatch):
    """Found in review: `run()` and `run(output="o")` into the same folder gave two config hashes (the
    second reused no shard of the first), and so did the same pipeline saved with `to_yaml` and loaded."""
    from datakit.pipeline import Pipeline
    from tests.eventgen import make_event, write_jsonl

    import pyarrow as pa
    import pyarrow.parquet as pq

    monkeypatch.chdir(tmp_path)
    write_jsonl(tmp_path / "logs" / "a.jsonl", [make_event(i) for i in range(4)])
    pq.write_table(pa.table({"user_id": ["nobody"]}), tmp_path / "optout.parquet")
    p = (Pipeline("h").input("logs/*.jsonl").add({"kind": "ingest"})
         .add({"kind": "consent", "optouts": "optout.parquet"}).output("o", shards=2))
    a = p.compile()
    assert a.config["stages"][1]["optouts"] == str(tmp_path / "optout.parquet")  # a stage's path field too
    assert a.config["output"]["path"] == str(tmp_path / "o") and a.config["input"]["path"] == str(tmp_path / "logs/*.jsonl")
    assert p.compile(output_override="o").config_hash == a.config_hash
    assert p.compile(output_override=str(tmp_path / "o"), input_override="logs/*.jsonl").config_hash == a.config_hash
    p.to_yaml(tmp_path / "sub" / "h.yaml")
    assert Pipeline.from_yaml(tmp_path / "sub" / "h.yaml").compile().config_hash == a.config_hash
    assert p.compile(output_override="elsewhere").config_hash != a.config_hash
    first = p.run(workers=1)
    again = p.run(workers=1, output="o")
    assert again.extra["reused_shards"] == len(first.manifest["shards"]) == 2


def test_a_tilde_path_in_a_pipeline_file_is_the_users_home(tmp_path, monkeypatch):
    """Found in review: `output: {path: ~/data}` in a pipeline file wrote into a folder named `~` beside the
    file (and `input: {path: ~/logs}` looked there), where a shell and every other tool mean the home
    folder. A stage's path field too; the config hash records the folder meant."""
    from datakit.pipeline import Pipeline
    from tests.eventgen import make_event, write_jsonl

    import pyarrow as pa
    import pyarrow.parquet as pq

    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    write_jsonl(home / "logs" / "a.jsonl", [make_event(i) for i in range(4)])
    pq.write_table(pa.table({"user_id": ["nobody"]}), home / "optout.parquet")
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "p.yaml").write_text(
        "name: t\ninput: {path: ~/logs/*.jsonl}\nstages:\n- {kind: ingest}\n- {kind: consent, optouts: ~/optout.parquet}\n"
        "output: {path: ~/out, shards: 1}\n")
    p = Pipeline.from_yaml(tmp_path / "proj" / "p.yaml")
    plan = p.compile()
    assert plan.config["output"]["path"] == str(home / "out") and plan.config["stages"][1]["optouts"] == str(home / "optout.parquet")
    res = p.run(workers=1)
    assert res.output_path == str(home / "out") and res.manifest["rows"] == 4
    assert not (tmp_path / "proj" / "~").exists()


def test_parquet_files_read_as_json_lines_are_refused_with_the_fix(tmp_path):
    """Found in a docs review: `.input("x/*.parquet")` without `format="parquet"` read each file as JSON
    Lines (the default): every row quarantined (bad_json, bad_utf8), exit 0."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from datakit.pipeline import Pipeline

    (tmp_path / "x").mkdir()
    pq.write_table(pa.table({"a": [1]}), tmp_path / "x" / "part-0.parquet")
    p = Pipeline("p").input(str(tmp_path / "x" / "*.parquet")).add({"kind": "ingest"}).output(str(tmp_path / "o"))
    with pytest.raises(PipelineError, match=r"part-0.parquet is Parquet, but input.format is jsonl \(the default\): "
                                            r"set `format: parquet`"):
        p.compile()


def test_a_missing_optout_list_names_its_stage_and_field(tmp_path):
    """Found in a docs review: a typo in `optouts:` said only "input not found: .../optout.parquet"."""
    from datakit.io.fs import InputError

    write_jsonl(tmp_path / "logs" / "a.jsonl", [make_event(0)])
    p = (Pipeline("x").input(str(tmp_path / "logs")).add({"kind": "ingest"})
         .add({"kind": "consent", "optouts": str(tmp_path / "optuot.parquet")}).output(str(tmp_path / "o")))
    with pytest.raises(InputError, match=r"^stage consent: optouts: input not found: .*optuot.parquet"):
        p.compile()


def test_a_misspelt_field_gets_the_closest_name(tmp_path):
    """Found in a docs review: `minhash: {treshold: 0.8}` said only "Extra inputs are not permitted"."""
    f = tmp_path / "p.yaml"
    f.write_text("name: t\ninput: {path: in, fromat: parquet}\nstage: []\n"
                 "stages: [{kind: dedup, minhash: {treshold: 0.8}}]\noutput: {path: o, shard: 2}\n")
    with pytest.raises(PipelineError, match=r"field minhash.treshold: Extra inputs are not permitted \(did you mean 'threshold'\?\)"):
        Pipeline.from_yaml(f)
    # the same setting one level up (found in review: no hint) names the block it belongs in
    with pytest.raises(PipelineError, match=r"field treshold: Extra inputs are not permitted \(did you mean "
                                            r"'minhash.threshold', inside 'minhash'\?\)"):
        Pipeline("t").add({"kind": "dedup", "treshold": 0.8})
    f.write_text("name: t\ninput: {path: in, fromat: parquet}\nstage: []\noutput: {path: o, shard: 2}\n")
    with pytest.raises(PipelineError) as e:
        Pipeline.from_yaml(f)
    for part in ("field input.fromat: Extra inputs are not permitted (did you mean 'format'?)",
                 "field stage: Extra inputs are not permitted (did you mean 'stages'?)",
                 "field output.shard: Extra inputs are not permitted (did you mean 'shards'?)"):
        assert part in str(e.value)
    with pytest.raises(PipelineError, match=r"field zzz: Extra inputs are not permitted$"):  # nothing close: no guess
        Pipeline("x").add({"kind": "dedup", "zzz": 1})


def test_a_parquet_file_beside_json_lines_logs_is_not_read_as_lines(tmp_path, caplog):
    """A logs folder that also holds an opt-out list (`datakit synth` writes `optouts.parquet` there): the
    Parquet file was read as JSON Lines and its bytes quarantined as bad lines; it is left out, said in a
    warning (a Parquet-only input is an error, above)."""
    import logging

    import pyarrow as pa
    import pyarrow.parquet as pq

    write_jsonl(tmp_path / "logs" / "dt=1" / "a.jsonl", [make_event(i) for i in range(3)])
    pq.write_table(pa.table({"user_id": ["nobody"]}), tmp_path / "logs" / "optouts.parquet")
    p = Pipeline("x").input(str(tmp_path / "logs")).add({"kind": "ingest"}).output(str(tmp_path / "o"))
    with caplog.at_level(logging.WARNING, logger="datakit"):
        res = p.run(workers=1)
    st = res.stage("ingest")
    assert st["rows_in"] == st["rows_out"] + sum(st["dropped"].values()) and "bad_utf8" not in st["dropped"], st
    assert "optouts.parquet is Parquet among JSON Lines files and is not read" in caplog.text


def test_a_path_spelled_another_way_is_the_same_run(tmp_path, monkeypatch):
    """Found in review: `--output ../out/E` from a subfolder and `--output ./out/E/` recorded other paths
    than `--output out/E` (`/x/p/../out/E`, `/x/./out/E/`): another pipeline hash for the same run, so its
    finished shards were rewritten and a killed run did not resume. Paths are normalized; the same in a
    pipeline file, where an absolute path was kept as spelled."""
    from datakit.io.fs import from_cwd

    (tmp_path / "p").mkdir()
    write_jsonl(tmp_path / "logs" / "a.jsonl", [make_event(1)])
    p = Pipeline("t", seed=0).input(str(tmp_path / "logs" / "*.jsonl")).add({"kind": "ingest"}).output("out")
    monkeypatch.chdir(tmp_path)
    plain = p.compile(output_override="out/E")
    dotted = p.compile(output_override="./out/E/")
    monkeypatch.chdir(tmp_path / "p")
    up = p.compile(output_override="../out/E")
    assert plain.sink.path == dotted.sink.path == up.sink.path == str(tmp_path / "out" / "E")
    assert plain.config_hash == dotted.config_hash == up.config_hash
    assert from_cwd(str(tmp_path / "p" / ".." / "logs" / "")) == str(tmp_path / "logs")
    q = Pipeline("t", seed=0).input(str(tmp_path / "logs" / "*.jsonl")).add({"kind": "ingest"}).output(
        str(tmp_path / "p" / ".." / "out" / "E") + "/")
    assert q.compile().sink.path == plain.sink.path and q.compile().config_hash == plain.config_hash


class _NoReturn(StageConfig):
    kind: Literal["test_no_return"] = "test_no_return"
    consumes = "editor_event.v1"
    produces = "editor_event.v1"

    def compile(self, rel, ctx: CompileContext):
        rel.map_batches(lambda b: b, rel.schema, name="x")  # forgets `return`


class _BadCall(StageConfig):
    kind: Literal["test_bad_call"] = "test_bad_call"
    consumes = "editor_event.v1"
    produces = "editor_event.v1"

    def compile(self, rel, ctx: CompileContext):
        return rel.map_batches(lambda b: b, name="x")  # no schema


def test_config_mistakes_found_in_review_are_one_line_at_compile(tmp_path):
    """Found in review: kto after an extract of the default kinds (no feedback) ran and published an empty
    dataset, exit 0; a custom stage whose compile() forgot `return` or called map_batches wrongly was a
    40-line traceback, exit 1; `format: ngram_index` (an internal writer) ran every stage, then crashed."""
    log = write_jsonl(tmp_path / "logs" / "a.jsonl", [make_event(1)])
    base = Pipeline("t").input(str(log)).add({"kind": "ingest"})
    kto = base.add({"kind": "extract"}).add({"kind": "kto"}).output(str(tmp_path / "out"))
    with pytest.raises(PipelineError, match=r"stage 3 \(kto\): reads feedback records, but the extract stage makes "
                                            r"only code, fim, sft; add feedback"):
        kto.compile()
    for stage, msg in ((_NoReturn(), r"its compile\(\) returned NoneType, not the Rel it built \(a missing `return`\?\)"),
                       (_BadCall(), r"its compile\(\) failed: TypeError: .*map_batches\(\) missing 1 required "
                                    r"positional argument: 'schema' \(at test_pipeline.py:\d+ in compile\)")):
        p = Pipeline("t").input(str(log)).add({"kind": "ingest"}).add(stage).output(str(tmp_path / "out"))
        with pytest.raises(PipelineError, match=msg) as e:
            p.compile()
        assert "\n" not in str(e.value)
    with pytest.raises(PipelineError, match="unknown output format 'ngram_index'; known: mds, megatron, packed, parquet"):
        base.output(str(tmp_path / "out"), format="ngram_index").compile()


def test_a_pipeline_saved_into_another_folder_and_loaded_back_equals_itself(tmp_path, monkeypatch):
    """Found in review: `to_yaml("sub/p.yaml")` then `from_yaml` gave a pipeline with the same hash but
    `==` False (its relative paths spelled from sub/); equality reads each path from its own folder."""
    write_jsonl(tmp_path / "logs" / "a.jsonl", [make_event(1)])
    monkeypatch.chdir(tmp_path)
    p = Pipeline("t").input("logs/*.jsonl").add({"kind": "ingest"}).output("out")
    p.to_yaml("sub/p.yaml")
    q = Pipeline.from_yaml("sub/p.yaml")
    assert q == p and q.compile().config_hash == p.compile().config_hash
    assert Pipeline("t").input("logs/*.jsonl").add({"kind": "ingest"}).output("other") != p


def test_every_error_about_a_run_is_a_datakit_error(tmp_path):
    """Found in review: `except PipelineError` in a notebook missed a missing input, a tokenizer that does not
    load and an output path that is a file (`InputError` and its kind derived from Exception alone). All
    share `datakit.DatakitError` now; each keeps its own base."""
    import datakit
    from datakit.engines.core import StageError
    from datakit.io.fs import InputError
    from datakit.io.storage import StorageError
    from datakit.quality.expect import QualityGateError
    from datakit.stages.tokenize.tokenizers import TokenizerError

    for cls in (PipelineError, InputError, TokenizerError, StorageError, QualityGateError, StageError):
        assert issubclass(cls, datakit.DatakitError), cls
    assert issubclass(PipelineError, ValueError) and issubclass(StorageError, RuntimeError)
    with pytest.raises(datakit.DatakitError, match="no input files match"):
        Pipeline("t").input(str(tmp_path / "nowhere" / "*.jsonl")).add({"kind": "ingest"}).compile()
