"""The driver JVM's class-data archive (issue 21, cold start): written once at exit, kept only when
complete (a truncated archive crashes the JVM that maps it), used by every later driver JVM."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from datakit.engines import spark_cds

ROOT = Path(__file__).resolve().parents[2]
_WRITTEN = ("[24.556s][info   ][cds,dynamic   ] Written dynamic archive 0x0000000800bc7000 - 0x000000080986e728 "
            "[984 bytes header, 147486504 bytes total]\n")  # a real JVM's line


def test_only_a_finished_dump_is_adopted(tmp_path, monkeypatch):
    monkeypatch.setenv("DATAKIT_CACHE_DIR", str(tmp_path))
    folder = tmp_path / "spark-cds"
    folder.mkdir()
    archive = folder / "k.jsa"
    done, cut, running = (folder / f"k.{pid}.jsa.tmp" for pid in (11, 12, 13))
    for f in (done, cut, running):
        f.write_bytes(b"")
    os.truncate(done, 147486504)  # sparse: as long as the log says
    os.truncate(cut, 147486503)  # one byte short: a JVM killed while writing
    for f in (done, cut):
        f.with_suffix(".log").write_text(_WRITTEN)
    running.with_suffix(".log").write_text("[22.306s][info][cds,dynamic] Dumping\n")  # not written yet
    assert spark_cds.dump_finished(done, done.with_suffix(".log"))
    assert not spark_cds.dump_finished(cut, cut.with_suffix(".log"))
    assert not spark_cds.dump_finished(running, running.with_suffix(".log"))
    (folder / "k.dumping").write_text("11\n")
    assert spark_cds._adopt_finished_dump(folder, "k", archive)
    assert archive.stat().st_size == 147486504 and not (folder / "k.dumping").exists()
    assert not done.exists() and not cut.exists()  # the unfinished one went with the adoption
    assert not spark_cds._adopt_finished_dump(folder, "other", folder / "other.jsa")


def test_one_process_dumps_and_a_dead_dump_is_cleared(tmp_path, monkeypatch):
    monkeypatch.setenv("DATAKIT_CACHE_DIR", str(tmp_path))
    java = sys.executable  # any binary: the key hashes its path, size and time
    conf = {"spark.driver.memory": "2g"}
    key = spark_cds.archive_key(java, conf)
    assert key != spark_cds.archive_key(java, {"spark.driver.memory": "4g"})  # heap layout is part of the key
    first = spark_cds.jvm_option(java, conf)
    folder = tmp_path / "spark-cds"
    assert first.startswith(f"-XX:ArchiveClassesAtExit={folder / key}.{os.getpid()}.jsa.tmp -Xlog:cds+dynamic")
    assert spark_cds.jvm_option(java, conf) == ""  # a second driver meanwhile: no second dump
    # that dump's JVM was killed: after STALE_SECONDS the claim and the partial file are cleared
    partial = folder / f"{key}.{os.getpid()}.jsa.tmp"
    partial.write_bytes(b"partial")
    old = time.time() - spark_cds.STALE_SECONDS - 1
    for f in (partial, folder / f"{key}.dumping"):
        os.utime(f, (old, old))
    assert spark_cds.jvm_option(java, conf).startswith("-XX:ArchiveClassesAtExit=")
    assert not partial.exists()
    (folder / f"{key}.jsa").write_bytes(b"x")
    assert spark_cds.jvm_option(java, conf) == f"-XX:SharedArchiveFile={folder / key}.jsa"
    monkeypatch.setenv("DATAKIT_SPARK_CDS", "0")
    assert spark_cds.jvm_option(java, conf) == ""


def test_a_killed_drivers_claim_is_taken_over_at_once(tmp_path, monkeypatch):
    """The claiming process and its JVM are gone (a killed test run): the next driver need not wait
    STALE_SECONDS; a claim whose process still runs is left alone."""
    monkeypatch.setenv("DATAKIT_CACHE_DIR", str(tmp_path))
    java, conf = sys.executable, {}
    key = spark_cds.archive_key(java, conf)
    folder = tmp_path / "spark-cds"
    folder.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()  # a pid that has exited
    (folder / f"{key}.dumping").write_text(f"{dead}\n")
    partial = folder / f"{key}.{dead}.jsa.tmp"
    partial.write_bytes(b"partial")
    partial.with_suffix(".log").write_text("[22.306s][info][cds,dynamic] Dumping\n")
    assert spark_cds.jvm_option(java, conf).startswith(f"-XX:ArchiveClassesAtExit={folder / key}.{os.getpid()}.jsa.tmp")
    assert not partial.exists() and not partial.with_suffix(".log").exists()
    assert (folder / f"{key}.dumping").read_text().strip() == str(os.getpid())
    # a live claimer (this process) with a fresh partial dump: nobody takes over, nothing is deleted
    mine = folder / f"{key}.{os.getpid()}.jsa.tmp"
    mine.write_bytes(b"partial")
    assert spark_cds.jvm_option(java, conf) == ""
    assert mine.exists()


_CHILD = textwrap.dedent("""
    import sys
    from datakit.engines.spark_session import get_session
    s = get_session("local[1]")
    assert s.range(100).count() == 100
    jvm = s.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
    maps = open(f"/proc/{jvm}/maps").read()  # the JDK's own base archive is mapped too: look for ours
    print("MAPPED" if sys.argv[1] + "/spark-cds/" in maps else "NOT-MAPPED")
""")


@pytest.mark.spark
def test_the_first_driver_writes_the_archive_and_the_next_one_maps_it(tmp_path):
    env = {**os.environ, "DATAKIT_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(ROOT),
           "DATAKIT_SPARK_LOG_DIR": str(tmp_path / "logs")}
    env.pop("DATAKIT_SPARK_CDS", None)

    def child() -> str:
        r = subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path)], env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        return r.stdout.strip().splitlines()[-1]

    assert child() == "NOT-MAPPED"
    # this driver's JVM writes the archive after the process is gone: wait for it to log that it has
    deadline = time.time() + 240
    while not any(spark_cds.dump_finished(p, p.with_suffix(".log")) for p in (tmp_path / "spark-cds").glob("*.jsa.tmp")):
        assert time.time() < deadline, sorted(p.name for p in (tmp_path / "spark-cds").iterdir())
        time.sleep(0.5)
    assert child() == "MAPPED"  # the next driver adopts it
    assert sorted(p.suffix for p in (tmp_path / "spark-cds").iterdir()) == [".jsa", ".owner"]  # no leftovers


def test_the_key_names_where_pyspark_is_installed(tmp_path, monkeypatch):
    """Found in review: two installations of the same pyspark (two venvs) shared an archive key, but the
    JVM refuses an archive whose class path is another installation's jars: the second one logged "Unable
    to use shared archive" on every run and never wrote its own."""
    import shutil

    import pyspark

    java = shutil.which("java") or "/bin/sh"
    here = spark_cds.archive_key(java, {})
    other = tmp_path / "site-packages" / "pyspark"
    (other / "jars").mkdir(parents=True)
    for j in (Path(pyspark.__file__).parent / "jars").iterdir():  # the same names and sizes (sparse files)
        with open(other / "jars" / j.name, "wb") as f:
            f.truncate(j.stat().st_size)
    monkeypatch.setattr(pyspark, "__file__", str(other / "__init__.py"))
    assert spark_cds.archive_key(java, {}) != here


def test_the_files_of_an_installation_that_is_gone_are_swept(tmp_path, monkeypatch):
    """Found in review: the key names the installation, so a removed virtualenv's archive, or its finished
    dump that no driver of its own ever adopted, stayed for good (46 keys, 7.3 GB in one home folder after a
    day of CI jobs in fresh clones). The next driver start of any installation deletes them."""
    monkeypatch.setenv("DATAKIT_CACHE_DIR", str(tmp_path))
    java, conf = sys.executable, {}
    key = spark_cds.archive_key(java, conf)
    folder = tmp_path / "spark-cds"
    folder.mkdir()
    venv = tmp_path / "old-venv" / "jars"
    venv.mkdir(parents=True)

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()  # a pid that has exited: no writer

    def files(k: str, owner: list[str] | None, age: float = 0.0) -> list[Path]:
        made = [folder / f"{k}.jsa", folder / f"{k}.{dead}.jsa.tmp", folder / f"{k}.{dead}.jsa.log",
                folder / f"{k}.dumping"]
        if owner is not None:
            made.append(folder / f"{k}.owner")
        for f in made:
            f.write_text("\n".join(owner) + "\n" if f.suffix == ".owner" else "x")
            if age:
                os.utime(f, (time.time() - age, time.time() - age))
        return made

    removed = files("removed", [os.path.realpath(java), str(venv)])
    kept = files("kept", [os.path.realpath(java), str(Path(sys.executable).parent)])
    legacy_old = files("legacyold", None, age=spark_cds.UNUSED_SECONDS + 60)
    legacy_new = files("legacynew", None)
    unused = files("unused", [os.path.realpath(java), str(Path(sys.executable).parent)], age=spark_cds.UNUSED_SECONDS + 60)
    mine = folder / f"{key}.jsa"
    mine.write_bytes(b"x")
    os.utime(mine, (time.time() - spark_cds.UNUSED_SECONDS - 60,) * 2)
    venv.rmdir()  # that virtualenv was removed

    assert spark_cds.jvm_option(java, conf) == f"-XX:SharedArchiveFile={mine}"
    assert not any(f.exists() for f in removed + legacy_old + unused)
    assert all(f.exists() for f in kept + legacy_new)
    assert time.time() - mine.stat().st_mtime < 60  # touched as it is mapped: this key is in use
    owner = folder / f"{key}.owner"
    assert owner.read_text().splitlines()[0] == os.path.realpath(java)


def test_a_dump_being_written_is_never_swept(tmp_path, monkeypatch):
    monkeypatch.setenv("DATAKIT_CACHE_DIR", str(tmp_path))
    folder = tmp_path / "spark-cds"
    folder.mkdir()
    writing = folder / f"other.{os.getpid()}.jsa.tmp"  # this process counts as its writer
    writing.write_bytes(b"partial")
    (folder / "other.owner").write_text(str(tmp_path / "no-such-venv") + "\n")
    assert spark_cds.sweep(folder, "current") == []
    assert writing.exists()
