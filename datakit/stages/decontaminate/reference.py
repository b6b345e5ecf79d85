"""A reference corpus of code at large: eval n-grams found there are boilerplate, not evidence.

Why a reference corpus and not "n-grams shared between evals": related sets
(HumanEval and HumanEval+, MBPP and sanitized MBPP) share their items, so
dropping what two evals share blinds a joint check to exactly the leaks each
finds alone. Whether an n-gram is boilerplate (`for i in range(len(arr)):`,
`if __name__ == "__main__":`) is a property of code in general.

The corpus is the Python standard library of the running interpreter (~11 MB of
code on 3.11, always present, never downloaded). An eval n-gram is common when
it occurs in at least `MIN_FILES` of its files. What was used is recorded in the
report (`settings.reference`: Python version, files, bytes, digest), since the
stdlib differs between Python versions.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import sysconfig
import zipfile

import numpy as np
import pyarrow as pa

from datakit.io import cache

MIN_FILES = 2
_SKIP = (os.sep + "test" + os.sep, os.sep + "tests" + os.sep, os.sep + "idlelib" + os.sep, "site-packages",
         "dist-packages")
_MEMO: dict[str, tuple[np.ndarray, dict]] = {}


def _files() -> list[str]:
    root = sysconfig.get_paths()["stdlib"]
    files = []
    for d, subdirs, names in os.walk(root):
        subdirs[:] = sorted(x for x in subdirs if not any(k in os.path.join(d, x) + os.sep for k in _SKIP))
        files += [os.path.join(d, f) for f in names if f.endswith(".py")]
    return sorted(files)


def _key(files: list[str], views: tuple[tuple[int, int], ...]) -> str:
    """Everything the common set depends on: the files (path, size, mtime), n, the views, the rule, and
    the tokenizer/hash code itself (the source of normalize.py and ngrams.py)."""
    from datakit.stages.decontaminate import ngrams, normalize

    h = hashlib.sha256()
    for mod in (normalize, ngrams):
        with open(mod.__file__, "rb") as fh:
            h.update(fh.read())
    st = [(f, os.stat(f).st_size, os.stat(f).st_mtime_ns) for f in files]
    h.update(json.dumps([sys.version, st, [list(v) for v in views], MIN_FILES]).encode())
    return h.hexdigest()[:32]


def _cache_dir() -> str:
    return cache.root()


def _build(files: list[str], views: tuple[tuple[int, int], ...]) -> tuple[np.ndarray, dict]:
    """Hashes of every n-gram (any view) found in >= MIN_FILES of the files, sorted; and a description."""
    from datakit.stages.decontaminate.ngrams import arrow_text_buffers, hash_strings

    texts, digest = [], hashlib.sha256()
    for f in files:
        try:
            with open(f, "rb") as fh:
                raw = fh.read()
        except OSError:
            continue
        digest.update(raw)
        texts.append(raw.decode("utf-8", "replace"))
    data, offs = arrow_text_buffers(pa.array(texts, pa.large_string()))
    hs, ss = [], []
    for vn, vf in views:
        h, s, _, _ = hash_strings(data, offs, vn, vf)
        hs.append(h)
        ss.append(s)
    H, S = np.concatenate(hs), np.concatenate(ss)
    order = np.lexsort((S, H))
    H, S = H[order], S[order]
    first = np.ones(len(H), bool)
    first[1:] = (H[1:] != H[:-1]) | (S[1:] != S[:-1])
    uh, cnt = np.unique(H[first], return_counts=True)
    info = {"name": "stdlib", "python": f"{sys.version_info.major}.{sys.version_info.minor}", "files": len(texts),
            "bytes": int(sum(len(t) for t in texts)), "digest": digest.hexdigest()[:16], "min_files": MIN_FILES}
    return uh[cnt >= MIN_FILES], info


def common_set(views: tuple[tuple[int, int], ...]) -> tuple[np.ndarray, dict]:
    """The corpus's common n-grams for `views` ((n, flags) pairs): from memory, the disk cache, or built (then cached).

    The cache file is keyed on everything it depends on (`_key`), so a stale one
    is never read; an unwritable cache folder only costs the build (~seconds).
    """
    files = _files()
    key = _key(files, views)
    if key in _MEMO:
        return _MEMO[key]
    path = os.path.join(_cache_dir(), "reference", f"stdlib-{key}.npz")
    try:
        with np.load(path) as z:
            out = (z["hashes"], json.loads(str(z["info"])))
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):  # missing or damaged: built again
        # (an empty file was "Aborted!", a truncated one a BadZipFile traceback, both exit 1: found in review)
        out = _build(files, views)
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tmp = f"{path}.{os.getpid()}.tmp.npz"
            np.savez(tmp, hashes=out[0], info=np.array(json.dumps(out[1], sort_keys=True)))
            os.replace(tmp, path)
        except OSError:
            pass
    _MEMO[key] = out
    return out


def common_hashes(hashes: np.ndarray, views: tuple[tuple[int, int], ...], name: str = "stdlib"
                  ) -> tuple[np.ndarray, dict]:
    """Which of `hashes` occur in >= MIN_FILES files of the reference corpus under any of `views`."""
    if name != "stdlib":
        raise ValueError(f"unknown reference corpus {name!r}")
    common, info = common_set(views)
    pos = np.searchsorted(common, hashes)
    pos[pos >= len(common)] = 0
    hit = (common[pos] == hashes) if len(common) else np.zeros(len(hashes), bool)
    return hashes[hit], info
