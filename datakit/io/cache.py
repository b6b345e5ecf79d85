"""The per-user cache folder: `$DATAKIT_CACHE_DIR`, else `~/.cache/datakit`.

Why one place: the decontamination reference index, the local scratch of object-store runs,
the Spark driver's class-data archive and the PII scanner's compiled hyperscan databases all
live under it, and a user who moves it (a read-only home, a bigger disk) moves all of them with
one variable.
"""
from __future__ import annotations

import os


def root() -> str:
    return os.environ.get("DATAKIT_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "datakit")
