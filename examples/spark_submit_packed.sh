#!/usr/bin/env bash
# Run a pipeline with spark-submit, executors using a packed environment (examples/pack_venv.sh).
#
#   examples/spark_submit_packed.sh ENV.tar.gz MASTER PIPELINE.yaml [spark_driver.py options...]
#   examples/spark_submit_packed.sh datakit-env.tar.gz yarn code.yaml \
#       --input 's3://logs/dt=2026-11-29/*.jsonl.zst' --output s3://datasets/code/dt=2026-11-29
#
# MASTER: yarn, spark://HOST:7077 (standalone) or k8s://https://API:6443. The driver runs here
# (client mode) with PYSPARK_DRIVER_PYTHON (default: python3), which needs datakit too; executors
# unpack ENV.tar.gz into ./environment and start their Python workers from it.
set -euo pipefail

ARCHIVE=${1:?usage: spark_submit_packed.sh ENV.tar.gz MASTER PIPELINE.yaml [options...]}
MASTER=${2:?usage: spark_submit_packed.sh ENV.tar.gz MASTER PIPELINE.yaml [options...]}
PIPELINE=${3:?usage: spark_submit_packed.sh ENV.tar.gz MASTER PIPELINE.yaml [options...]}
shift 3
HERE=$(cd "$(dirname "$0")" && pwd)
DRIVER_PYTHON=${PYSPARK_DRIVER_PYTHON:-python3}
SPARK_SUBMIT=${SPARK_SUBMIT:-$("$DRIVER_PYTHON" -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-submit"))')}

exec "$SPARK_SUBMIT" \
  --master "$MASTER" \
  --name "datakit-$(basename "$PIPELINE" .yaml)" \
  --archives "${ARCHIVE}#environment" \
  --conf spark.pyspark.python=./environment/bin/python \
  --conf spark.pyspark.driver.python="$DRIVER_PYTHON" \
  --conf spark.executor.memory="${EXECUTOR_MEMORY:-4g}" \
  ${SPARK_CONF_EXTRA:-} \
  ${SPARK_CHECKPOINT_DIR:+--conf spark.checkpoint.dir="$SPARK_CHECKPOINT_DIR"} \
  "$HERE/spark_driver.py" "$PIPELINE" "$@"
