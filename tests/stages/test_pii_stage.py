"""The scrub_pii stage on training records: every text scrubbed, schema kept, drops and counts reported."""
from __future__ import annotations

import json
import logging

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datakit.contracts import TRAINING_RECORD_V1
from datakit.stages.base import stage_class
from datakit.stages.scrub_pii.stage import ScrubFn, ScrubPiiConfig

PEM = "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo\n-----END RSA PRIVATE KEY-----"
SECRETS = ["jane@acme-corp.com", "AKIAIOSFODNN7EXAMPLE", "415-555-0132", "Tr0ub4dor&3"]


def _rec(doc_id: str, kind: str, segments: list[tuple[str, bool, str]], chosen=None, rejected=None) -> dict:
    return {"doc_id": doc_id, "kind": kind, "segments": [{"text": t, "train": tr, "role": r} for t, tr, r in segments],
            "chosen": chosen, "rejected": rejected, "source": None, "meta": "{}"}


def _records() -> list[dict]:
    return [
        _rec("a", "sft", [("mail me: jane@acme-corp.com", False, "user"),
                          ('key = "AKIAIOSFODNN7EXAMPLE"', True, "assistant")]),
        _rec("b", "code", [(PEM, True, "code")]),
        _rec("c", "preference", [("fix it", False, "prompt")], chosen="call 415-555-0132", rejected="no"),
        _rec("d", "fim", [('DB_PASSWORD = "', False, "prefix"), ('"\n', False, "suffix"),
                          ("Tr0ub4dor&3", True, "middle")]),
        _rec("e", "code", [("print('clean')", True, "code")]),
    ]


def _batch() -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(_records(), schema=TRAINING_RECORD_V1)


def test_registered_under_its_kind() -> None:
    assert stage_class("scrub_pii") is ScrubPiiConfig


def test_batch_fn_scrubs_every_text_and_keeps_schema() -> None:
    out = ScrubPiiConfig(ner="off").build_fn()(_batch())
    assert pa.schema([f for f in out.schema if not f.name.startswith("_")]) == TRAINING_RECORD_V1
    assert out.schema.names[-3:] == ["_drop", "_drop_detail", "_metrics"]
    rows = out.to_pylist()
    blob = json.dumps(rows)
    for s in SECRETS:
        assert s not in blob
    assert rows[0]["segments"][0]["text"] == "mail me: <EMAIL>"
    assert rows[0]["segments"][1] == {"text": 'key = "<AWS_ACCESS_KEY>"', "train": True, "role": "assistant"}
    assert rows[2]["chosen"] == "call <PHONE>" and rows[2]["rejected"] == "no"
    assert [r["_drop"] for r in rows] == [None, "pii:private_key", None, None, None]
    assert rows[4]["segments"][0]["text"] == "print('clean')"
    # the FIM password is split across prefix | middle | suffix: found only when read as one file
    assert [s["text"] for s in rows[3]["segments"]] == ['DB_PASSWORD = "', '"\n', "<SECRET>"]
    metrics = [json.loads(r["_metrics"]) for r in rows if r["_metrics"]]
    assert metrics == [{"pii.aws_access_key": 1, "pii.email": 1, "pii.phone": 1, "pii.private_key": 1,
                        "pii.secret_assignment": 1}]


def test_sliced_batches_give_the_same_rows() -> None:
    fn = ScrubPiiConfig(ner="off").build_fn()
    whole = fn(_batch()).to_pylist()
    parts = fn(_batch().slice(0, 2)).to_pylist() + fn(_batch().slice(2)).to_pylist()
    strip = lambda rs: [{k: v for k, v in r.items() if k != "_metrics"} for r in rs]  # noqa: E731
    assert strip(parts) == strip(whole)


def test_no_spacy_model_logs_once_and_runs(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a spaCy pipeline (simulated: one may be installed here) `ner: auto` runs pattern-only."""
    from datakit.stages.scrub_pii import ner as ner_module

    monkeypatch.setattr(ner_module, "installed_spacy_model", lambda: None)
    monkeypatch.setattr(ner_module, "_ner_warned", False)
    with caplog.at_level(logging.WARNING, logger="datakit.pii"):
        fn = ScrubPiiConfig(ner="auto").build_fn()
        ScrubPiiConfig(ner="auto").build_fn()
    msgs = [r.getMessage() for r in caplog.records if "spaCy" in r.getMessage()]
    assert len(msgs) == 1 and "pattern detectors only" in msgs[0]
    assert fn.person is None
    rows = fn(_batch()).to_pylist()
    assert rows[0]["segments"][0]["text"] == "mail me: <EMAIL>"  # patterns still run


def test_ner_off_does_not_load_a_model(monkeypatch: pytest.MonkeyPatch) -> None:
    from datakit.stages.scrub_pii import ner as ner_module

    def boom():
        raise AssertionError("ner: off must not look for a model")

    monkeypatch.setattr(ner_module, "installed_spacy_model", boom)
    assert ScrubPiiConfig(ner="off").build_fn().person is None


def test_pipeline_run_reports_counts_and_leaks_nothing(tmp_path, caplog: pytest.LogCaptureFixture) -> None:
    from datakit import Pipeline
    from datakit.io.dataset import read_output

    (tmp_path / "in").mkdir()
    pq.write_table(pa.Table.from_batches([_batch()]), tmp_path / "in" / "part-0.parquet")
    out = tmp_path / "out"
    p = (Pipeline(name="pii", seed=0)
         .input(str(tmp_path / "in" / "*.parquet"), format="parquet", schema="training_record.v1")
         .add({"kind": "scrub_pii", "ner": "off"})
         .output(str(out), format="parquet", shards=2))
    with caplog.at_level(logging.DEBUG):
        p.run(engine="local", workers=1)
    table = read_output(str(out))
    assert sorted(table.column("doc_id").to_pylist()) == ["a", "c", "d", "e"]
    assert table.schema == TRAINING_RECORD_V1
    run = json.loads((out / "_run.json").read_text())
    stage = next(s for s in run["stages"] if s.get("kind") == "scrub_pii" or s.get("name") == "scrub_pii")
    assert stage["dropped"] == {"pii:private_key": 1}
    assert stage["rows_in"] == stage["rows_out"] + sum(stage["dropped"].values())
    assert stage["metrics"] == {"pii.aws_access_key": 1, "pii.email": 1, "pii.phone": 1,
                                "pii.private_key": 1, "pii.secret_assignment": 1}
    everything = json.dumps(table.to_pylist()) + (out / "_run.json").read_text() + caplog.text
    for f in (out / "_dropped").rglob("*"):
        if f.is_file():
            everything += f.read_bytes().decode("latin-1")
    for s in SECRETS:
        assert s not in everything


def _meta(**kw) -> str:  # as extract writes it (rules._meta)
    return json.dumps(kw, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def test_the_file_path_in_the_lineage_is_scrubbed_like_a_text(monkeypatch: pytest.MonkeyPatch) -> None:
    """Found in a privacy review: `/Users/jane.doe/...` was scrubbed in a segment and kept in `source.path`
    and `meta`'s "path" of the same record. Now the path is scrubbed with the same replacement (the same
    pseudonym as in the text), counted, and rows without findings keep their bytes."""
    monkeypatch.setenv("DATAKIT_PII_KEY", "k" * 32)
    home = "/Users/jane.doe/proj/app.py"
    rows = [_rec("a", "code", [("# see /Users/jane.doe/notes.txt", True, "code")]),
            _rec("b", "code", [("x = 1", True, "code")]),
            _rec("c", "code", [("y = 2", True, "code")]),
            _rec("d", "code", [("z = 3", True, "code")])]
    rows[0]["source"] = {"event_id": "e1", "user_id": "u1", "path": home}
    rows[0]["meta"] = _meta(language="python", path=home)
    rows[1]["source"] = {"event_id": "e2", "user_id": "u2", "path": "src/app.py"}
    rows[1]["meta"] = _meta(language="python", path="src/app.py")
    rows[2]["source"] = {"event_id": "e3", "user_id": "u3", "path": "C:\\Users\\bob.smith\\app.py"}
    rows[2]["meta"] = '{"other":1}'  # no "path" key: meta is left as it is
    batch = pa.RecordBatch.from_pylist(rows, schema=TRAINING_RECORD_V1)
    out = stage_class("scrub_pii")(ner="off", policy={"home_dir_user": "pseudonym"}).build_fn()(batch).to_pylist()
    text, path = out[0]["segments"][0]["text"], out[0]["source"]["path"]
    assert "jane.doe" not in text + path + out[0]["meta"]
    token = path.split("/")[2]
    assert token.startswith("<") and f"/Users/{token}/notes.txt" in text  # one pseudonym for one value
    assert json.loads(out[0]["meta"]) == {"language": "python", "path": path}
    assert out[0]["source"]["event_id"] == "e1" and out[0]["source"]["user_id"] == "u1"
    assert (out[1]["source"], out[1]["meta"]) == (rows[1]["source"] | {k: None for k in ("org_id", "session_id",
                                                  "timestamp", "repo_id", "language")}, rows[1]["meta"])
    assert "bob.smith" not in out[2]["source"]["path"] and out[2]["meta"] == '{"other":1}'
    assert out[3]["source"] is None
    metrics = [json.loads(m) for m in (r["_metrics"] for r in out) if m]
    assert metrics == [{"pii.home_dir_user": 3}]  # jane.doe in the text, in the path, bob.smith in a path
    assert all(r["_drop"] is None for r in out)


def test_large_string_input_gives_the_same_rows() -> None:
    """Engines may hand over large_string columns (polars does); output rows must not change."""
    fn = ScrubPiiConfig(ner="off").build_fn()
    seg_large = pa.list_(pa.struct([("text", pa.large_string()), ("train", pa.bool_()), ("role", pa.large_string())]))
    large = pa.schema([f if f.name != "segments" else pa.field("segments", seg_large) for f in TRAINING_RECORD_V1])
    large = pa.schema([pa.field(f.name, pa.large_string()) if f.type == pa.string() else f for f in large])
    b = _batch()
    got = fn(pa.RecordBatch.from_pylist(b.to_pylist(), schema=large)).to_pylist()
    assert got == fn(b).to_pylist()


def test_scan_of_a_chunked_array_hands_strings_to_ner_and_team_recognizers() -> None:
    """Found in review: a ChunkedArray reached NER as Arrow scalars and a team's recognizers as Arrow."""
    import pyarrow as pa

    from datakit.stages.scrub_pii.detectors import DETECTORS
    from datakit.stages.scrub_pii.replace import Replacer

    seen: dict[str, object] = {}

    class Names:  # stands in for the spaCy scanner: records what it is given
        def add_names(self, texts, prose, found):
            seen["ner"] = [type(t).__name__ for t in texts]
            return found

    class Team:
        def add(self, texts, found):
            seen["extra"] = [type(t).__name__ for t in texts]
            return found

    fn = ScrubFn(DETECTORS, Replacer({}, None), "auto", Names(), Team())
    col = pa.chunked_array([["hi jane@example.org"], ["plain", None]], pa.string())
    found = fn.scan(col, [True, True, False])
    assert [f.entity for f in found[0]] == ["email"]
    assert seen == {"ner": ["str", "str"], "extra": ["str", "str", "NoneType"]}


def test_entropy_is_stable_at_thresholds() -> None:
    from datakit.stages.scrub_pii.detectors import shannon_entropy

    assert shannon_entropy("0123456789abcdef" * 6) == 4.0  # the table form gave 3.9999999999999996


def test_ner_off_unquoted_in_yaml_is_off() -> None:
    """`ner: off`, as the docs write it, is YAML's boolean false: it means off (it was a config error)."""
    from datakit.pipeline import Pipeline

    text = ("name: t\ninput: {path: in.jsonl, format: jsonl, schema: editor_event.v1}\n"
            "stages: [{kind: ingest}, {kind: extract}, {kind: scrub_pii, ner: off}]\n"
            "output: {path: out, format: parquet}\n")
    stage = Pipeline.from_yaml_string(text, base_dir=".").config.stages[2]
    assert stage.ner == "off"
    with pytest.raises(ValueError, match="ner"):  # "on" does not say which NER was meant
        Pipeline.from_yaml_string(text.replace("ner: off", "ner: on"), base_dir=".")


def test_the_language_in_the_lineage_is_scrubbed_like_a_text() -> None:
    """Found in review: `file.language` is whatever the editor sent; an e-mail there reached
    `source.language`, `meta`'s "language", the profile keys of `_run.json` and the report's charts."""
    rows = [_rec("a", "code", [("x = 1", True, "code")]), _rec("b", "code", [("y = 2", True, "code")])]
    rows[0]["source"] = {"event_id": "e1", "user_id": "u1", "language": "jane.roe@example-corp.com", "path": "a.py"}
    rows[0]["meta"] = _meta(language="jane.roe@example-corp.com", path="a.py")
    rows[1]["source"] = {"event_id": "e2", "user_id": "u2", "language": "python", "path": "b.py"}
    rows[1]["meta"] = _meta(language="python", path="b.py")
    batch = pa.RecordBatch.from_pylist(rows, schema=TRAINING_RECORD_V1)
    out = stage_class("scrub_pii")(ner="off").build_fn()(batch).to_pylist()
    assert "jane.roe" not in json.dumps(out[0]["source"]) + out[0]["meta"]
    assert out[0]["source"]["language"] == "<EMAIL>" and json.loads(out[0]["meta"]) == {"language": "<EMAIL>",
                                                                                      "path": "a.py"}
    assert out[1]["source"]["language"] == "python" and out[1]["meta"] == rows[1]["meta"]  # untouched bytes
    assert [json.loads(m) for m in (r["_metrics"] for r in out) if m] == [{"pii.email": 1}]


class _AddColumnsFn:
    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        n = batch.num_rows
        batch = batch.append_column("quality_score", pa.array([0.25] * n, pa.float64()))
        notes = ["reviewed by jane@acme-corp.com" if i == 0 else None for i in range(n)]
        batch = batch.append_column("note", pa.array(notes, pa.string()))
        batch = batch.append_column("_tag", pa.array(["mail jane@acme-corp.com"] * n, pa.string()).dictionary_encode())
        return batch


def _add_columns_stage(extra: pa.Field | None = None):
    from typing import Literal

    from datakit.stages.base import StageConfig

    class AddColumns(StageConfig):
        kind: Literal["test_add_columns"] = "test_add_columns"
        consumes = "training_record.v1"
        produces = "training_record.v1"

        def compile(self, rel, ctx):
            schema = rel.schema.append(pa.field("quality_score", pa.float64())).append(pa.field("note", pa.string()))
            schema = schema.append(pa.field("_tag", pa.dictionary(pa.int32(), pa.string())))
            return rel.map_batches(_AddColumnsFn(), schema if extra is None else schema.append(extra), name="add")

    return AddColumns()


def test_columns_a_custom_stage_added_are_kept_and_their_strings_scrubbed(tmp_path) -> None:
    """Found in review: scrub_pii dropped every column a custom stage had added (docs: "the schema is
    unchanged"), silently, while dedup and the others kept them. They are kept now; a string column is
    scanned like the lineage (an e-mail there would otherwise be published), and a column the scrub
    cannot scan (nested, binary) is refused at compile."""
    from datakit import Pipeline
    from datakit.io.dataset import read_output
    from datakit.pipeline import PipelineError

    (tmp_path / "in").mkdir()
    pq.write_table(pa.Table.from_batches([_batch()]), tmp_path / "in" / "part-0.parquet")

    def pipeline(stage, out):
        return (Pipeline(name="pii", seed=0)
                .input(str(tmp_path / "in" / "*.parquet"), format="parquet", schema="training_record.v1")
                .add(stage).add({"kind": "scrub_pii", "ner": "off"}).output(str(out)))

    res = pipeline(_add_columns_stage(), tmp_path / "out").run(workers=1)
    table = read_output(str(tmp_path / "out"))
    assert table.column_names[-3:] == ["quality_score", "note", "_tag"]
    # a `_`-named and dictionary-encoded column too (found in a later review: both passed through unscanned)
    assert set(table.column("_tag").to_pylist()) == {"mail <EMAIL>"}
    assert set(table.column("quality_score").to_pylist()) == {0.25}
    notes = [x for x in table.column("note").to_pylist() if x]
    assert notes == ["reviewed by <EMAIL>"]
    assert res.stage("scrub_pii")["metrics"]["pii.email"] == 2 + len(_records())  # segment, note, every _tag
    with pytest.raises(PipelineError, match=r"scrub_pii cannot scan column 'tags' \(list<item: string>\)"):
        pipeline(_add_columns_stage(pa.field("tags", pa.list_(pa.string()))), tmp_path / "out2").compile()
    with pytest.raises(PipelineError, match=r"scrub_pii cannot scan column 'blob' \(fixed_size_binary"):
        pipeline(_add_columns_stage(pa.field("blob", pa.binary(8))), tmp_path / "out3").compile()


def test_values_after_a_written_out_escape_are_scrubbed_and_the_escape_kept() -> None:
    """Found in review: extract renders a tool call's arguments with json.dumps, so each line an agent wrote
    into a file starts after a `\\n` escape, and a token boundary after its `n` failed: keys, addresses,
    JWTs, card numbers starting a line reached the output. They are found now, and the escape survives
    the replacement (`\\t<EMAIL>`, not `\\<EMAIL>`)."""
    from datakit.stages.scrub_pii.stage import ScrubPiiConfig

    fn = ScrubPiiConfig(ner="off").build_fn()
    args = json.dumps({"path": ".env.example", "content": "# OpenAI\nsk-proj-Zq8mV3xK7pL2nR5tW9yB4cF6hJ1dG0sA8eQ3uI7oP2kM5"
                       "\n# db host\n10.23.45.67\n\tjane.doe@example.com\n4111 1111 1111 1111\n"})
    out = fn.scrub([args])[0][0]
    assert json.loads(out)["content"] == ("# OpenAI\n<API_KEY>\n# db host\n<IP_ADDRESS>\n\t<EMAIL>\n<CREDIT_CARD>\n")


def test_repo_id_commit_and_tool_names_are_scrubbed_like_the_path() -> None:
    """Found in a hostile-input review: a token in a repository URL's query (`source.repo_id`), an e-mail and
    an AWS key sent as the commit (`meta.commit`) and an e-mail as a tool's name (`meta.tool_names`)
    reached the output; only `path` and `language` were read. Other meta keys keep their bytes."""
    from datakit.stages.scrub_pii.stage import ScrubPiiConfig

    src = {"event_id": "e1", "user_id": "u1", "org_id": "o", "session_id": "s", "timestamp": "2026-11-01T00:00:00.000Z",
           "repo_id": "https://github.com/o/r?access_token=ghp_Zx9Kq2Lm4Np6Rs8Tv0Wy1Ab3Cd5Ef7Gh9Ij2K",
           "language": "python", "path": "src/app.py"}
    meta = json.dumps({"commit": "zelda.quux@hostile-example.org AKIAQWERTYUIOPASDFGH", "turns": 1,
                       "tool_names": ["read_file", "mail_zelda.quux@hostile-example.org"]}, sort_keys=True,
                      separators=(",", ":"))
    clean = json.dumps({"commit": "4f2a9c1", "tool_names": ["read_file"]}, sort_keys=True, separators=(",", ":"))
    rows = [{**_rec("a", "sft", [("hello", True, "assistant")]), "source": src, "meta": meta},
            {**_rec("b", "sft", [("hi", True, "assistant")]), "source": {**src, "repo_id": "o/r"}, "meta": clean}]
    out = ScrubPiiConfig(ner="off").build_fn()(pa.RecordBatch.from_pylist(rows, schema=TRAINING_RECORD_V1)).to_pylist()
    assert out[0]["source"]["repo_id"] == "https://github.com/o/r?access_token=<GITHUB_TOKEN>"
    m = json.loads(out[0]["meta"])
    assert m["commit"] == "<EMAIL> <AWS_ACCESS_KEY>" and m["tool_names"] == ["read_file", "<EMAIL>"]
    assert m["turns"] == 1 and out[1]["meta"] == clean and out[1]["source"]["repo_id"] == "o/r"
    counts = json.loads(out[0]["_metrics"])
    assert counts["pii.email"] == 2 and counts["pii.aws_access_key"] == 1 and counts["pii.github_token"] == 1


def test_a_secret_cut_by_the_cursor_is_found_in_feedback_and_preference_records() -> None:
    """The prefix ends in `GITHUB_TOKEN = "ghp_aB3dE5gH7jK9` and the completion is the rest of the token: the event's
    FIM record lost it, its feedback record (completion read after the suffix) and its preference pair (chosen read
    alone) kept it (found in review). A feedback record reads prefix, completion, suffix as one file now; a pair
    whose completion starts inside a secret is dropped."""
    prefix, rest = 'GITHUB_TOKEN = "ghp_aB3dE5gH7jK9', 'mN1pQ3sT5vW7yZ9bC1dE3fG5"'
    rows = [_rec("fb", "feedback", [(prefix, False, "prefix"), ("\nprint(1)\n", False, "suffix"), (rest, True, "completion")]),
            _rec("pr", "preference", [(prefix, False, "prompt")], chosen=rest, rejected='xyz"'),
            _rec("ok", "preference", [("x = ", False, "prompt")], chosen="1", rejected="2")]
    out = ScrubPiiConfig(ner="off").build_fn()(pa.RecordBatch.from_pylist(rows, schema=TRAINING_RECORD_V1)).to_pylist()
    assert "mN1pQ3sT5vW7" not in json.dumps(out[0]["segments"]) and out[0]["_drop"] is None
    assert out[1]["_drop"] == "pii:github_token" and out[2]["_drop"] is None
