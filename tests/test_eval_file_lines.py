"""An eval file's JSON Lines end at "\\n" only, as the input logs' do.

Found in review: the reader split with `str.splitlines`, which also splits at U+2028, U+2029 and U+0085;
JSON writes those raw inside strings (`json.dumps(..., ensure_ascii=False)`), so a valid two-line eval
file whose prompt held a U+2028 was refused as "line 1: not valid JSON" (exit 2, by `contamination-check`
and by the decontaminate stage alike). A byte-order mark at its start is read past, as for logs.
"""
from __future__ import annotations

import json

import pytest

from datakit.stages.decontaminate.evals import _read_rows

ROWS = [{"task_id": "t0", "prompt": "def add(a, b):\n    \"\"\"Add.\u2028Return the sum.\"\"\"\n", "canonical_solution": "    return a + b\n"},
        {"task_id": "t1", "prompt": "def sub(a, b):  # minus\x85sign\u2029\n", "canonical_solution": "    return a - b\n"}]


@pytest.mark.parametrize("eol", ["\n", "\r\n"])
@pytest.mark.parametrize("bom", ["", "\ufeff"])
def test_separators_inside_strings_do_not_end_a_line(tmp_path, eol, bom):
    path = tmp_path / "mybench.jsonl"
    path.write_text(bom + "".join(json.dumps(r, ensure_ascii=False) + eol for r in ROWS), encoding="utf-8", newline="")
    assert _read_rows(str(path)) == ROWS
