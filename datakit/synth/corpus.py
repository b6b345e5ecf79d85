"""Real source text for the synthetic logs, read at run time.

Why real text: dedup, PII and tokenizer stages behave very differently on
lorem ipsum than on code; the Python standard library (and CPython's C headers)
exist on every machine that runs datakit, so lengths, style and languages are
real while nothing has to be downloaded. A few other languages come bundled.

The corpus is cut into a fixed *pool* of non-overlapping chunks (deterministic,
independent of the seed). The generator walks the pool, so two events share a
code window only when the pool wraps around (`Corpus.size` chunks): below that
every duplicate in the logs is a planted one.
"""
from __future__ import annotations

import sysconfig
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from datakit.synth.bundled import BUNDLED_FILES

PYENV_STDLIB = Path("/root/.pyenv/versions/3.11.7/lib/python3.11")
PYENV_INCLUDE = Path("/root/.pyenv/versions/3.11.7/include/python3.11")

# Folders of the stdlib that are generated tables, vendored wheels or test *data*
# (deliberately broken or Python-2 files): not what developers type, and a source
# of natural near-duplicates. Tests themselves are kept: people write tests.
_SKIP_DIRS = {"site-packages", "__pycache__", "encodings", "lib2to3", "ensurepip", "pydoc_data",
              "config-3.11-x86_64-linux-gnu", "leakers", "encoded_modules", "tokenizedata", "test_import",
              "test_importlib", "badsyntax", "typinganndata", "dtracedata", "test_tools"}
_SKIP_FILE_MARKERS = ("bad", "nosyntax")
_MAX_FILE_BYTES = 300_000
MIN_CHUNK_LINES = 20
TARGET_CHUNK_LINES = 45
MAX_CHUNK_LINES = 90

LANG_BY_SUFFIX = {
    ".py": "python", ".h": "c", ".c": "c", ".cpp": "cpp", ".js": "javascript", ".ts": "typescript",
    ".tsx": "typescript", ".go": "go", ".rs": "rust", ".sh": "shell", ".sql": "sql", ".yaml": "yaml",
    ".java": "java", ".scala": "scala", ".pyx": "cython", ".rb": "ruby", ".toml": "toml",
}


@dataclass(frozen=True)
class Chunk:
    """One code window: `lines[start:end]` of source `source` (an index into `Corpus.sources`)."""

    source: int
    start: int
    end: int


@dataclass(frozen=True)
class SourceFile:
    """A file of the corpus: where it came from and the repo-relative path events show."""

    origin: str  # "stdlib:<rel>", "include:<rel>", "bundled:<name>"
    path: str  # path inside a synthetic repo, e.g. "src/json/decoder.py"
    language: str


def _stdlib_root() -> Path | None:
    if PYENV_STDLIB.is_dir():
        return PYENV_STDLIB
    p = Path(sysconfig.get_paths()["stdlib"])
    return p if p.is_dir() else None


def _include_root() -> Path | None:
    if PYENV_INCLUDE.is_dir():
        return PYENV_INCLUDE
    p = Path(sysconfig.get_paths()["include"])
    return p if p.is_dir() else None


def _walk(root: Path, suffix: str) -> list[Path]:
    out = []
    for p in sorted(root.rglob(f"*{suffix}")):
        rel = p.relative_to(root)
        if any(part in _SKIP_DIRS or part.startswith(".") or "data" in part for part in rel.parts[:-1]):
            continue
        if any(m in p.name for m in _SKIP_FILE_MARKERS):
            continue
        try:
            if p.stat().st_size > _MAX_FILE_BYTES or not p.is_file():
                continue
        except OSError:
            continue
        out.append(p)
    return out


def _chunk_lines(lines: list[str], language: str) -> list[tuple[int, int]]:
    """Cut a file into windows of ~60 lines, preferring to start at a top-level definition."""
    starts = ("def ", "class ", "async def ", "@") if language == "python" else ("", )
    spans: list[tuple[int, int]] = []
    i, n = 0, len(lines)
    while i < n:
        j = min(n, i + MIN_CHUNK_LINES)
        while j < n and j - i < MAX_CHUNK_LINES:
            if j - i >= TARGET_CHUNK_LINES and (language != "python" or lines[j].startswith(starts)):
                break
            if language != "python" and j - i >= TARGET_CHUNK_LINES:
                break
            j += 1
        if n - j < MIN_CHUNK_LINES // 2:  # do not leave a tiny tail
            j = n
        body = "".join(lines[i:j])
        if j - i >= MIN_CHUNK_LINES // 2 and len(body.strip()) >= 400:
            spans.append((i, j))
        i = j
    return spans


class Corpus:
    """The chunk pool plus lazy, cached access to file lines.

    `python`, `c`, and `other` pools are kept apart so the generator can pick a
    language mix independently of how much text each language has.
    """

    def __init__(self, include_c: bool = True, include_bundled: bool = True,
                 extra_roots: tuple[str, ...] = ()) -> None:
        self.sources: list[SourceFile] = []
        self._paths: list[Path | None] = []
        self.pools: dict[str, list[Chunk]] = {"python": [], "c": [], "other": []}
        self._bundled: dict[int, list[str]] = {}
        root = _stdlib_root()
        if root is not None:
            for p in _walk(root, ".py"):
                self._add(p, SourceFile(f"stdlib:{p.relative_to(root)}", "src/" + str(p.relative_to(root)), "python"), "python")
        inc = _include_root()
        if include_c and inc is not None:
            for p in _walk(inc, ".h"):
                self._add(p, SourceFile(f"include:{p.relative_to(inc)}", "include/" + str(p.relative_to(inc)), "c"), "c")
        for i, extra in enumerate(extra_roots):
            # opt-in: more languages from folders of this machine (e.g. a checkout, site-packages);
            # the logs then depend on what those folders hold, so they are reproducible only where they are equal
            base = Path(extra)
            for suffix in sorted(LANG_BY_SUFFIX):
                for p in _walk(base, suffix):
                    lang = LANG_BY_SUFFIX[suffix]
                    pool = "python" if lang == "python" else ("c" if lang == "c" else "other")
                    self._add(p, SourceFile(f"extra{i}:{p.relative_to(base)}", f"{base.name}/{p.relative_to(base)}", lang), pool)
        if include_bundled or not self.pools["python"]:
            for name in sorted(BUNDLED_FILES):
                lang = LANG_BY_SUFFIX.get(Path(name).suffix, "text")
                pool = "python" if lang == "python" else ("c" if lang == "c" else "other")
                self._add(None, SourceFile(f"bundled:{name}", name, lang), pool, text=BUNDLED_FILES[name])
        for k in [k for k, v in self.pools.items() if not v]:
            del self.pools[k]
        if not self.pools:
            raise RuntimeError("no source text found for the synthetic corpus")

    def _add(self, path: Path | None, sf: SourceFile, pool: str, text: str | None = None) -> None:
        if text is None:
            try:
                text = path.read_text(encoding="utf-8")  # type: ignore[union-attr]
            except (OSError, UnicodeDecodeError):
                return
        lines = text.splitlines(keepends=True)
        spans = _chunk_lines(lines, sf.language)
        if not spans:
            return
        idx = len(self.sources)
        self.sources.append(sf)
        self._paths.append(path)
        if path is None:
            self._bundled[idx] = lines
        self.pools[pool].extend(Chunk(idx, s, e) for s, e in spans)

    @property
    def size(self) -> int:
        return sum(len(v) for v in self.pools.values())

    def lines(self, source: int) -> list[str]:
        path = self._paths[source]
        if path is None:
            return self._bundled[source]
        return _read_lines(str(path))

    def text(self, chunk: Chunk) -> str:
        return "".join(self.lines(chunk.source)[chunk.start:chunk.end])


@lru_cache(maxsize=64)
def _read_lines(path: str) -> list[str]:
    return Path(path).read_text(encoding="utf-8").splitlines(keepends=True)


@lru_cache(maxsize=4)
def shared_corpus(extra_roots: tuple[str, ...] = ()) -> Corpus:
    """One Corpus per process and set of roots: scanning ~1 500 files takes a second or two,
    and tests generate many small log sets. A Corpus is read-only after construction (so a folder
    in `extra_roots` is read once per process: later edits to it are not seen)."""
    return Corpus(extra_roots=extra_roots)

