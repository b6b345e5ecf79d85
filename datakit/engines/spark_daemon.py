"""The Python daemon of a local Spark master: pyspark's own daemon, importing pyspark from the
installed package rather than from the zip inside it.

Why: Spark puts `$SPARK_HOME/python/lib/pyspark.zip` first on its Python workers' path, and a
pip-installed pyspark is its own SPARK_HOME, so the daemon and every worker it forks imported
pyspark from that zip, which holds no bytecode: every start compiled pyspark's modules from
source. `import pyspark.daemon, pyspark.worker` took 0.66-0.92 s from the zip against 0.16-0.18 s
from the installed package (3 runs each), on the path of every run's first Python task.

The zip is dropped from the path only when it is the one inside the installed pyspark package
that the path then resolves to, so the code is the same release either way; anything else (a
cluster's Spark distribution, a zip of another version) is left as Spark set it. Set as
`spark.python.daemon.module` on local masters whose workers run this interpreter
(`spark_session._base_conf`). It imports nothing but the standard library before pyspark's daemon
forks its workers (no thread may exist before the fork, pyspark.daemon says).
"""
from __future__ import annotations

import importlib.util
import os
import sys


def _bundled_zip(entry: str) -> str | None:
    """The installed pyspark package folder `entry` is the bundled zip of, else None."""
    path = os.path.abspath(entry)
    if os.path.basename(path) != "pyspark.zip":
        return None
    package = os.path.dirname(os.path.dirname(os.path.dirname(path)))  # <site>/pyspark/python/lib/pyspark.zip
    if os.path.basename(package) != "pyspark" or not os.path.isfile(os.path.join(package, "__init__.py")):
        return None
    return package


def prefer_installed_pyspark(path: list[str]) -> list[str]:
    """`path` without the zip of the installed pyspark, when `pyspark` then resolves to that package.

    Returns the entries removed (none when it would resolve elsewhere: `path` is then unchanged)."""
    dropped = [(i, e, pkg) for i, e in enumerate(path) if (pkg := _bundled_zip(e)) is not None]
    if len(dropped) != 1:
        return []
    i, entry, package = dropped[0]
    del path[i]
    spec = importlib.util.find_spec("pyspark")
    origin = os.path.abspath(spec.origin) if spec is not None and spec.origin else ""
    if origin != os.path.join(package, "__init__.py"):
        path.insert(i, entry)
        return []
    return [entry]


DRIVER_PATH_ENV = "DATAKIT_DRIVER_PATH0"  # set by spark_session._base_conf for the workers of a local master


def driver_first(path: list[str], driver_folder: str | None) -> None:
    """The path a worker imports from starts as the driver's: its first folder (`driver_folder`, the
    script's, or the current one for a notebook), not the one `python -m` put there.

    Why: `python -m` put the folder the JVM was started from first. With it, a file there named like
    a module (found in review: a `concurrent.py` beside the pipeline, run with the `datakit` command,
    whose own path does not hold that folder) shadowed the standard library in every Python worker;
    without the driver's folder, a custom stage module beside the user's script imported in the
    driver and on the local engine's workers (spawned with the driver's path) but not here.
    PYTHONPATH entries stay as they are."""
    if path and path[0] in ("", os.getcwd()):
        del path[0]
    if driver_folder and driver_folder not in path:
        path.insert(0, driver_folder)


def main() -> None:
    driver_first(sys.path, os.environ.get(DRIVER_PATH_ENV))
    prefer_installed_pyspark(sys.path)
    from pyspark.daemon import manager

    manager()


if __name__ == "__main__":
    main()
