"""Every module of the package compiles with warnings as errors.

Found in a Python API review: docstrings in `stages/scrub_pii/detectors.py` held invalid escapes (`\\``, `\\<`):
a DeprecationWarning at compile time (a SyntaxError under `-W error`), a SyntaxWarning on Python 3.12+, and
`\\t` meant as text was a tab. Compiled from source here, so a cached .pyc cannot hide one."""
from __future__ import annotations

import warnings
from pathlib import Path

import datakit

PACKAGE = Path(datakit.__file__).resolve().parent


def test_every_module_compiles_without_a_warning():
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 50
    failed = []
    for path in files:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            try:
                compile(path.read_text(encoding="utf-8"), str(path), "exec")
            except (SyntaxError, Warning) as e:
                failed.append(f"{path.relative_to(PACKAGE.parent)}: {type(e).__name__}: {e}")
    assert not failed, "\n".join(failed)
