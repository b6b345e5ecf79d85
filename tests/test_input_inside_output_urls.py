"""An input inside the output folder is refused however the output is spelled.

Found in an operations review: the refusal compared the output's text with the input files' text, so
`--output file:///data/in/out` (input `/data/in`) or `--output s3a://bucket/in/out` (input `s3://bucket/in`)
was not recognised as the same folder: the second run withdrew the published dataset (manifest and
`_SUCCESS` gone, its card emptied), then failed with "input file .../README.md changed during the run",
exit 2, the earlier output lost -- what the refusal exists to prevent.
"""
from __future__ import annotations

import subprocess
import sys

from datakit.pipeline import _input_inside
from tests.eventgen import make_event, write_jsonl

DATAKIT = [sys.executable, "-m", "datakit.cli"]


def test_a_file_url_output_over_its_own_input_is_refused_before_the_output_is_touched(tmp_path):
    write_jsonl(tmp_path / "in" / "a.jsonl", [make_event(i) for i in range(5)])
    (tmp_path / "p.yaml").write_text("name: inside\ninput: {path: in}\nstages: [{kind: ingest}]\n"
                                     "output: {path: in/out, shards: 1}\n")
    out = tmp_path / "in" / "out"

    def run(output: str):
        return subprocess.run(DATAKIT + ["run", str(tmp_path / "p.yaml"), "--workers", "1", "-q", "--output", output],
                              capture_output=True, text=True)

    first = run(f"file://{out}")
    assert first.returncode == 0, first.stderr
    before = (out / "manifest.json").read_bytes()
    second = run(f"file://{out}")  # `in` now also holds the first run's README.md and shards
    assert second.returncode == 2 and "is inside the output folder" in second.stderr, second.stderr
    assert (out / "manifest.json").read_bytes() == before and (out / "_SUCCESS").exists()


def test_every_spelling_of_one_folder_counts(tmp_path):
    (tmp_path / "in" / "out").mkdir(parents=True)
    inside = str(tmp_path / "in" / "out" / "README.md")
    for out in (str(tmp_path / "in" / "out"), f"file://{tmp_path}/in/out", f"local://{tmp_path}/in/out/"):
        assert _input_inside([str(tmp_path / "in" / "a.jsonl"), inside], out) == inside, out
    assert _input_inside([inside], str(tmp_path / "in" / "ou")) is None  # a sibling folder's prefix is not inside
    s3 = ["s3://bucket/in/a.jsonl.zst", "s3://bucket/in/out/README.md"]
    for out in ("s3://bucket/in/out", "s3a://bucket/in/out", "s3://bucket/in/out/"):
        assert _input_inside(s3, out) == "s3://bucket/in/out/README.md", out
    assert _input_inside(s3, "s3://bucket/in/outer") is None
    assert _input_inside(s3, "s3://other/in/out") is None
    assert _input_inside([inside], "s3://bucket" + str(tmp_path / "in" / "out")) is None  # another storage
