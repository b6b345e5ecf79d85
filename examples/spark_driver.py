"""A small spark-submit driver: run a datakit pipeline file on the submitted application's cluster.

    spark-submit --master spark://head:7077 \
        --archives datakit-env.tar.gz#environment \
        --conf spark.pyspark.python=./environment/bin/python \
        examples/spark_driver.py pipeline.yaml --input 's3://logs/dt=2026-11-29/*.jsonl.zst' \
        --output s3://datasets/code/dt=2026-11-29

Why a script (and not only `datakit run --engine spark`): schedulers (Airflow's
SparkSubmitOperator, EMR steps, Databricks spark-submit tasks, the Kubernetes
operator) launch `spark-submit` with a Python file. The master, executor sizes and
the environment shipped to executors come from spark-submit; the script leaves
`master` unset so datakit uses that session (adding its straggler/timeout defaults
only where the operator set nothing, see docs/deploy.md).

Exit codes as `datakit run` (`datakit.cli.run_error`): 0 done, 1 a quality gate failed (nothing
published), 2 bad pipeline/input/setting, 3 the job failed (engine, storage, an output folder another
run is writing), each with one line on stderr.
"""
from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Run a datakit pipeline file inside spark-submit.")
    ap.add_argument("pipeline", help="pipeline YAML file or URL (s3://...) the driver can read")
    ap.add_argument("--input", action="append", help="override the pipeline's input (repeatable)")
    ap.add_argument("--output", help="override the pipeline's output path")
    ap.add_argument("--partitions", type=int, help="number of Spark partitions (default: from the input)")
    args = ap.parse_args(argv)

    from datakit import Pipeline
    from datakit.cli import run_error

    try:
        if "://" in args.pipeline:  # e.g. s3://configs/code.yaml (Kubernetes/EMR: no local file on the driver)
            import fsspec

            with fsspec.open(args.pipeline, "rt") as f:
                pipeline = Pipeline.from_yaml_string(f.read())
        else:
            pipeline = Pipeline.from_yaml(args.pipeline)
        result = pipeline.run(engine="spark", input=args.input, output=args.output, partitions=args.partitions)
    except Exception as e:  # what `datakit run` says in one line (found in review: a busy output folder
        got = run_error(e, args.output or args.pipeline)  # was a traceback and exit 1, "a check failed")
        if got is None:
            raise  # a bug: its traceback
        print(f"error: {got[1]}", file=sys.stderr)
        return got[0]
    rows = result.manifest["rows"] if result.manifest else 0
    print(json.dumps({"output": result.output_path, "rows": rows, "seconds": round(result.seconds, 1),
                      "reused_shards": result.extra.get("reused_shards", 0),
                      # where the executors' Python and datakit came from (checked against the driver's version)
                      "executors": result.extra.get("executors"),
                      "straggler_conf": result.extra.get("straggler_conf")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
