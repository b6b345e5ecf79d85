"""The `datakit` command: run/explain pipelines, generate synthetic logs, check contamination, inspect output.

Exit codes (scripts and CI gates rely on them): 0 success, 1 a check failed
(e.g. contamination found), 2 usage or input error (bad pipeline file, missing
input) with a one-line message on stderr, 3 the job itself failed.
"""
from __future__ import annotations

import sys

if sys.argv[:1] == ["-m"]:  # `python -m datakit.cli` is being started: restart first, as the console script does
    from datakit.launch import restart_for_module_run

    restart_for_module_run()

import json  # noqa: E402
import logging  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import List, Optional  # noqa: E402

import typer  # noqa: E402

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  help="Turn AI-code-editor logs into training data: run pipelines, make synthetic logs, "
                       "check eval contamination, inspect packed datasets.")

log = logging.getLogger("datakit")

# the libraries whose versions decide output bytes or speed, named by `datakit --version` (what a bug report needs)
_VERSION_OF = ("pyarrow", "polars", "numpy", "numba", "tokenizers", "spacy", "pyspark")


def version_line() -> str:
    """`datakit X.Y.Z (Python A.B.C; pyarrow ..., pyspark not installed)`: this installation, in one line."""
    import platform
    from importlib import metadata

    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "not installed"

    mine = version("datakit")
    mine = mine if mine != "not installed" else "(a source checkout, not installed)"
    libs = ", ".join(f"{n} {version(n)}" for n in _VERSION_OF)
    return f"datakit {mine} (Python {platform.python_version()}; {libs})"


def _print_version(value: bool) -> None:
    if value:
        typer.echo(version_line())
        raise typer.Exit()


@app.callback()
def _main(version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                       help="Print datakit's version and its main libraries', then exit.")) -> None:
    """Turn AI-code-editor logs into training data: run pipelines, make synthetic logs, check eval
    contamination, inspect packed datasets."""


def _fail(msg: str, code: int = 2) -> None:
    """One line on stderr, redacted like every log line (an error may quote data: a stage's exception
    message, a value a check rejected), then exit with `code`."""
    from datakit.logs import _redact, error_line

    typer.echo(error_line(_redact(msg)), err=True)
    raise typer.Exit(code)


def _paths_given(*paths: str) -> None:
    """Refuse an empty path argument (an unset shell variable), as `run --input ""` and the library do
    (`io.fs.refuse_empty_path`): `validate ""` and the like read it as the current folder (found in review)."""
    from datakit.io.fs import InputError, refuse_empty_path

    try:
        for p in paths:
            refuse_empty_path(p)
    except InputError as e:
        _fail(str(e))


def _error_text(e: BaseException) -> str:
    """The one line an error says: its message, or for an OS error "PATH: reason" (an OSError's first
    argument is its errno, which `_fail` cannot print: found in a hostile-input review, `diff` of a
    Parquet output missing a data file failed "unexpectedly (AttributeError)", exit 3)."""
    if isinstance(e, OSError) and e.strerror:
        return f"{e.filename}: {e.strerror}" if e.filename else e.strerror
    text = str(e.args[0]) if len(e.args) == 1 else str(e)
    return text.splitlines()[0] if text else type(e).__name__


def _write_report(path: str, text: str) -> None:
    """A report the user asked for (`--json`, `--html`) at `path` (io/atomic.write_user_file: `-` is
    standard output, links and devices are written through); a path it cannot write is one line, exit 2."""
    from datakit.io.atomic import write_user_file

    try:
        write_user_file(path, text.encode())
    except OSError as e:
        _fail(f"cannot write {path}: {e.strerror or e}" if e.strerror else str(e))


def engine_error(e: BaseException, where: str) -> tuple[int, str] | None:
    """(exit code, one line) for an engine, Spark or storage failure (a read error of a damaged file
    included): 2 for a mistyped master or setting, else 3; None for anything else (a bug)."""
    if type(e).__name__ in ("SparkMasterURLError", "SparkConfError"):  # a mistyped --master or setting: usage
        return 2, str(e)
    if type(e).__name__ in ("EngineError", "SparkSetupError", "SparkJobError", "IndexBuildError", "StorageError",
                            "OutputBusyError", "StageOutputError", "StageError", "AccountingError"):
        return 3, str(e)
    from datakit.io import storage

    if storage.is_storage_error(e):  # raised outside any task that could name its path
        return 3, str(storage.describe(e, where, "read or write under"))
    return None


def run_error(e: BaseException, where: str) -> tuple[int, str] | None:
    """(exit code, one line) that `datakit run` gives for an error of `Pipeline.run`: 2 a bad pipeline,
    input or option; 1 a quality gate failed (nothing published); 3 the job failed (engine, Spark,
    storage, a busy output folder); None for an error nothing expected (a bug: let it raise). For
    programs that run pipelines as the command does (examples/spark_driver.py under spark-submit)."""
    from datakit.engines import EngineOptionError
    from datakit.io.fs import InputError
    from datakit.pipeline import PipelineError
    from datakit.quality.expect import QualityGateError

    if isinstance(e, (PipelineError, InputError, EngineOptionError)):
        return 2, str(e)
    if isinstance(e, QualityGateError):
        return 1, str(e)
    return engine_error(e, where)


def _fail_engine_error(e: Exception, where: str) -> None:
    """Exit with one line for an engine, Spark or storage failure (`engine_error`); return for anything
    else, which the caller re-raises."""
    got = engine_error(e, where)
    if got is not None:
        _fail(got[1], got[0])


def _print_stages(stages: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="per-stage counts")
    for col in ("stage", "rows in", "rows out", "emitted", "dropped (by reason)", "s"):
        t.add_column(col, justify="right" if col in ("rows in", "rows out", "emitted", "s") else "left")
    for s in stages:
        dropped = "\n".join(f"{k}={v}" for k, v in s["dropped"].items()) or "-"
        t.add_row(s["name"], str(s["rows_in"]), str(s["rows_out"]), str(s.get("emitted", "")), dropped,
                  f"{s['seconds']:.2f}")
    Console(stderr=False, width=max(100, Console().width)).print(t)


_ENGINE_ONLY = {"master": "spark", "partitions": "spark", "conf": "spark", "workers": "local"}


def _refuse_other_engine_options(engine: str, **given: object) -> None:
    """Exit 2 when an option of the other engine was given (`--partitions 4` on the local engine).

    Why: each command passed only its engine's options on, so the others were dropped without a
    word (found in review: `datakit run p.yaml --master local[2] --conf a=b` ran on the local engine,
    exit 0), while a user who typed them meant a Spark run."""
    wrong = [f"--{k}" for k, v in given.items() if v not in (None, [], ()) and _ENGINE_ONLY.get(k, engine) != engine]
    if wrong and engine in ("local", "spark"):
        other = "spark" if engine == "local" else "local"
        _fail(f"{', '.join(wrong)} {'applies' if len(wrong) == 1 else 'apply'} to --engine {other} only "
              f"(this command runs on --engine {engine})")


def _conf_pairs(conf: List[str]) -> dict[str, str]:
    """`--conf KEY=VALUE` options as a dict (a value may itself contain `=`); anything else is a usage
    error (found in review: `--conf KEY` was a ValueError traceback, exit 1)."""
    bad = [c for c in conf if "=" not in c or not c.split("=", 1)[0].strip()]
    if bad:
        _fail(f"--conf {bad[0]!r}: expected KEY=VALUE (e.g. --conf spark.executor.memory=4g)")
    return dict(c.split("=", 1) for c in conf)


def _start_spark_early(pipeline: Path, master: Optional[str], conf: List[str]) -> None:
    """`datakit run --engine spark`: the Spark session starts before the pipeline is read and compiled.

    Why: the session's ~3.5 s are nearly all the JVM's, and the driver has ~1 s of Python to do
    before it needs them (importing the stages, parsing, compiling); this overlaps the two. The
    session asked for is the one the run will ask for (the file's `spark:` block under --conf, as
    `Pipeline.run` merges them); if the run asks for another after all, `get_session` replaces it.
    Anything unreadable here is left for the run to report, so this never fails a run itself.
    Only in the command's own process: a session started in the background of someone else's
    process (a test's CliRunner) is not ours to start.
    """
    if any("=" not in c for c in conf):
        return  # the run says what is wrong with it (`_conf_pairs`)
    try:
        import yaml

        from datakit.engines.spark_partitions import check_user_conf
        from datakit.engines.spark_session import merged_conf, prestart_session

        data = yaml.safe_load(pipeline.read_text())
        block = data.get("spark") if isinstance(data, dict) else None
        merged = merged_conf(block if isinstance(block, dict) else {}, _conf_pairs(conf))
        check_user_conf(merged)
    except Exception:  # noqa: BLE001 - the run itself reports what is wrong
        return
    prestart_session(master, merged)


@app.command()
def run(
    pipeline: Path = typer.Argument(..., help="Pipeline YAML file (`datakit init` writes a ready one; see schemas/pipeline.v1.json)."),
    engine: str = typer.Option("local", help="local (embedded, no JVM) or spark."),
    master: Optional[str] = typer.Option(None, help="Spark master URL, e.g. local[4] or spark://host:7077."),
    input: Optional[List[str]] = typer.Option(None, "--input", help="Override the pipeline's input path/glob "
                                              "(repeatable; relative to the current folder)."),
    output: Optional[str] = typer.Option(None, "--output", help="Override the pipeline's output path "
                                         "(relative to the current folder)."),
    snapshot: Optional[str] = typer.Option(None, "--snapshot", help="output mode append: the snapshot this run writes "
                                           "(default: the input's partition folder, e.g. dt=2026-11-02)."),
    workers: Optional[int] = typer.Option(None, help="Local engine: worker processes (default: all cores; "
                                          "a small input runs in this process)."),
    partitions: Optional[int] = typer.Option(None, help="Spark engine: number of partitions."),
    conf: Optional[List[str]] = typer.Option(None, "--conf", help="Spark setting KEY=VALUE (repeatable)."),
    json_out: bool = typer.Option(False, "--json", help="Print the output path and per-stage counts as JSON "
                                  "instead of a table (the whole run report is OUTPUT/_run.json)."),
    report: bool = typer.Option(True, "--report/--no-report", help="Write OUTPUT/_report.html (plots of the run)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress and no table; warnings and errors only."),
    log_format: str = typer.Option("text", "--log-format", help="text, or json: one JSON object per line "
                                   "(progress with rows, rate and ETA) for schedulers."),
) -> None:
    """Run a pipeline file end to end and print per-stage counts (also written to OUTPUT/_run.json)."""
    if log_format not in ("text", "json"):
        _fail(f"unknown --log-format {log_format!r}; choose text or json")
    from datakit.logs import configure

    configure(log_format, quiet)  # type: ignore[arg-type]
    _refuse_other_engine_options(engine, master=master, partitions=partitions, conf=conf, workers=workers)
    if _COMMAND_PROCESS:  # this process exists for this run: its start-up and its workers' exit are timed too
        from datakit.run_timing import one_run_process

        one_run_process()
        if engine == "spark":  # before the imports below: they are part of what the JVM's start overlaps
            _start_spark_early(pipeline, master, conf or [])
    from datakit.engines import EngineOptionError
    from datakit.io.fs import InputError
    from datakit.pipeline import Pipeline, PipelineError
    from datakit.quality.expect import QualityGateError

    p = None
    try:
        p = Pipeline.from_yaml(pipeline)
        opts: dict = {}
        if engine == "local":
            opts["workers"] = workers
        elif engine == "spark":
            opts.update(master=master, partitions=partitions,
                        conf=_conf_pairs(conf or []))
        else:
            _fail(f"unknown engine {engine!r}; choose local or spark")
        # paths typed on the command line are the shell's: relative to the current folder, as `Pipeline.run`
        # takes them (the file's own paths stay relative to the file)
        result = p.run(engine=engine, input=list(input) if input else None, output=output, report=report,
                       snapshot=snapshot, **opts)
    except (PipelineError, InputError, EngineOptionError) as e:
        _fail(str(e))
    except QualityGateError as e:  # an `error` expectation failed: nothing was published
        _fail(str(e), 1)
    except ImportError as e:
        _fail(f"{e} (is the engine's package installed? `make venv` installs everything)")
    except Exception as e:  # an engine/runtime failure: short message, detail in the log
        # a storage error raised outside any task names the output (found in review: it named the pipeline file)
        out_path = p.config.output.path if p is not None and p.config.output is not None else None
        _fail_engine_error(e, output or out_path or ", ".join(input or []) or str(pipeline))
        raise
    if json_out:
        doc: dict = {"output": result.output_path, "stages": result.stages}
        if p.config.output is not None and p.config.output.mode == "append":
            # the snapshots this dataset holds out until they are rerun (a redo of an earlier day withdraws the
            # later ones): a scheduler reading --json saw a plain success (found in an operations review)
            from datakit.io.snapshots import SNAPSHOTS_DIR, read_top

            top = str(result.output_path).split(f"/{SNAPSHOTS_DIR}/")[0]  # the run reports its snapshot's folder
            doc["withdrawn"] = [w["id"] for w in (read_top(top) or {}).get("withdrawn", [])]
        typer.echo(json.dumps(doc, indent=2))
    elif quiet:
        pass
    elif log_format == "json":
        log.info("run finished: %s rows to %s", result.manifest["rows"] if result.manifest else 0,
                 result.output_path, extra={"progress": {"step": "run", "done": True, "seconds": round(result.seconds, 3),
                                                        "stages": [{k: s[k] for k in ("name", "rows_in", "rows_out")}
                                                                   for s in result.stages]}})
    else:
        _print_stages(result.stages)
        timing = (result.extra or {}).get("timing")
        w = (timing or {}).get("workers") or {}
        kernels = (timing or {}).get("numba_compile", 0) + (timing or {}).get("numba_load", 0) \
            + w.get("numba_compile", 0) + w.get("numba_load", 0)
        took = (f"stages {result.seconds:.1f}s of {timing['total']:.1f}s total; compile "
                f"{timing['parts']['compile']:.1f}s, numba kernels {kernels:.1f}s"
                + (f", {w['processes']} workers {w['cpu_seconds']:.1f} CPU-s" if w else "") + ", see _run.json"
                if timing else f"{result.seconds:.1f}s")
        if result.output_path is None:  # found in review: "output: None  (0 rows ...)" after rows were made
            last = result.stages[-1]["rows_out"] if result.stages else 0
            typer.echo(f"no output: the pipeline has no `output:` (nothing written; its last stage made {last} rows; {took})")
        else:
            typer.echo(f"output: {result.output_path}  ({result.manifest['rows'] if result.manifest else 0} rows, {took})")
        fb = (result.extra or {}).get("feedback")
        if fb:  # reward summaries of a kto output: the first thing to look at before training on it
            t = fb["total"]
            typer.echo(f"rewards: {t['examples']} examples, acceptance {t['acceptance_rate']:.1%}, label rate "
                       f"{t['label_rate']:.1%}, mean reward {t['mean_reward']:.3f}  ({fb['file']})")
    _COMMAND_DONE.append(True)


@app.command()
def forget(
    dataset: str = typer.Argument(..., help="An append-mode dataset (output mode: append)."),
    optouts: List[str] = typer.Option(..., "--optouts", help="Deletion list file(s)/glob(s): user_id, org_id "
                                      "and/or event_id columns (as for the forget stage; repeatable)."),
    engine: str = typer.Option("local", help="local or spark."),
    master: Optional[str] = typer.Option(None, help="Spark engine: master URL, e.g. spark://host:7077."),
    conf: Optional[List[str]] = typer.Option(None, "--conf", help="Spark setting KEY=VALUE (repeatable)."),
    workers: Optional[int] = typer.Option(None, help="Local engine: worker processes."),
    json_out: bool = typer.Option(False, "--json", help="Print {dataset, removed: {snapshot: rows}} as JSON."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress and no per-snapshot lines."),
    log_format: str = typer.Option("text", "--log-format", help="text, or json: one JSON object per line "
                                   "for schedulers (as `datakit run`)."),
) -> None:
    """Apply a deletion list to every snapshot of a dataset and to its dedup state (docs/scheduling.md)."""
    _paths_given(dataset, *optouts)
    # the options a scheduled job passes to `run` (found in an operations review: a deletion job on a
    # cluster could not name its master, and its log lines were text among a scheduler's JSON)
    if log_format not in ("text", "json"):
        _fail(f"unknown --log-format {log_format!r}; choose text or json")
    from datakit.logs import configure

    configure(log_format, quiet)  # type: ignore[arg-type]
    if engine not in ("local", "spark"):
        _fail(f"unknown engine {engine!r}; choose local or spark")
    _refuse_other_engine_options(engine, master=master, conf=conf, workers=workers)
    from datakit.io.fs import InputError
    from datakit.forget_snapshots import forget as forget_snapshots
    from datakit.pipeline import PipelineError

    opts = {"workers": workers} if engine == "local" else {"master": master, "conf": _conf_pairs(conf or [])}
    try:
        removed = forget_snapshots(dataset, list(optouts), engine=engine, **opts)
    except (PipelineError, InputError) as e:
        _fail(str(e))
    except Exception as e:
        _fail_engine_error(e, dataset)
        raise
    if json_out:
        typer.echo(json.dumps({"dataset": dataset, "removed": removed}, indent=2))
    elif quiet:
        pass
    elif log_format == "json":
        log.info("forget finished: %d record(s) removed", sum(removed.values()),
                 extra={"progress": {"step": "forget", "done": True, "removed": removed}})
    else:
        for snap, n in removed.items():
            typer.echo(f"{snap}: {n} record(s) removed")
    _COMMAND_DONE.append(True)


@app.command()
def explain(
    pipeline: Path = typer.Argument(..., help="Pipeline YAML file."),
    input: Optional[List[str]] = typer.Option(None, "--input", help="Override the input path/glob."),
    format: str = typer.Option("text", "--format", help="text (each node once, inputs by #id) or dot (Graphviz)."),
) -> None:
    """Print the logical plan a pipeline compiles to (nodes, stages, sink) without running it."""
    if format not in ("text", "dot"):
        _fail(f"unknown --format {format!r}; choose text or dot")
    from datakit.io.fs import InputError
    from datakit.pipeline import Pipeline, PipelineError

    try:
        override = list(input) if input else None  # relative to the current folder (`Pipeline.compile`)
        typer.echo(Pipeline.from_yaml(pipeline).explain(format, input_override=override))
    except (PipelineError, InputError) as e:
        _fail(str(e))


@app.command()
def init(
    name: Optional[str] = typer.Argument(None, help="A ready pipeline (quickstart, code, fim, sft, longctx, "
                                         "preference, feedback); none: list them."),
    folder: Path = typer.Option(Path("."), "--dir", help="Folder to write NAME.yaml into (default: here)."),
    force: bool = typer.Option(False, "--force", help="Replace an existing NAME.yaml."),
) -> None:
    """Write a ready pipeline into a folder of yours, reading logs/ and writing out/NAME there.

    The pipelines `make demo` runs in a checkout, for an installed package:
    datakit init quickstart && datakit synth logs --events 3000 && datakit run quickstart.yaml
    """
    from datakit.cli.init import DEFAULT_SYNTH_ARGS, SYNTH_ARGS, InitError, summaries, write_starter

    if name is None:
        for n, what in summaries().items():
            typer.echo(f"{n:<12} {what}")
        return
    try:
        dest = write_starter(name, folder, force=force)
    except InitError as e:
        _fail(str(e))
    except OSError as e:  # an unwritable folder: one line, as every other command
        _fail(f"{folder}: cannot write the pipeline ({e.strerror or type(e).__name__})")
    typer.echo(f"wrote {dest}; next: datakit synth {folder / 'logs'} {SYNTH_ARGS.get(name, DEFAULT_SYNTH_ARGS)} && "
               f"datakit run {dest}")


@app.command()
def synth(
    out_dir: Path = typer.Argument(..., help="Folder to write dt=YYYY-MM-DD/part-*.jsonl.zst logs into."),
    events: int = typer.Option(1000, help="Number of events (100 to millions; streamed)."),
    seed: int = typer.Option(0, help="Seed: same seed, byte-identical files."),
    days: int = typer.Option(3, help="Days of activity (one dt=YYYY-MM-DD folder each)."),
    start_date: str = typer.Option("2026-11-01", help="First day, YYYY-MM-DD."),
    rows_per_part: int = typer.Option(100_000, help="Events per part file before a new one starts."),
    repositories: int = typer.Option(0, help="Multi-file repository projects (imports, feedback ground truth) on top."),
) -> None:
    """Generate realistic synthetic editor logs with planted duplicates, PII, leaks and bad lines.

    Writes OUT_DIR/dt=*/part-*.jsonl.zst, optouts.parquet, and the ground truth
    _ground_truth.jsonl (schemas/synth_ground_truth.v1.json) that tests score against.
    Run again into the same folder, it replaces only what it wrote there before (the files
    its _synth.json lists); a folder holding files of those names that it did not write
    (no _synth.json) is refused (exit 2). Other files there are left as they are, beside the new logs.
    """
    from datakit import synth as synth_mod

    if out_dir.exists() and not out_dir.is_dir():
        _fail(f"{out_dir}: is a file; give a folder to write the logs into")
    try:
        summary = synth_mod.generate(str(out_dir), events=events, seed=seed, days=days, start_date=start_date,
                                     rows_per_part=rows_per_part, repositories=repositories)
    except OSError as e:  # an unwritable folder, a full disk: one line, as every other command
        _fail(f"{out_dir}: cannot write the logs ({e.strerror or type(e).__name__})")
    except synth_mod.SynthArgumentError as e:  # --days 0, --start-date 2026-13-01: usage, one line
        _fail(f"synth: {e}")
    typer.echo(json.dumps(summary, indent=2, default=str))


@app.command()
def validate(
    path: str = typer.Argument(..., help="A committed datakit output (folder or URL with manifest.json)."),
    suite: Optional[List[str]] = typer.Option(None, "--suite", help="Suite name from quality/ (repeatable; "
                                              "default: the suites of the output's last stage)."),
    engine: str = typer.Option("local", help="local or spark: where the checks run (per shard/partition)."),
    master: Optional[str] = typer.Option(None, help="Spark master URL."),
    workers: Optional[int] = typer.Option(None, help="Local engine: worker processes."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Also write the results as JSON here "
                                            "('-': standard output; the lines for people then go to stderr)."),
) -> None:
    """Run quality suites on an existing dataset. Exit 0 all pass, 1 a check failed, 2 usage/input error (a data
    file missing, truncated or unreadable as an array: one line naming it), 3 engine or storage error (e.g. a
    shard whose contents fail to decode mid-run)."""
    _paths_given(path)
    from datakit.quality.expect import failure_line
    from datakit.quality.gx import list_suites
    from datakit.quality.validate import validate_path

    known = list_suites()
    for name in suite or []:
        if name not in known:
            _fail(f"no quality suite {name!r}; known: {', '.join(known)}")
    if engine not in ("local", "spark"):
        _fail(f"unknown engine {engine!r}; choose local or spark")
    _refuse_other_engine_options(engine, master=master, workers=workers)
    opts = {"workers": workers} if engine == "local" else {"master": master}
    from datakit.io.fs import InputError

    try:
        res = validate_path(path, list(suite) if suite else None, engine, **opts)
    except (FileNotFoundError, InputError, ValueError) as e:  # (an OSError's first arg is its errno)
        _fail(str(e.args[0] if e.args and not isinstance(e, OSError) else e))
    except Exception as e:  # a damaged shard, a failed engine: one line, exit 3 (1 means a check failed)
        _fail_engine_error(e, path)
        raise
    if not res["results"] and suite:  # the suites named: "name one with --suite" would send the user in a circle
        lacks = sorted({c for k in res.get("skipped", []) for c in k["columns"]})
        _fail(f"{path}: no check of {', '.join(suite)} applies to this output"
              + (f" (its checks read {', '.join(lacks)}, which it lacks)" if lacks else ""))
    if not res["results"]:
        _fail(f"{path}: no suite applies (name one with --suite; known: {', '.join(known)})")
    if json_out:
        _write_report(str(json_out), json.dumps(res, indent=2))
    to_err = str(json_out) == "-"  # the JSON went to standard output: the lines for people go to stderr
    for r in res["results"]:
        status = "ok  " if r["success"] else ("FAIL" if r["severity"] == "error" else "warn")
        cols = ", ".join(str(r[k]) for k in ("column", "column_A", "column_B") if k in r)
        typer.echo(f"{status} {r.get('suite', '')}: {r['type']}({cols}) {r['unexpected']}/{r['rows']}", err=to_err)
    for r in res["results"]:
        if not r["success"] and r["severity"] == "error":
            typer.echo(failure_line("validate", r).replace("quality gate failed at stage 'validate'", "datakit: check failed"),
                       err=True)
    for k in res.get("skipped", []):  # a suite's checks this output has no columns for: said, not hidden
        typer.echo(f"skip {k['suite']}: {k['type']}({', '.join(k['columns'])}): no such column in this output", err=to_err)
    typer.echo(f"{'passed' if res['success'] else 'FAILED'}: {len(res['results'])} checks of "
               f"{', '.join(res['suites'])} on {res['rows']} rows"
               + (f" ({len(res['skipped'])} skipped)" if res.get("skipped") else ""), err=to_err)
    raise typer.Exit(0 if res["success"] else 1)


@app.command()
def diff(
    a: str = typer.Argument(..., help="First output (the baseline)."),
    b: str = typer.Argument(..., help="Second output."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Write the full diff as JSON here ('-': standard output)."),
    html_out: Optional[Path] = typer.Option(None, "--html", help="Write the diff as a self-contained HTML page."),
) -> None:
    """Compare two outputs: config, per-stage counts, documents, token mix. Exit 0 same data (every data file's
    bytes, hashed), 1 differs, 2 error (a missing, resized or changed data file included), 3 storage error (an
    object store's refusal, e.g. a wrong key)."""
    _paths_given(a, b)
    from datakit.quality.diff import diff as run_diff, summary_lines, to_html

    from datakit.io.fs import InputError

    if str(json_out) == "-" and str(html_out) == "-":  # (found in a hostile-input review: JSON then HTML, exit 0)
        _fail("--json - and --html - both write to standard output; give one of them a file")
    try:
        d = run_diff(a, b)
    except FileNotFoundError as e:
        _fail(_error_text(e))
    except InputError as e:  # a damaged manifest, a missing or changed data file: the line names it
        _fail(f"cannot compare {a} and {b}: {_error_text(e)}")
    except (OSError, ValueError, KeyError) as e:
        from datakit.io import storage

        if storage.is_store_refusal(e):
            _fail_engine_error(e, f"{a} or {b}")  # a storage error, exit 3
        # a damaged shard or manifest: "cannot compare" (2), never "differs" (1), which a regression gate
        # would read as a changed dataset (found in review: a traceback and exit 1)
        _fail(f"cannot compare {a} and {b}: {type(e).__name__}: {_error_text(e)}")
    if json_out:
        _write_report(str(json_out), json.dumps(d, indent=2))
    if html_out:
        _write_report(str(html_out), to_html(d))
    for line in summary_lines(d):  # to stderr when a report went to standard output (`--json -`)
        typer.echo(line, err="-" in (str(json_out), str(html_out)))
    raise typer.Exit(0 if d["verdict"] == "same data" else 1)


@app.command()
def report(path: str = typer.Argument(..., help="A datakit output with _run.json.")) -> None:
    """(Re)write PATH/_report.html from PATH/_run.json and manifest.json."""
    _paths_given(path)
    from datakit.io.fs import InputError
    from datakit.quality.report import write_report

    try:
        typer.echo(write_report(path))
    except (FileNotFoundError, InputError) as e:  # no _run.json; a damaged one or manifest (DamagedJSONError)
        _fail(_error_text(e))
    except Exception as e:  # storage: one line, exit 3 (found in an operations review: with a wrong secret key,
        _fail_engine_error(e, path)  # s3fs's PermissionError said "report failed unexpectedly ... this is a bug")
        raise


@app.command()
def warmup() -> None:
    """Compile every numba kernel once into this installation's cache (run after install, in an image
    build or before venv-pack), so later processes start without compiling. See datakit/jit.py."""
    from datakit.cli.warmup import warm_up

    info = warm_up()
    typer.echo(f"kernels ready: {info['compile_seconds']:.1f}s of compilation in {info['seconds']:.1f}s")


def _register_optional_commands() -> None:
    """Commands that live with their capability (decontamination, packed datasets)."""
    try:
        from datakit.cli.contamination import build_index_command, contamination_check, evals_app
    except ImportError:
        pass
    else:
        app.command("contamination-check")(contamination_check)
        app.command("build-index")(build_index_command)
        app.add_typer(evals_app, name="evals")
    try:
        from datakit.cli.inspect import inspect_command
    except ImportError:
        pass
    else:
        app.command("inspect")(inspect_command)


_register_optional_commands()


_COMMAND_PROCESS: list[bool] = []  # set by `main`: the `datakit` command's own process (not a CliRunner in a test)
_COMMAND_DONE: list[bool] = []  # set by `run`, `forget` and `contamination-check` once their output is complete


def main() -> None:
    from datakit.arrow_without_pandas import defer_pandas
    from datakit.logs import configure

    _COMMAND_PROCESS.append(True)
    defer_pandas()  # this process is ours: pyarrow need not import pandas to find out it is unused
    configure("text", quiet=False)  # commands with --quiet / --log-format reconfigure
    app()


def command() -> None:
    """The `datakit` command (`python -m datakit.cli`, and the console script after `datakit/launch.py`): `main`, and once a
    `run` or a `contamination-check` has finished, the end without the interpreter's teardown
    (`_exit_after_command`), with the command's own exit status (a check's 1 = contaminated included).
    Scripts that call `main` themselves (benchmarks, the spark-submit wrapper) get its `SystemExit`
    back as before."""
    from datakit.interrupts import terminate_like_interrupt, was_terminated
    from datakit.workers import one_blas_thread_here

    _skip_entry_script_in_workers()
    one_blas_thread_here()  # before anything imports numpy (importing this module does not)
    terminate_like_interrupt()
    from datakit import watchdog

    watchdog.END_PROCESS_WHEN_STUCK[0] = True  # this process is the command's (watchdog._InProcessGuard)
    try:
        main()
    except (SystemExit, KeyboardInterrupt) as e:
        if was_terminated():  # stopped as a Ctrl-C stops it (typer: exit 130); ends by SIGTERM (143)
            _end_by_sigterm()
        if isinstance(e, KeyboardInterrupt) or (isinstance(e, SystemExit) and e.code == 130):
            _say_interrupted()
        if isinstance(e, SystemExit) and _COMMAND_DONE and (e.code is None or isinstance(e.code, int)):
            _exit_after_command(e.code or 0)
        raise
    except Exception as e:  # noqa: BLE001 - a bug: exit 3 (a job failure), never 1, which says "a check failed"
        _fail_with_traceback_file(e)


def _fail_with_traceback_file(e: BaseException) -> None:
    """One line naming the error's type and a private file holding its traceback, then exit 3.

    Why: an error nothing expected left the interpreter with status 1, which the command documents as
    "a check failed" (a quality gate, a contaminated eval); found in an operations review, a `forget`
    that failed on an empty quarantine file exited 1 with a traceback a scheduler took for a verdict.
    The traceback may quote data (a record in an error), so it goes to a file only this user can read."""
    import os
    import tempfile
    import traceback

    fd, path = tempfile.mkstemp(prefix="datakit-error-", suffix=".txt")
    with os.fdopen(fd, "w") as f:
        traceback.print_exception(type(e), e, e.__traceback__, file=f)
    from datakit.logs import error_line

    command = next((a for a in sys.argv[1:] if not a.startswith("-")), "datakit")
    from datakit.io import storage

    if storage.from_storage_stack(e):
        # the storage stack failed where no caller named a path (found in review: with the endpoint down,
        # `build-index` and `report` said "this is a bug"): still a job failure, not ours
        typer.echo(error_line(f"storage error: {command} failed: {storage.short_reason(e)} (traceback in {path})"),
                   err=True)
        raise SystemExit(3)
    typer.echo(error_line(f"{command} failed unexpectedly ({type(e).__name__}); this is a bug, please report it "
                          f"with the traceback in {path}"), err=True)
    raise SystemExit(3)  # (outside the app, typer.Exit would be one more uncaught exception)


def _say_interrupted() -> None:
    """The last line of a run stopped by Ctrl-C / SIGINT (exit 130): none was printed, so a scheduler reading a
    `--log-format json` stream saw the process end without a final status (found in an operations review)."""
    from datakit.logs import error_line

    typer.echo(error_line("stopped (SIGINT)").replace("datakit: error: ", "datakit: "), err=True)


def _end_by_sigterm() -> None:
    """One line, then this process ends by SIGTERM, the status a scheduler that sent it expects."""
    import os
    import signal

    from datakit.logs import error_line

    # as the configured format writes it (found in an operations review: plain text among a scheduler's JSON)
    typer.echo(error_line("stopped (SIGTERM)").replace("datakit: error: ", "datakit: "), err=True)
    sys.stderr.flush()
    # The exit handlers a Ctrl-C's normal exit runs, which the signal's default action skips: found in an
    # operations review, the pool's queues never released their named semaphores, and multiprocessing's
    # resource tracker printed "There appear to be 5 leaked semaphore objects" after the line above. The
    # workers are killed first, as a Ctrl-C kills them, so no handler waits for a task to finish.
    import atexit

    from datakit.workers import kill_all_pools

    kill_all_pools()
    atexit._run_exitfuncs()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _skip_entry_script_in_workers() -> None:
    """Let spawned worker processes skip the console script this process started from.

    Why: a `spawn` worker first re-runs the parent's `__main__` (as `__mp_main__`), so that
    functions a user's script defines can be unpickled there. The `datakit` console script
    defines nothing; re-running it only imported the CLI (typer, click, rich) into every worker:
    0.13 s of each worker's start-up, measured with `-X importtime`. `python -m datakit.cli`
    never paid it: multiprocessing does not re-run a module named `__main__` of a package. This
    gives the console script that module's spec, which is what it is (the same `command`), so
    the workers treat both the same way. Left alone when `__main__` is anything else (a
    user's script, a test runner): those may define what the workers need, so the test is that
    it defines nothing but the installer's wrapper does (`command`, and the `sys`/`re` it uses).
    """
    import importlib.util
    import sys

    from datakit.launch import command as launch_command  # what the console script calls (datakit/launch.py)

    entry = sys.modules.get("__main__")
    if (entry is None or getattr(entry, "__spec__", None) is not None
            or getattr(entry, "command", None) not in (command, launch_command)):
        return
    if {name for name in vars(entry) if not name.startswith("__")} - {"command", "sys", "re"}:
        return
    entry.__spec__ = importlib.util.find_spec("datakit.cli.__main__")


def _exit_after_command(code: int) -> None:
    """End a finished command: the exit handlers, then the process, without the interpreter's teardown.

    Why: `_run.json` holds every second of a run (`run_timing.one_run_process`), but after it
    the interpreter still freed every module and object of the driver, 0.64-0.66 s of wall at 10k
    quickstart events (2 runs) that the user waited for and no report showed; a contamination
    check of a small dataset against humaneval took 1.02-1.39 s with that teardown and 0.82-0.99 s
    without it (4 alternated runs), and it runs before every eval. A run's workers have already
    stopped (`release`); the exit handlers (`atexit`: log flush, temporary folders, pools) all
    run here as they would at a normal exit; only the freeing of memory is skipped, which the
    OS does at once.
    """
    import atexit

    from datakit.process_exit import exit_without_teardown

    workers = sys.modules.get("datakit.workers")
    if workers is not None:
        # A kept pool still alive here (`forget` and an index build run their tasks in one and, unlike
        # `run`, never stop it) is stopped and waited for first. Left to the exit handlers, the pool's
        # own (`drop_all_pools`, not waiting) only asked its manager thread to send the workers their
        # stop; multiprocessing's handler then closed the queue before the thread could, and joined the
        # idle workers forever (found in a docs review: `datakit forget DATASET --optouts FILE` printed
        # its counts and never ended). The interpreter's normal exit joins that thread first; this one
        # skips that step.
        workers.drop_all_pools(wait=True)
    atexit._run_exitfuncs()
    exit_without_teardown(code)

