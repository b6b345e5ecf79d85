"""`datakit.io.local_files`: plain local paths without fsspec, held to fsspec's own LocalFileSystem."""
from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from fsspec.implementations.local import LocalFileSystem

from datakit.io.fs import arrow_filesystem, filesystem, open_file
from datakit.io.local_files import LOCAL, LocalFiles, is_plain_local, strip_local

REF = LocalFileSystem()


@pytest.mark.parametrize("path", ["/a/b", "/a/b/", "/", "//", "rel", "rel/x/", "./rel", ".", "", "~", "~/x/",
                                  "a/../b", "/a//b", "./", "../up", "dir with spaces/f.parquet"])
def test_paths_are_made_absolute_as_fsspec_does(path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert is_plain_local(path)
    assert strip_local(path) == REF._strip_protocol(path)
    assert filesystem(path) == (LOCAL, REF._strip_protocol(path))


def test_paths_with_a_colon_go_to_fsspec(tmp_path: Path) -> None:
    for url in (f"file://{tmp_path}/x", "memory://bucket/x", f"local:{tmp_path}/y"):
        fs, p = filesystem(url)
        assert not isinstance(fs, LocalFiles), url
    fs, p = filesystem(f"file://{tmp_path}/x/")
    assert isinstance(fs, LocalFileSystem) and p == f"{tmp_path}/x"
    assert not is_plain_local(f"{tmp_path}/a:b") and not is_plain_local(123)


def test_calls_answer_as_fsspec_does(tmp_path: Path) -> None:
    d = tmp_path / "d"
    LOCAL.makedirs(str(d / "sub"))
    REF.makedirs(str(d / "sub"), exist_ok=True)
    with pytest.raises(FileExistsError):
        LOCAL.makedirs(str(d / "sub"))
    LOCAL.makedirs(str(d / "sub"), exist_ok=True)

    LOCAL.pipe_file(str(d / "a.bin"), b"hello")
    REF.pipe_file(str(d / "b.bin"), b"hello")
    assert LOCAL.cat_file(str(d / "a.bin")) == REF.cat_file(str(d / "b.bin")) == b"hello"
    assert LOCAL.cat_file(str(d / "a.bin"), start=1, end=3) == REF.cat_file(str(d / "a.bin"), start=1, end=3) == b"el"
    with LOCAL.open(str(d / "c.bin"), "wb") as f:
        f.write(b"xyz")
    with LOCAL.open(str(d / "c.bin"), "ab") as f:
        f.write(b"!")
    with LOCAL.open(str(d / "c.bin"), "rb") as f, REF.open(str(d / "c.bin"), "rb") as g:
        assert f.read() == g.read() == b"xyz!"
    with LOCAL.open(str(d / "t.txt"), "w") as f:  # text modes are fsspec's
        f.write("text")
    assert LOCAL.cat_file(str(d / "t.txt")) == b"text"

    os.symlink(d / "c.bin", d / "link")
    for p in ("a.bin", "sub", "link", "sub/"):
        mine, ref = LOCAL.info(str(d / p)), REF.info(str(d / p))
        assert mine == ref, p
        assert LOCAL.size(str(d / p)) == REF.size(str(d / p))
        assert (LOCAL.isfile(str(d / p)), LOCAL.isdir(str(d / p))) == (REF.isfile(str(d / p)), REF.isdir(str(d / p)))
    for missing in ("nope", "a.bin/under-a-file"):
        assert LOCAL.exists(str(d / missing)) is REF.exists(str(d / missing)) is False
        with pytest.raises(FileNotFoundError if missing == "nope" else NotADirectoryError):
            LOCAL.info(str(d / missing))
    with pytest.raises(FileNotFoundError):
        LOCAL.cat_file(str(d / "nope"))

    LOCAL.mv(str(d / "a.bin"), str(d / "sub" / "moved.bin"))
    assert not LOCAL.exists(str(d / "a.bin")) and LOCAL.cat_file(str(d / "sub" / "moved.bin")) == b"hello"
    LOCAL.pipe_file(str(d / "over.bin"), b"new")
    LOCAL.mv(str(d / "over.bin"), str(d / "b.bin"))  # onto an existing file: replaced, as fsspec's (shutil.move)
    assert LOCAL.cat_file(str(d / "b.bin")) == b"new"
    LOCAL.rm_file(str(d / "b.bin"))
    assert not os.path.exists(d / "b.bin")

    # anything not answered here is fsspec's own: same listing, same removal
    assert LOCAL.find(str(d)) == REF.find(str(d))
    assert LOCAL.glob(f"{d}/*.bin") == REF.glob(f"{d}/*.bin")
    LOCAL.rm(str(d / "sub"), recursive=True)
    assert not os.path.exists(d / "sub")


def test_pickles_to_itself_and_pyarrow_reads_locally(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    assert pickle.loads(pickle.dumps(LOCAL)) is LOCAL
    fs, p = filesystem(str(tmp_path / "t.parquet"))
    assert arrow_filesystem(fs) is None
    pq.write_table(pa.table({"x": [1, 2]}), p, filesystem=arrow_filesystem(fs))
    assert pq.read_table(p, filesystem=arrow_filesystem(fs)).column("x").to_pylist() == [1, 2]
    mem, _ = filesystem("memory://x/t.parquet")
    assert arrow_filesystem(mem) is mem
    with open_file(str(tmp_path / "t.parquet")) as f:
        assert f.read(4) == b"PAR1"


def test_a_process_on_local_files_never_imports_fsspec(tmp_path: Path) -> None:
    """What a pool worker does with local files (read Parquet and JSON Lines input, write a spill and
    shards, commit atomically, fingerprint a partition) needs no fsspec (~35 ms CPU per process)."""
    code = f"""
import sys, json, pyarrow as pa, pyarrow.parquet as pq
from datakit.io.readers import iter_source
from datakit.io.atomic import write_json_atomic
from datakit.engines.local.spill import Partition
from datakit.io.sinks import output_checksums
d = {str(tmp_path)!r}
pq.write_table(pa.table({{"x": [1, 2, 3]}}), d + "/in.parquet")
open(d + "/in.jsonl", "w").write(json.dumps({{"x": 1}}) + "\\n")
assert sum(b.num_rows for b in iter_source(d + "/in.parquet", "parquet", None)) == 3
assert sum(b.num_rows for b in iter_source(d + "/in.jsonl", "jsonl", None)) == 1
write_json_atomic(d + "/out/state.json", {{"ok": True}})
Partition("parquet", d + "/in.parquet").fingerprint()
print(sorted(m for m in sys.modules if m.split(".")[0] == "fsspec"))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"
    assert (tmp_path / "out" / "state.json").exists()


def test_folders_and_globs_go_through_symbolic_links_to_folders(tmp_path):
    """fsspec's find and glob do not enter a linked folder: `logs/dt=2 -> /mnt/disk2/...` was left out of a
    run and of a contamination check that then said clean (found in review). A link back up the tree is
    listed once, and a broken link below a folder is named, as one matched by a glob is."""
    import pytest

    from datakit.io.fs import InputError, expand

    (tmp_path / "logs" / "dt=1").mkdir(parents=True)
    (tmp_path / "logs" / "dt=1" / "a.jsonl").write_text("{}\n")
    (tmp_path / "disk2" / "day").mkdir(parents=True)
    (tmp_path / "disk2" / "day" / "b.jsonl").write_text("{}\n")
    (tmp_path / "logs" / "dt=2").symlink_to(tmp_path / "disk2" / "day")
    (tmp_path / "logs" / "dt=1" / "loop").symlink_to(tmp_path / "logs")  # a cycle
    logs = str(tmp_path / "logs")
    want = [f"{logs}/dt=1/a.jsonl", f"{logs}/dt=2/b.jsonl"]
    assert expand(logs) == want
    assert expand(f"{logs}/*/*.jsonl") == want
    assert expand(f"{logs}/**/b.jsonl") == want[1:]
    # a link to a folder of the tree is an alias: its files keep their own names, whatever the walk meets first
    (tmp_path / "logs" / "a-latest").symlink_to(tmp_path / "logs" / "dt=1")
    assert expand(logs) == want and expand(f"{logs}/*/*.jsonl") == want
    # a broken link the input would not read (another suffix, a `_`/`.` folder) is not an error ...
    (tmp_path / "logs" / "_work").mkdir()
    (tmp_path / "logs" / "_work" / "stale.jsonl").symlink_to(tmp_path / "nowhere")
    (tmp_path / "logs" / "notes.txt").symlink_to(tmp_path / "nowhere")
    assert expand(logs, suffixes=(".jsonl",)) == want
    # ... one it would read is
    (tmp_path / "logs" / "dt=1" / "gone.jsonl").symlink_to(tmp_path / "unmounted.jsonl")
    with pytest.raises(InputError, match="dt=1/gone.jsonl is a symbolic link to a missing file"):
        expand(logs, suffixes=(".jsonl",))
    # a link that resolves to itself is named as the loop it is (found in review: "a missing file")
    (tmp_path / "logs" / "dt=1" / "gone.jsonl").unlink()
    (tmp_path / "logs" / "dt=1" / "self.jsonl").symlink_to("self.jsonl")
    with pytest.raises(InputError, match=r"dt=1/self.jsonl is a symbolic link to a loop of symbolic links \(self.jsonl\)"):
        expand(logs, suffixes=(".jsonl",))


def test_a_device_or_fifo_among_the_inputs_is_refused(tmp_path):
    """Found in review: a link to /dev/zero in an input folder was read forever (one endless line), and a
    FIFO matched by a glob was left out without a word."""
    from datakit.io.fs import InputError, expand

    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text("{}\n")
    (tmp_path / "in" / "z.jsonl").symlink_to("/dev/zero")
    for pattern in (tmp_path / "in", tmp_path / "in" / "*.jsonl"):
        with pytest.raises(InputError, match="z.jsonl is not a regular file"):
            expand(str(pattern), suffixes=(".jsonl",))
    (tmp_path / "in" / "z.jsonl").unlink()
    os.mkfifo(tmp_path / "in" / "f.jsonl")
    with pytest.raises(InputError, match="f.jsonl is not a regular file"):
        expand(str(tmp_path / "in" / "*.jsonl"))
    with pytest.raises(InputError, match="f.jsonl is not a regular file"):  # named on its own: it blocked forever
        expand(str(tmp_path / "in" / "f.jsonl"))
    (tmp_path / "in" / "f.jsonl").unlink()
    (tmp_path / "in" / "sub.jsonl").mkdir()  # a folder a glob matches is still not an input, and no error
    assert expand(str(tmp_path / "in" / "*.jsonl")) == [str(tmp_path / "in" / "a.jsonl")]


def test_files_of_another_type_are_named_not_reported_as_no_match(tmp_path):
    """Found in a hostile-input review: `format: parquet` with a glob of .jsonl.zst files said "no input
    files match" although files matched; now it says how many files are there and of which type it reads."""
    from datakit.io.fs import InputError, expand

    (tmp_path / "dt=1").mkdir()
    (tmp_path / "dt=1" / "part-0.jsonl.zst").write_bytes(b"x")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("a")
    (tmp_path / "notes" / "b.txt").write_text("b")
    with pytest.raises(InputError, match=r"dt=\*/\*: 1 file there, none of a type read here \(expected \.parquet; "
                                         r"first: .*part-0\.jsonl\.zst\)"):
        expand(str(tmp_path / "dt=*" / "*"), suffixes=(".parquet",))
    with pytest.raises(InputError, match=r"notes: 2 files there, none of a type read here \(expected \.jsonl, "
                                         r"\.parquet; first: .*a\.txt\)"):
        expand(str(tmp_path / "notes"), suffixes=(".parquet", ".jsonl"))
    with pytest.raises(InputError, match="no input files match"):  # a glob matching only a folder: nothing there
        expand(str(tmp_path / "no*"), suffixes=(".parquet",))
    assert expand(str(tmp_path / "notes")) == sorted(str(p) for p in (tmp_path / "notes").iterdir())
