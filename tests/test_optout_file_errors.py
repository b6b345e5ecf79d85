"""An opt-out Parquet file that cannot be read as one: one line naming the file and the problem, exit 2.

Found in a hostile-input review: pyarrow's own text reached the user, without the file's name ("Invalid
UTF8 payload") or with the whole schema (an id column given twice).
"""
from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from datakit.cli import app
from tests.eventgen import make_event, write_jsonl


def _lists(folder):
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table([pa.array(["u1"]), pa.array(["u2"])], names=["user_id", "user_id"]), folder / "dup.parquet")
    pq.write_table(pa.table({"user_id": pa.array([b"\xff\xfeab"], pa.binary())}), folder / "utf8.parquet")
    (folder / "text.parquet").write_bytes(b"user_id\nu1\n")
    return {"dup": "an id column appears more than once", "utf8": "an id column holds bytes that are not UTF-8",
            "text": "not a Parquet file"}


@pytest.mark.parametrize("name", ["dup", "utf8", "text"])
def test_an_unreadable_optout_list_is_one_line_naming_it(tmp_path, name):
    expected = _lists(tmp_path / "lists")[name]
    write_jsonl(tmp_path / "logs" / "a.jsonl", [make_event(i) for i in range(5)])
    (tmp_path / "p.yaml").write_text(
        "name: p\ninput: {path: logs}\nstages: [{kind: ingest}, "
        f"{{kind: consent, optouts: lists/{name}.parquet}}]\noutput: {{path: out}}\n")
    r = CliRunner().invoke(app, ["run", str(tmp_path / "p.yaml"), "--quiet", "--no-report", "--workers", "1"])
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("datakit: error:")]
    assert r.exit_code == 2 and len(lines) == 1, r.stderr
    assert f"lists/{name}.parquet" in lines[0] and expected in lines[0], lines[0]
    assert "user_id: string" not in lines[0] and "u1" not in lines[0]


def test_a_column_of_another_type_is_not_called_bad_utf8(tmp_path):
    """Found in review: any pyarrow text naming 'utf8' (a list<string> id column: 'Unsupported cast ... to
    utf8') was reported as bytes that are not UTF-8."""
    from datakit.io.fs import InputError
    from datakit.stages.consent import read_id_lists

    pq.write_table(pa.table({"user_id": pa.array([["u1", "u2"]])}), tmp_path / "lists.parquet")
    with pytest.raises(InputError) as e:
        read_id_lists([str(tmp_path / "lists.parquet")])
    assert "not UTF-8" not in str(e.value) and "lists.parquet" in str(e.value)
