#!/usr/bin/env bash
# Run a datakit pipeline file as a scheduled Spark batch job (e.g. from cron or Airflow, nightly).
#
#   examples/spark_submit.sh pipelines/quickstart.yaml spark://spark-master:7077 \
#       --input 's3://logs/dt=2026-11-29/*.jsonl.zst' --output s3://datasets/quickstart/dt=2026-11-29
#
# What makes it safe to schedule:
#   * idempotent: output shards are written atomically with a checksum sidecar, manifest.json last;
#     a rerun after a crash reuses finished shards and produces a byte-identical dataset;
#   * deterministic: same input + pipeline file -> same bytes, whatever the partitions/executors;
#   * says what it did: OUTPUT/_run.json has rows in/out and dropped-by-reason for every stage;
#     the exit code is non-zero on failure with a one-line reason (Spark detail in the driver log).
#
# Requirements on the cluster: the same Python environment (pyspark, datakit) on every node, and
# storage all executors can reach for input/output (s3://, gs://, HDFS, or a shared file system).
# Set spark.checkpoint.dir to such storage too (connected components and stage boundaries use it).
set -euo pipefail

PIPELINE=${1:?usage: spark_submit.sh PIPELINE.yaml MASTER_URL [datakit run options...]}
MASTER=${2:?usage: spark_submit.sh PIPELINE.yaml MASTER_URL [datakit run options...]}
shift 2

# The Python environment that has datakit + pyspark (activate it, or set PYSPARK_PYTHON).
PYTHON=${PYSPARK_PYTHON:-$(command -v python || command -v python3)}
SPARK_SUBMIT=${SPARK_SUBMIT:-$("$PYTHON" -c 'import pyspark, os; print(os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-submit"))')}

# The driver program: `python -m datakit.cli run ... --engine spark`. Inside spark-submit the engine
# uses the submitted application's SparkSession (master/memory below), so leave --master off here.
DRIVER=$(mktemp --suffix=.py)
trap 'rm -f "$DRIVER"' EXIT
cat > "$DRIVER" <<'PY'
import sys
from datakit.cli import main
sys.argv = ["datakit", "run", *sys.argv[1:], "--engine", "spark"]
main()
PY

# Not `exec`: the EXIT trap above removes the driver file once spark-submit ends (found in review: with
# `exec` it never ran, and every run left a /tmp/tmp.*.py behind). A TERM or INT for this script is passed
# on to spark-submit, and its exit status is this script's.
"$SPARK_SUBMIT" \
  --master "$MASTER" \
  --name "datakit-$(basename "$PIPELINE" .yaml)" \
  --conf spark.pyspark.python="$PYTHON" \
  --conf spark.pyspark.driver.python="$PYTHON" \
  --conf spark.sql.execution.arrow.pyspark.enabled=true \
  --conf spark.executor.memory="${EXECUTOR_MEMORY:-4g}" \
  --conf spark.driver.memory="${DRIVER_MEMORY:-2g}" \
  --conf spark.task.maxFailures=4 \
  ${SPARK_CHECKPOINT_DIR:+--conf spark.checkpoint.dir="$SPARK_CHECKPOINT_DIR"} \
  "$DRIVER" "$PIPELINE" "$@" &
child=$!
trap 'kill -TERM "$child" 2>/dev/null' TERM INT
status=0
wait "$child" || status=$?
if kill -0 "$child" 2>/dev/null; then  # a signal interrupted the wait: let spark-submit finish stopping
  status=0
  wait "$child" || status=$?
fi
exit "$status"
