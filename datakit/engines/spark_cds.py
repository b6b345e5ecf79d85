"""The driver JVM's class-data archive (AppCDS): Spark's classes mapped from a file, not loaded one by one.

Why: a fresh driver JVM loads and verifies some 12,500 classes before its first query; that was
most of the Spark engine's start-up. Measured on the quickstart pipeline, 10,000 events, `local[2]`,
2 cores, alternated runs without / with the archive: `engine_start` 5.0 / 5.0 s -> 2.9 / 3.0 s,
whole run 37.5 / 37.7 s -> 33.7 / 35.4 s (the first query and the first tasks start sooner too).

How:
- A driver JVM started while there is no archive for this installation (`archive_key`) runs with
  `-XX:ArchiveClassesAtExit=<key>.<pid>.jsa.tmp`: when this process exits, the JVM (on its own,
  after the Python side is gone) writes the archive, ~12 s of one core. One process at a time
  does this (`<key>.dumping`, created exclusively); the others start without an archive.
- The next driver start finds the finished dump, renames it to `<key>.jsa` and maps it
  (`-XX:SharedArchiveFile`). "Finished" is read from the dump's own log (`-Xlog:cds+dynamic`):
  the JVM logs "Written dynamic archive ... bytes total" after the header, which it writes last,
  and the file must be at least that long. Never guessed from a file's age or size: a truncated
  archive crashes the JVM that maps it (SIGBUS, measured).
- A dump that never finished (its JVM killed) is deleted, and its claim taken over, as soon as
  neither the claiming process nor a JVM writing that file runs any more (Linux: /proc), else
  after `STALE_SECONDS`. Why not only the clock: a test run or CI job killed mid-run left its
  claim behind, and every driver for the next 15 minutes started without an archive.
- The JVM itself checks that an archive matches its build and class path and ignores one that
  does not (a line in the driver log).

- Files of an installation that is gone are deleted by the next driver start of any installation
  (`sweep`): each key has a `<key>.owner` file naming its `java` binary and pyspark's jars folder, and
  when either no longer exists, every file of that key goes. Why: found in review, the key names the
  installation, so a removed virtualenv's archive (or finished dump, never adopted by a driver of its
  own) stayed for good: one home folder held 46 of them, 7.3 GB, after a day of CI jobs, each in a
  fresh clone's venv. Files older datakit versions left without an owner file go once unused for
  `UNUSED_SECONDS` (an archive is touched each time a driver maps it), as does any archive unused
  that long.

The key covers what the archive depends on: the `java` binary (path, size, time), pyspark's
version and jars, and the settings that change the driver's class path or heap. Output bytes never
depend on it: the archive changes how fast classes load, not which. Off: `DATAKIT_SPARK_CDS=0`.
Where: `$DATAKIT_CACHE_DIR/spark-cds/` (default `~/.cache/datakit/spark-cds/`), ~150 MB per key.
"""
from __future__ import annotations

import hashlib
import logging
import os
import re
import time
from pathlib import Path

from datakit.io import cache

log = logging.getLogger("datakit.engine.spark")

ENV_SWITCH = "DATAKIT_SPARK_CDS"
# settings that change the driver JVM's class path or heap layout (an archive is valid for one of each)
KEYED_CONF = ("spark.driver.memory", "spark.driver.extraClassPath", "spark.jars", "spark.jars.packages")
STALE_SECONDS = 900.0  # a dump not finished after this long belongs to a JVM that was killed
UNUSED_SECONDS = 14 * 86400.0  # an archive no driver mapped for this long, or a file of no known owner, goes
_WRITTEN = re.compile(r"Written dynamic archive .* (\d+) bytes total")


def enabled() -> bool:
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "false", "no", "off")


def cache_dir() -> Path:
    return Path(cache.root()) / "spark-cds"


def archive_key(java: str, conf: dict[str, str]) -> str:
    """What the archive depends on, hashed: the JVM binary, pyspark and its jars, class path and heap settings."""
    import pyspark

    h = hashlib.sha256()
    real = os.path.realpath(java)
    st = os.stat(real)
    h.update(f"{real}\0{st.st_size}\0{st.st_mtime_ns}\0{pyspark.__version__}\0".encode())
    jars = Path(pyspark.__file__).parent / "jars"
    # where they are, too: the JVM checks the archive's class path by the jars' paths, so an archive of
    # another installation's jars is refused (found in review: two venvs shared one key, the second's
    # driver logged "Unable to use shared archive" on every run and never wrote its own)
    h.update(f"{jars.resolve()}\0".encode())
    if jars.is_dir():
        for j in sorted(jars.iterdir()):
            h.update(f"{j.name}\0{j.stat().st_size}\0".encode())
    for k in KEYED_CONF:
        h.update(f"{k}={conf.get(k, '')}\0".encode())
    return h.hexdigest()[:20]


def dump_finished(archive: Path, dump_log: Path) -> bool:
    """True if the JVM logged the archive as written (after its header, written last) and the file holds it."""
    try:
        m = _WRITTEN.search(dump_log.read_text(errors="replace"))
        return m is not None and archive.stat().st_size >= int(m.group(1))
    except OSError:
        return False


def wait_for_dump(timeout: float = 180.0) -> None:
    """Return once no archive is being written here (or after `timeout`): a benchmark's warm-up run
    leaves its JVM writing one, which would take a core from the timed runs and the archive from the first."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        dumps = list(cache_dir().glob("*.jsa.tmp"))
        if not dumps or any(dump_finished(p, p.with_suffix(".log")) for p in dumps):
            return
        time.sleep(0.5)


def jvm_option(java: str, conf: dict[str, str]) -> str:
    """The driver JVM option for this start: map the archive if there is one, else maybe write it at exit."""
    if not enabled():
        return ""
    try:
        key = archive_key(java, conf)
        folder = cache_dir()
        folder.mkdir(parents=True, exist_ok=True)
        sweep(folder, key)
        _write_owner(folder / f"{key}.owner", java)
        archive = folder / f"{key}.jsa"
        if archive.is_file() or _adopt_finished_dump(folder, key, archive):
            os.utime(archive)  # when a driver last mapped it (see `sweep`)
            return f"-XX:SharedArchiveFile={archive}"
        if not _claim_dump(folder / f"{key}.dumping"):
            return ""  # another process is writing it
        tmp = folder / f"{key}.{os.getpid()}.jsa.tmp"
        return f"-XX:ArchiveClassesAtExit={tmp} -Xlog:cds+dynamic=info:file={tmp.with_suffix('.log')}"
    except OSError as e:  # no writable cache: start without an archive
        log.debug("no class-data archive: %s", e)
        return ""


def _owner_paths(java: str) -> list[str]:
    """What an archive key's installation is made of on disk: the java binary and pyspark's jars folder."""
    import pyspark

    return [os.path.realpath(java), str((Path(pyspark.__file__).parent / "jars").resolve())]


def _write_owner(owner: Path, java: str) -> None:
    text = "".join(f"{p}\n" for p in _owner_paths(java))
    try:
        if owner.read_text() == text:
            return
    except OSError:
        pass
    tmp = owner.with_name(f"{owner.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, owner)


def sweep(folder: Path, current: str) -> list[str]:
    """Delete the files of archive keys other than `current` that no driver will use again; the keys deleted.

    A key goes when its `.owner` file names a path that no longer exists (its virtualenv or JDK was removed),
    or when it has no owner file (an older datakit's) or its archive was not mapped, and none of its files
    changed, for `UNUSED_SECONDS`. A dump whose JVM may still be writing it is never touched."""
    now = time.time()
    by_key: dict[str, list[Path]] = {}
    for f in folder.iterdir():
        key = f.name.split(".", 1)[0]
        if key != current and f.is_file():
            by_key.setdefault(key, []).append(f)
    gone = []
    for key, files in sorted(by_key.items()):
        owner = folder / f"{key}.owner"
        try:
            paths = owner.read_text().splitlines() if owner in files else None
            newest = max(f.stat().st_mtime for f in files)
        except OSError:
            continue
        removed = paths is not None and any(p and not os.path.exists(p) for p in paths)
        if not removed and now - newest < UNUSED_SECONDS:
            continue
        if any(f.name.endswith(".jsa.tmp") and _writer_alive(f) for f in files):
            continue  # a JVM is writing it right now
        for f in files:
            f.unlink(missing_ok=True)
        gone.append(key)
    if gone:
        log.info("class-data archives: removed %d of installations gone or unused (%s)", len(gone), folder)
    return gone


def _adopt_finished_dump(folder: Path, key: str, archive: Path) -> bool:
    """Rename a finished dump to the archive; delete dumps that will never finish. True if adopted."""
    adopted = False
    now = time.time()
    for tmp in sorted(folder.glob(f"{key}.*.jsa.tmp")):
        dump_log = tmp.with_suffix(".log")
        if not adopted and dump_finished(tmp, dump_log):
            os.replace(tmp, archive)
            adopted = True
        elif now - tmp.stat().st_mtime < STALE_SECONDS and not adopted and _writer_alive(tmp) is not False:
            continue  # still being written (or its JVM is still running)
        else:
            tmp.unlink(missing_ok=True)
        dump_log.unlink(missing_ok=True)
    if adopted:
        (folder / f"{key}.dumping").unlink(missing_ok=True)
    return adopted


def _claim_dump(marker: Path) -> bool:
    """Exclusively become the process whose JVM writes the archive (a stale claim is taken over)."""
    try:
        if marker.exists() and (time.time() - marker.stat().st_mtime > STALE_SECONDS or _claim_abandoned(marker)):
            marker.unlink(missing_ok=True)
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        f.write(f"{os.getpid()}\n")
    return True


def _claim_abandoned(marker: Path) -> bool:
    """True if the process that claimed the dump and any JVM writing its file are gone (Linux; else False)."""
    try:
        pid = marker.read_text().strip()
    except OSError:
        return False
    if not pid.isdigit():
        return False
    return _writer_alive(marker.with_name(f"{marker.stem}.{pid}.jsa.tmp")) is False


def _writer_alive(tmp: Path) -> bool | None:
    """May a process still write the dump `tmp` (`<key>.<pid>.jsa.tmp`)? The claiming Python process, or its
    driver JVM, which writes the archive after that process exits (its command line names `tmp`).
    None where /proc cannot tell (then only `STALE_SECONDS` decides). A reused pid reads as alive: safe."""
    proc = Path("/proc")
    if not (proc / "self" / "cmdline").exists():
        return None
    pid = tmp.name.split(".")[-3]
    if pid.isdigit() and (proc / pid).exists():
        return True
    needle = str(tmp).encode()
    for d in proc.iterdir():
        if d.name.isdigit():
            try:
                if needle in (d / "cmdline").read_bytes():
                    return True
            except OSError:
                continue
    return False
