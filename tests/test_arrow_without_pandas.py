"""pyarrow without its pandas import in datakit's own processes (datakit/arrow_without_pandas.py).

Each check runs in a fresh interpreter: whether pyarrow has looked for pandas is process-wide state.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pyarrow as pa
import pytest

from datakit import workers


def _fresh(code: str) -> dict:
    """Run `code` in a new interpreter; it prints one JSON line as its last output."""
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_arrow_calls_no_longer_import_pandas():
    got = _fresh("""
        import json, sys
        import numpy as np, pyarrow as pa, pyarrow.compute as pc
        from datakit.arrow_without_pandas import defer_pandas
        took = defer_pandas()
        a = pa.array([3, 1, 2]); b = pa.array(np.arange(3)); t = pc.take(a, pa.array(np.array([2, 0])))
        print(json.dumps({"took": took, "pandas": "pandas" in sys.modules, "take": t.to_pylist()}))
    """)
    assert got == {"took": True, "pandas": False, "take": [2, 3]}


def test_importing_pandas_later_restores_pandas_conversions():
    """What a quality suite or a user's function does after the probe: pandas objects convert as usual."""
    got = _fresh("""
        import json, sys
        import importlib.util, pyarrow as pa
        from datakit.arrow_without_pandas import defer_pandas
        defer_pandas(); pa.array([1])
        importlib.util.find_spec("pandas")  # an availability check imports nothing and must not disarm
        import pandas as pd
        s = pa.array(pd.Series([1, None], dtype="Int64"))
        c = pa.array(pd.Categorical(["a", "b", "a"]))
        t = pa.Table.from_pandas(pd.DataFrame({"x": [1.5, None]}))
        print(json.dumps({"series": [str(s.type), s.null_count], "categorical": str(c.type),
                          "table": t.column("x").to_pylist(), "roundtrip": t.to_pandas()["x"].iloc[0]}))
    """)
    assert got == {"series": ["int64", 1], "categorical": "dictionary<values=string, indices=int8, ordered=0>",
                   "table": [1.5, None], "roundtrip": 1.5}


def test_to_pandas_first_still_works():
    """pyarrow imports pandas itself (to_pandas) after the probe: the result is a real DataFrame."""
    got = _fresh("""
        import json, sys
        import pyarrow as pa
        from datakit.arrow_without_pandas import defer_pandas
        defer_pandas()
        df = pa.table({"a": [1, 2]}).to_pandas()
        import pandas as pd
        print(json.dumps({"frame": type(df).__name__, "sum": int(df["a"].sum()),
                          "series": str(pa.array(pd.Series([1, None], dtype="Int64")).type)}))
    """)
    assert got == {"frame": "DataFrame", "sum": 3, "series": "int64"}


def test_nothing_to_do_once_pandas_is_imported():
    got = _fresh("""
        import json
        import pandas, pyarrow as pa
        from datakit.arrow_without_pandas import defer_pandas
        print(json.dumps({"took": defer_pandas()}))
    """)
    assert got == {"took": False}


def _arrow_work_imports_pandas() -> bool:
    import sys

    import numpy as np
    import pyarrow.compute as pc

    pc.take(pa.array([1, 2, 3]), pa.array(np.array([0, 2])))
    return "pandas" in sys.modules


def test_pool_workers_do_not_import_pandas_for_arrow_work():
    assert workers.pool(1).submit(_arrow_work_imports_pandas).result(timeout=120) is False


def test_spark_worker_setup_defers_pandas():
    """The Spark chain's per-worker set-up, in a fresh interpreter (a Python worker as pyspark's daemon
    starts it): Arrow work after it imports no pandas. Deterministic, unlike the test on the shared
    session below, whose reused workers may have pandas from earlier jobs."""
    got = _fresh("""
        import json, sys
        import numpy as np, pyarrow as pa, pyarrow.compute as pc
        from datakit.engines.spark import _worker_setup
        from datakit.logs import worker_config
        before = "pandas" in sys.modules
        _worker_setup(worker_config())
        pc.take(pa.array([1, 2, 3]), pa.array(np.array([0, 2])))
        print(json.dumps({"before": before, "after": "pandas" in sys.modules}))
    """)
    assert got == {"before": False, "after": False}


def _spark_worker_pandas(batches):
    """mapInArrow body: the Spark chain's per-worker set-up, then Arrow work; reports pandas' state
    before the set-up and after the work."""
    import sys

    from datakit.engines.spark import _worker_setup
    from datakit.logs import worker_config

    before = "pandas" in sys.modules
    _worker_setup(worker_config())
    for b in batches:
        _arrow_work_imports_pandas()
        yield pa.record_batch({"before": pa.array([before] * b.num_rows),
                               "after": pa.array(["pandas" in sys.modules] * b.num_rows)})


@pytest.mark.spark
@pytest.mark.fresh_spark_workers
def test_spark_python_workers_do_not_import_pandas_for_arrow_work(spark):
    """A worker that had no pandas before the chain's set-up has none after Arrow work. Python
    workers are reused across the session's jobs, and one that an earlier test's job gave pandas
    has nothing to defer (the set-up leaves it alone), so only fresh ones are judged: the mark puts
    this test before every other Spark test (tests/conftest.py), where the skip below should not happen."""
    rows = spark.range(4).repartition(2).mapInArrow(_spark_worker_pandas, "before boolean, after boolean").collect()
    fresh = [r for r in rows if not r["before"]]
    if not fresh:
        pytest.skip("every Python worker of this session had imported pandas before this test")
    assert len(rows) == 4 and {r["after"] for r in fresh} == {False}
