"""Keep pyarrow from importing pandas in processes that never use it.

Why: pyarrow decides lazily whether pandas is installed, and the first call that
asks (`pa.array` of a list or of a numpy array, `pc.take`, most compute calls) imports all of
pandas to find out whether its argument might be a pandas object. That costs ~0.5 CPU-s and
~40 MB in every process, before any data: in a tokenize-only `datakit run` of 32 MB (a driver
and two workers) it was ~2 of ~17 CPU-s, for objects datakit never creates.

How: while pandas is not imported, no object can be a pandas object, so we let pyarrow's
probe fail (pandas is hidden for that one call) and pyarrow records "no pandas". Anything that
imports pandas later (a quality suite, a user's function) re-arms pyarrow the moment the import
finishes, so conversions of pandas objects behave exactly as without this module; calls that
need pandas (`to_pandas`, `from_pandas`) retry the import on their own anyway.

Only for processes datakit owns: pool workers, the `datakit` command and Spark's Python workers
(the chain's per-worker set-up). A library user's own process is left alone.
"""
from __future__ import annotations

import importlib.abc
import sys
from typing import Any


class _HidePandas(importlib.abc.MetaPathFinder):
    """Makes `import pandas` fail, for the duration of pyarrow's one probe."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == "pandas":
            raise ImportError("pandas hidden while pyarrow probes for it (datakit.arrow_without_pandas)")
        return None


class _RearmOnImport(importlib.abc.MetaPathFinder):
    """Finds pandas with the other finders, and tells pyarrow once pandas' `__init__` has run.

    Stays in `sys.meta_path` until pandas is really imported: a bare `importlib.util.find_spec`
    (an availability check) executes nothing, so it must not disarm us.
    """

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "pandas":
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is not None and hasattr(loader, "exec_module"):
            inner = loader.exec_module

            def exec_module(module: Any) -> None:
                inner(module)
                if getattr(module, "__name__", None) == "pandas":
                    _tell_pyarrow()

            loader.exec_module = exec_module  # this spec's loader only; pandas keeps its own loader type
        return spec


_REARM = _RearmOnImport()


def _tell_pyarrow() -> None:
    """pandas is imported now: make pyarrow's shim load its pandas support (it retries on demand)."""
    if _REARM in sys.meta_path:
        sys.meta_path.remove(_REARM)
    import pyarrow.lib

    try:
        pyarrow.lib._pandas_api.pd  # noqa: B018 - a property whose getter (re)imports pandas support
    except ImportError:  # a pandas pyarrow does not support: pyarrow raises the same on its own later
        pass


def defer_pandas() -> bool:
    """Make pyarrow treat pandas as absent until something imports it; True if that took effect.

    Does nothing when pandas is already imported, or pyarrow has already looked for it.
    """
    if "pandas" in sys.modules or _REARM in sys.meta_path:
        return False
    import pyarrow as pa

    hide = _HidePandas()
    sys.meta_path.insert(0, hide)
    try:
        pa.array([0])  # pyarrow's first "is this a pandas object?" check: the import fails, it records no pandas
    finally:
        sys.meta_path.remove(hide)
    if "pandas" in sys.modules:  # pyarrow had looked before us (or imported it regardless)
        return False
    sys.meta_path.insert(0, _REARM)
    return True


__all__ = ["defer_pandas"]
