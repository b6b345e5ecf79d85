"""`feedback` records, the retention self-join, the `kto` stage and its reward report.

Ground truth: synthetic repository projects (`generate(repositories=N)`) say for
every completion its outcome, accepted share and whether the accepted text
survived to the next event on the file; labels and rewards must follow from
that under each policy, on the local engine and (lean) on Spark.
"""
from __future__ import annotations

import json

import jsonschema
import pytest

from datakit import Pipeline
from datakit.contracts import load_contract
from datakit.io.dataset import read_output
from datakit.stages.extract.feedback import FeedbackOptions, reward_of
from datakit.synth import generate, read_ground_truth


def _ev(outcome, suggestion="return a + b\n", accepted=None):
    return {"outcome": outcome, "suggestion": suggestion, "accepted_text": accepted}


def test_reward_policies_on_hand_written_events():
    o = FeedbackOptions()
    assert reward_of(_ev("accepted"), o, None) == (1.0, None)
    assert reward_of(_ev("rejected"), o, None) == (0.0, None)
    assert reward_of(_ev("partial", accepted="return a"), o, None) == (round(8 / 13, 6), None)
    assert reward_of(_ev("ignored"), o, None) == (None, "no_example:ignored")
    assert reward_of(_ev(None), o, None) == (None, "no_example:no_outcome")
    neg = FeedbackOptions(partial="negative", ignored="negative")
    assert reward_of(_ev("partial", accepted="return a"), neg, None) == (0.0, None)
    assert reward_of(_ev("ignored"), neg, None) == (0.0, None)
    assert reward_of(_ev("partial", accepted="r"), FeedbackOptions(partial="drop"), None) == (None, "no_example:partial")
    gate = FeedbackOptions(retention={"use": "gate"})
    weight = FeedbackOptions(retention={"use": "weight", "weight": 0.25})
    report = FeedbackOptions(retention={"use": "report"})
    assert reward_of(_ev("accepted"), gate, False) == (0.0, None)
    assert reward_of(_ev("accepted"), gate, None) == (1.0, None)  # unknown retention changes nothing
    assert reward_of(_ev("accepted"), weight, False) == (0.25, None)
    assert reward_of(_ev("accepted"), weight, True) == (1.0, None)
    assert reward_of(_ev("accepted"), report, False) == (1.0, None)


@pytest.fixture(scope="module")
def projects(tmp_path_factory):
    logs = tmp_path_factory.mktemp("fb") / "logs"
    generate(logs, events=40, seed=3, days=1, repositories=4)
    return logs


def _pipeline(logs, feedback: dict, kto: bool = False) -> Pipeline:
    p = (Pipeline("feedback", seed=0).input(str(logs / "dt=*" / "*.jsonl.zst")).add({"kind": "ingest"})
         .add({"kind": "consent", "optouts": str(logs / "optouts.parquet")})
         .add({"kind": "extract", "kinds": ["feedback"], "feedback": feedback}))
    return p.add({"kind": "kto"}) if kto else p


def _expected(g: dict, o: FeedbackOptions) -> tuple[float | None, bool | None]:
    """(reward, retained) the ground truth implies under options `o` (None reward: dropped)."""
    window = o.retention.window_s * 1000 if o.retention else None
    retained = g["retained"] if window is not None and g["gap_ms"] is not None and g["gap_ms"] <= window else None
    if g["outcome"] in ("partial", "ignored") and (o.partial if g["outcome"] == "partial" else o.ignored) == "drop":
        return None, retained
    share = g["accepted_chars"] / g["suggestion_chars"] if g["outcome"] == "partial" and o.partial == "fraction" else 0.0
    reward = {"accepted": 1.0, "rejected": 0.0}.get(g["outcome"], share)
    if retained is False and o.retention is not None and reward > 0:
        reward = {"gate": 0.0, "weight": reward * o.retention.weight, "report": reward}[o.retention.use]
    return round(reward, 6), retained


@pytest.mark.parametrize("feedback", [
    {"retention": {"window_s": 600, "use": "gate"}, "ignored": "negative"},
    {"partial": "drop", "label_threshold": 0.3, "retention": {"window_s": 20, "use": "weight", "weight": 0.4}},
])
def test_labels_rewards_and_retention_match_the_synth_ground_truth(projects, tmp_path, feedback):
    opts = FeedbackOptions(**feedback)
    res = _pipeline(projects, feedback).run(output=str(tmp_path / "out"), workers=1)
    rows = {r["source"]["event_id"]: r for r in read_output(str(tmp_path / "out")).to_pylist()}
    truth = read_ground_truth(projects, "feedback")
    assert {g["outcome"] for g in truth} == {"accepted", "partial", "rejected", "ignored"}
    seen_retained = set()
    for g in truth:
        reward, retained = _expected(g, opts)
        r = rows.get(g["event_id"])
        if reward is None:
            assert r is None, g
            continue
        meta = json.loads(r["meta"])
        assert r["kind"] == "feedback" and meta["outcome"] == g["outcome"] and meta["latency_ms"] == g["latency_ms"]
        assert meta["reward"] == reward and meta["label"] == (reward >= opts.label_threshold), (g, meta)
        assert meta.get("retained") == retained, (g, meta)
        if retained is not None:
            assert meta["next_event_id"] == g["next_event_id"] and meta["retention_gap_ms"] == g["gap_ms"]
        seen_retained.add(retained)
        assert [s["role"] for s in r["segments"]] == ["prefix", "suffix", "completion"]
    assert seen_retained == {True, False, None}
    ex = next(s for s in res.stages if s["name"] == "extract")
    assert ex["rows_in"] == ex["rows_out"] + sum(ex["dropped"].values())


def test_kto_output_and_reward_report(projects, tmp_path):
    out = tmp_path / "kto"
    res = _pipeline(projects, {"ignored": "negative"}, kto=True).output(str(out), quality=True).run(workers=1)
    assert res.extra["quality"]["suite"] == "kto_example.v1" and res.extra["quality"]["success"], res.extra["quality"]
    t = read_output(str(out))
    assert t.schema.names[:4] == ["prompt", "completion", "label", "reward"]
    assert str(t.schema.field("label").type) == "bool" and str(t.schema.field("prompt").type) == "string"
    rows = t.to_pylist()
    assert rows and all(r["prompt"].endswith("<fim_middle>") for r in rows)
    for r in rows:  # an inline edit's instruction, then the code it replaces, come before the FIM context
        if json.loads(r["meta"])["event_type"] == "tab_completion":
            assert r["prompt"].startswith("<fim_prefix>")
            continue
        selection = r["prompt"].split("\n", 1)[1].split("<fim_prefix>", 1)[0]
        assert selection.endswith("\n") and selection.strip()
    assert {r["label"] for r in rows} == {True, False}
    report = json.loads((out / "_reports" / "feedback.json").read_text())
    jsonschema.validate(report, load_contract("feedback_report.v1"))
    kto_doc = load_contract("kto_example.v1")
    assert list(kto_doc["properties"]) == t.schema.names
    assert json.loads((out / "_run.json").read_text())["reports"]["feedback"] == "_reports/feedback.json"
    assert res.extra["feedback"]["total"] == report["total"]
    assert report["total"]["examples"] == len(rows)
    assert report["total"]["accepted"] == sum(1 for r in rows if json.loads(r["meta"])["outcome"] == "accepted")
    for group in ("by_language", "by_completion_chars", "by_latency_ms"):
        assert sum(g["examples"] for g in report[group]) == len(rows)
    py = next(g for g in report["by_language"] if g["language"] == "python")
    mine = [r for r in rows if r["source"]["language"] == "python"]
    assert py["examples"] == len(mine)
    assert py["label_rate"] == round(sum(r["label"] for r in mine) / len(mine), 6)


def test_trl_kto_dataset_preparation_reads_the_output(projects, tmp_path):
    """TRL's own KTO preparation (prompt/completion tokenization) runs on our Parquet files as they are."""
    pytest.importorskip("trl")
    import types
    from pathlib import Path

    from datasets import Dataset
    from transformers import PreTrainedTokenizerFast
    from trl import KTOConfig
    from trl.trainer.kto_trainer import KTOTrainer

    out = tmp_path / "kto"
    _pipeline(projects, {}, kto=True).run(output=str(out), workers=1)
    m = json.loads((out / "manifest.json").read_text())
    ds = Dataset.from_parquet([str(out / f) for s in m["shards"] for f in s["files"]])
    tok_file = Path(__file__).resolve().parents[1] / "data" / "tokenizer" / "tokenizer.json"
    tok = PreTrainedTokenizerFast(tokenizer_file=str(tok_file), eos_token="<|endoftext|>")
    args = KTOConfig(output_dir=str(tmp_path / "trl"), max_length=None, report_to=[], use_cpu=True, bf16=False,
                     disable_tqdm=True)
    trainer = types.SimpleNamespace(_tokenizer=tok, calculate_KL=False, desirable_weight=1.0, undesirable_weight=1.0)
    prepared = KTOTrainer._prepare_dataset(trainer, ds, tok, args, "train")
    assert len(prepared) == len(ds)
    fim_prefix, fim_middle = tok.convert_tokens_to_ids(["<fim_prefix>", "<fim_middle>"])
    for ex in prepared.select(range(min(50, len(prepared)))):
        # the prompt ends on the <fim_middle> sentinel, so the completion starts on a token boundary
        assert fim_prefix in ex["prompt_ids"] and ex["prompt_ids"][-1] == fim_middle
        assert tok.decode(ex["completion_ids"]) == ex["completion"]
        assert ex["completion"].endswith("<|endoftext|>")
    assert prepared["label"] == ds["label"]


@pytest.mark.spark
def test_retention_join_is_identical_on_spark(tmp_path, spark):
    """Lean on purpose: two small projects, no consent stage, one Spark partitioning."""
    from tests.conformance import assert_conformant

    logs = tmp_path / "logs"
    generate(logs, events=10, seed=5, days=1, repositories=2, plant_scale=0, malformed_rate=0)
    p = (Pipeline("feedback", seed=0).input(str(logs / "dt=*" / "*.jsonl.zst")).add({"kind": "ingest"})
         .add({"kind": "extract", "kinds": ["feedback"],
               "feedback": {"ignored": "negative", "retention": {"window_s": 60, "use": "weight"}}}))
    sums = assert_conformant(p, tmp_path, variants=[("local", {"workers": 1}), ("spark", {"partitions": 2})])
    assert sums


def test_forget_applies_to_a_kto_output(projects, tmp_path):
    """A later deletion reaches the feedback examples through their lineage, like any record output."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = tmp_path / "kto"
    _pipeline(projects, {}, kto=True).run(output=str(out), workers=1)
    rows = read_output(str(out)).to_pylist()
    victim = sorted({r["source"]["user_id"] for r in rows})[0]
    pq.write_table(pa.table({"user_id": [victim]}), tmp_path / "deletions.parquet")
    m = json.loads((out / "manifest.json").read_text())
    data = [str(out / f) for s in m["shards"] for f in s["files"]]
    res = (Pipeline("forget").input(data, format="parquet", schema="kto_example.v1")
           .add({"kind": "forget", "optouts": str(tmp_path / "deletions.parquet")})
           .output(str(tmp_path / "forgotten"))).run(workers=1)
    kept = read_output(str(tmp_path / "forgotten"))
    assert kept.schema.names[:3] == ["prompt", "completion", "label"]
    gone = sum(1 for r in rows if r["source"]["user_id"] == victim)
    assert gone and kept.num_rows == len(rows) - gone
    assert res.stages[-1]["dropped"] == {"opt_out_user": gone}
