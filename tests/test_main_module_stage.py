"""A stage defined in `__main__` (a notebook cell, `python -c`) runs on the local engine's worker pool:
its batch function travels by value (`plan.ByValue`), as Spark ships it. Found in review: every pool
worker died unpickling it, reported as "out of memory", while the same cell ran in-process and on Spark."""
from __future__ import annotations

import json
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq

from datakit.contracts import TRAINING_RECORD_V1
from datakit.plan import ByValue, by_value_if_main

NOTEBOOK_CELL = '''
import json, sys
from typing import Literal
import pyarrow as pa, pyarrow.compute as pc
from datakit import Pipeline, StageConfig, register_stage, record_texts
from datakit.contracts import TRAINING_RECORD_V1

LIMIT = 40  # a global of the cell: travels with the function

class DropLong:
    def __call__(self, batch):
        long_ = pc.greater(pc.utf8_length(record_texts(batch)), LIMIT)
        return batch.append_column("_drop", pc.if_else(long_, pa.scalar("too_long"), pa.scalar(None, pa.string())))

@register_stage
class NbDropLong(StageConfig):
    kind: Literal["nb_drop_long"] = "nb_drop_long"
    def compile(self, rel, ctx):
        return rel.map_batches(DropLong(), TRAINING_RECORD_V1, name="nb_drop_long", drop_log_key="doc_id")

src, out = sys.argv[1], sys.argv[2]
r = (Pipeline("nb").input(src, format="parquet", schema="training_record.v1").add(NbDropLong())
     .output(out, shards=2).run(workers=2))
print(json.dumps({"workers": r.extra["workers"], "stage": r.stages[-1]}))
'''


def _records(n: int) -> pa.Table:
    rows = [{"doc_id": f"d{i:03d}", "kind": "code",
             "segments": [{"text": "x" * (10 + 7 * i), "train": True, "role": None}]} for i in range(n)]
    return pa.Table.from_pylist(rows, schema=TRAINING_RECORD_V1)


def test_a_stage_defined_in_main_runs_on_the_pool(tmp_path):
    for part in range(2):  # two files: two tasks, so the pool is used
        pq.write_table(_records(12).slice(part * 6, 6), tmp_path / f"in-{part}.parquet")
    code = f"exec({NOTEBOOK_CELL!r})"  # `python -c`: a __main__ without a file, as in a notebook
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "in-*.parquet"), str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    long_docs = sum(1 for i in range(12) if 10 + 7 * i > 40)
    assert got["workers"] == 2
    assert got["stage"]["rows_in"] == 12 and got["stage"]["dropped"] == {"too_long": long_docs}
    assert pq.read_table(tmp_path / "out" / "data").num_rows == 12 - long_docs


class _Importable:
    def __call__(self, batch):
        return batch


def test_only_functions_of_main_are_wrapped():
    assert by_value_if_main(_Importable()).__class__ is _Importable
    fn = _Importable()
    fn.__class__ = type("InMain", (), {"__module__": "__main__", "__call__": lambda self, b: b,
                                       "setup": lambda self: "ready"})
    wrapped = by_value_if_main(fn)
    assert isinstance(wrapped, ByValue) and by_value_if_main(wrapped) is wrapped
    assert wrapped.setup() == "ready" and wrapped(3) == 3  # attributes and calls reach the function
