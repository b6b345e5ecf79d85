"""The `decontaminate` stage: drop and mask modes on batches, the YAML form, and pipelines on both engines."""
from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datakit import Pipeline
from datakit.contracts import TRAINING_RECORD_V1
from datakit.pipeline import PipelineError
from datakit.plan import DROP, DROP_DETAIL
from datakit.stages.decontaminate.matcher import Rule
from datakit.stages.decontaminate.stage import DecontaminateConfig
from tests.conformance import assert_conformant, spark_variants
from tests.stages.test_decontam import he_rows, record  # noqa: F401  (fixture)


def _mbpp_like(tmp_path) -> str:
    p = tmp_path / "evals" / "tiny.jsonl"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps({"task_id": "T1", "code": "def zigzag_merge(left, right):\n    out = []\n    while left and right:\n"
                             "        out.append(left.pop(0) if left[0] < right[0] else right.pop(0))\n"
                             "    return out + left + right\n"}) + "\n")
    return str(p)


@pytest.fixture(scope="module")
def rows(he_rows):  # noqa: F811
    return [
        record("a-clean", "def add(a, b):\n    return a + b\n"),
        record("b-he0", "# utils\n" + he_rows[0]["prompt"] + he_rows[0]["canonical_solution"] + "\n\nprint('done')\n"),
        record("c-clean", "for i in range(len(x)):\n    total += x[i]\n"),
        record("d-tiny", "x = 1\nprint('hello')\n" + "def zigzag_merge(left, right):\n    out = []\n    while left and right:\n"
               "        out.append(left.pop(0) if left[0] < right[0] else right.pop(0))\n    return out + left + right\n"),
        record("e-both", he_rows[12]["prompt"] + he_rows[12]["canonical_solution"] + "\ndef zigzag_merge(left, right):\n"
               "    out = []\n    while left and right:\n        out.append(left.pop(0) if left[0] < right[0] else "
               "right.pop(0))\n    return out + left + right\n"),
    ]


def test_drop_mode_reasons_and_details(tmp_path, rows):
    cfg = DecontaminateConfig(evals=["humaneval", _mbpp_like(tmp_path)])
    fn = cfg.build_fn()
    out = fn(pa.Table.from_pylist(rows, schema=TRAINING_RECORD_V1).to_batches()[0])
    got = dict(zip(out.column("doc_id").to_pylist(), zip(out.column(DROP).to_pylist(), out.column(DROP_DETAIL).to_pylist())))
    assert got["a-clean"] == (None, None) and got["c-clean"] == (None, None)
    assert got["b-he0"] == ("contaminated:humaneval", '{"humaneval":["HumanEval/0"]}')
    assert got["d-tiny"] == ("contaminated:tiny", '{"tiny":["T1"]}')
    # matches two evals: the reason names the first in config order, the detail lists both
    assert got["e-both"] == ("contaminated:humaneval", '{"humaneval":["HumanEval/12"],"tiny":["T1"]}')


def test_mask_mode_removes_the_overlap_and_keeps_the_rest(tmp_path, rows):
    cfg = DecontaminateConfig(evals=["humaneval", _mbpp_like(tmp_path)], mode="mask", mask_with="<MASKED>")
    fn = cfg.build_fn()
    out = fn(pa.Table.from_pylist(rows, schema=TRAINING_RECORD_V1).to_batches()[0])
    assert DROP not in out.schema.names
    texts = {d: s[0]["text"] for d, s in zip(out.column("doc_id").to_pylist(), out.column("segments").to_pylist())}
    assert texts["a-clean"] == rows[0]["segments"][0]["text"]
    assert texts["b-he0"].startswith("# utils\n") and texts["b-he0"].endswith("print('done')\n")
    assert "has_close_elements" not in texts["b-he0"] and "<MASKED>" in texts["b-he0"]
    assert texts["d-tiny"].startswith("x = 1\nprint('hello')\n") and "zigzag" not in texts["d-tiny"]
    # a masked record no longer matches
    again = fn(out.drop_columns(["_metrics"]))
    assert json.loads(again.column("_metrics")[0].as_py() or "{}") == {}
    metrics = json.loads(out.column("_metrics")[0].as_py())
    assert metrics == {"decontam.masked": 3, "decontam.masked:humaneval": 2, "decontam.masked:tiny": 2}


def test_mask_mode_rewrites_preference_answers_and_declares_every_column_it_changes(he_rows):  # noqa: F811
    leak = he_rows[0]["prompt"] + he_rows[0]["canonical_solution"]
    pref = {**record("p-pref", "Write has_close_elements."), "kind": "preference",
            "chosen": leak, "rejected": "def f():\n    return 1\n"}
    batch = pa.Table.from_pylist([pref], schema=TRAINING_RECORD_V1).to_batches()[0]
    cfg = DecontaminateConfig(evals=["humaneval"], mode="mask", mask_with="<MASKED>")
    out = cfg.build_fn()(batch)
    changed = {n for n in batch.schema.names if out.column(n).to_pylist() != batch.column(n).to_pylist()}
    assert changed == {"chosen"}, changed  # the leaked answer is masked, the rest is untouched
    assert "<MASKED>" in out.column("chosen")[0].as_py()
    assert changed <= set(DecontaminateConfig.writes)


def test_mask_mode_masks_a_leak_written_as_escaped_json(he_rows):  # noqa: F811
    """Found in review: a chat message holding `json.dumps(HumanEval row)` matched in its decoded copy, whose
    byte spans are not the text's, so mask mode left the leak in place and a later check flagged it (28%).
    The string holding it is masked whole; the record's other texts stay."""
    leak = json.dumps(he_rows[100])
    rec = {**record("chat", "hi"), "kind": "sft",
           "segments": [{"text": "please store this item", "train": False, "role": "user"},
                        {"text": "Stored:\n" + leak, "train": True, "role": "assistant"}]}
    batch = pa.Table.from_pylist([rec], schema=TRAINING_RECORD_V1).to_batches()[0]
    cfg = DecontaminateConfig(evals=["humaneval"], mode="mask", mask_with="<MASKED>")
    out = cfg.build_fn()(batch)
    segs = out.column("segments")[0].as_py()
    assert segs[0]["text"] == "please store this item" and segs[1]["text"] == "<MASKED>"
    assert json.loads(out.column("_metrics")[0].as_py()) == {"decontam.masked": 1, "decontam.masked:humaneval": 1}
    again = cfg.build_fn()(out.drop_columns(["_metrics"]))
    assert json.loads(again.column("_metrics")[0].as_py() or "{}") == {}  # nothing left to find


def test_config_validation_and_yaml(tmp_path):
    ev = _mbpp_like(tmp_path)
    p = Pipeline.from_yaml_string(
        "name: d\ninput: {path: x.parquet, format: parquet, schema: training_record.v1}\n"
        f"stages:\n  - {{kind: decontaminate, evals: [humaneval, {ev}], ngram: 13, mode: drop}}\n")
    cfg = p.config.stages[0]
    assert cfg.evals == ["humaneval", ev] and cfg.ngram == 13 and cfg.rule() == Rule(1, 0.03, 6, 0.12)  # measured defaults
    assert Pipeline.from_yaml_string(p.to_yaml()) == p
    assert DecontaminateConfig(evals=["humaneval"], normalizations=["identifiers"]).rule().min_fraction == 0.10
    with pytest.raises(PipelineError, match="normalizations"):
        Pipeline("t").add({"kind": "decontaminate", "evals": ["humaneval"], "normalizations": ["spaces"]})
    with pytest.raises(PipelineError, match="mode"):
        Pipeline("t").add({"kind": "decontaminate", "evals": ["humaneval"], "mode": "erase"})
    with pytest.raises(Exception, match="unique"):
        DecontaminateConfig(evals=["humaneval", "humaneval"]).build_fn()


def _pipeline(tmp_path, rows, mode="drop", shards=2):
    inp = tmp_path / "in"
    inp.mkdir(exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows[::2], schema=TRAINING_RECORD_V1), str(inp / "part-0.parquet"))
    pq.write_table(pa.Table.from_pylist(rows[1::2], schema=TRAINING_RECORD_V1), str(inp / "part-1.parquet"))
    return (Pipeline("decontam", seed=0).input(str(inp), format="parquet", schema="training_record.v1")
            .add({"kind": "decontaminate", "evals": ["humaneval", _mbpp_like(tmp_path)], "mode": mode})
            .output(str(tmp_path / "out"), format="parquet", shards=shards))


def test_pipeline_local_engine_counts_and_drop_log(tmp_path, rows):
    res = _pipeline(tmp_path, rows).run(engine="local", workers=1)
    st = res.stage("decontaminate")
    assert st["rows_in"] == 5 and st["rows_out"] == 2
    assert st["dropped"] == {"contaminated:humaneval": 2, "contaminated:tiny": 1}
    run = json.loads((tmp_path / "out" / "_run.json").read_text())
    assert any(s["dropped"] == st["dropped"] for s in run["stages"])
    dropped = pq.read_table(tmp_path / "out" / "_dropped").to_pylist()
    assert {d["key"]: d["detail"] for d in dropped}["b-he0"] == '{"humaneval":["HumanEval/0"]}'
    # the output is clean: the check agrees
    from datakit.stages.decontaminate.check import check

    assert check(str(tmp_path / "out"), ["humaneval"]).exit_code == 0


def test_pipeline_mask_mode_local_is_deterministic(tmp_path, rows):
    """Same bytes in-process and with a 2-process pool (the eval table travels pickled to the workers)."""
    from datakit.io.sinks import output_checksums

    p = _pipeline(tmp_path, rows, mode="mask")
    res = p.run(engine="local", workers=1, output=str(tmp_path / "w1"))
    p.run(engine="local", workers=2, output=str(tmp_path / "w2"))
    assert output_checksums(str(tmp_path / "w1")) == output_checksums(str(tmp_path / "w2"))
    st = res.stage("decontaminate")
    assert st["rows_in"] == st["rows_out"] == 5 and not st["dropped"]
    assert st.get("metrics", {}).get("decontam.masked") == 3


@pytest.mark.spark
def test_pipeline_on_spark_matches_local(tmp_path, rows, spark):
    p = _pipeline(tmp_path, rows)
    assert_conformant(p, tmp_path, variants=[("local", {"workers": 1})] + spark_variants((1, 3)))


def test_eval_paths_resolve_against_the_pipeline_file(tmp_path, rows):
    """`evals: [tiny=evals/tiny.jsonl]` in a pipeline file means relative to that file, named `tiny`."""
    _mbpp_like(tmp_path)
    (tmp_path / "p.yaml").write_text(
        "name: d\ninput: {path: in, format: parquet, schema: training_record.v1}\n"
        "stages:\n  - {kind: decontaminate, evals: [humaneval, 'mine=evals/tiny.jsonl']}\n"
        "output: {path: out, format: parquet}\n")
    (tmp_path / "in").mkdir()
    pq.write_table(pa.Table.from_pylist(rows, schema=TRAINING_RECORD_V1), str(tmp_path / "in" / "p.parquet"))
    res = Pipeline.from_yaml(tmp_path / "p.yaml").run(engine="local", workers=1)
    assert res.stage("decontaminate")["dropped"] == {"contaminated:humaneval": 2, "contaminated:mine": 1}


def test_compiled_stage_uses_the_check_s_views_and_records_the_reference(tmp_path, he_rows):  # noqa: F811
    """The pipeline stage decides like the check: a renamed copy is dropped, and the reference corpus it
    used is recorded (manifest + config hash)."""
    from datakit.contracts import TRAINING_RECORD_V1 as T
    from datakit.plan import source
    from datakit.stages.base import CompileContext
    from tests.support.plant import rename_identifiers
    import random

    ctx = CompileContext(stage="decontaminate")
    rel = DecontaminateConfig(evals=["humaneval"]).compile(source([str(tmp_path)], "parquet", T, "training_record.v1"), ctx)
    fn = rel.node.fn
    assert len(fn.table.views) == 3 and ctx.environment["stages"]["decontaminate"]["reference"]["name"] == "stdlib"
    text = rename_identifiers(he_rows[3]["prompt"] + he_rows[3]["canonical_solution"], random.Random(1))
    out = fn(pa.Table.from_pylist([record("r", text)], schema=T).to_batches()[0])
    assert out.column(DROP).to_pylist() == ["contaminated:humaneval"]
