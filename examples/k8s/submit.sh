#!/usr/bin/env bash
# Submit a datakit pipeline to Kubernetes (cluster mode: the driver runs in a pod of the image).
#
#   examples/k8s/submit.sh IMAGE K8S_API_URL PIPELINE_URL [spark_driver.py options...]
#   examples/k8s/submit.sh registry/datakit-spark:0.1.0 https://10.0.0.1:6443 \
#       s3://configs/code.yaml --output s3://datasets/code/dt=2026-11-29
#
# The pipeline file must be readable from the driver pod (an s3:// URL datakit reads with fsspec, or a
# file baked into the image / mounted from a ConfigMap). Build the image with examples/k8s/Dockerfile.
set -euo pipefail

IMAGE=${1:?usage: submit.sh IMAGE K8S_API_URL PIPELINE [options...]}
API=${2:?usage: submit.sh IMAGE K8S_API_URL PIPELINE [options...]}
PIPELINE=${3:?usage: submit.sh IMAGE K8S_API_URL PIPELINE [options...]}
shift 3
NAMESPACE=${NAMESPACE:-default}
SERVICE_ACCOUNT=${SERVICE_ACCOUNT:-spark}
EXECUTORS=${EXECUTORS:-4}

exec "${SPARK_SUBMIT:-spark-submit}" \
  --master "k8s://${API}" \
  --deploy-mode cluster \
  --name datakit \
  --conf spark.kubernetes.namespace="${NAMESPACE}" \
  --conf spark.kubernetes.authenticate.driver.serviceAccountName="${SERVICE_ACCOUNT}" \
  --conf spark.kubernetes.container.image="${IMAGE}" \
  --conf spark.executor.instances="${EXECUTORS}" \
  --conf spark.executor.memory="${EXECUTOR_MEMORY:-8g}" \
  --conf spark.executor.memoryOverhead="${EXECUTOR_MEMORY_OVERHEAD:-3g}" \
  --conf spark.pyspark.python=/opt/datakit-env/bin/python \
  --conf spark.pyspark.driver.python=/opt/datakit-env/bin/python \
  --conf spark.speculation=true \
  ${SPARK_CHECKPOINT_DIR:+--conf spark.checkpoint.dir="${SPARK_CHECKPOINT_DIR}"} \
  local:///opt/datakit/spark_driver.py "${PIPELINE}" "$@"
