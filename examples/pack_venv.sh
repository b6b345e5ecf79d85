#!/usr/bin/env bash
# Pack a virtualenv with datakit for Spark executors (YARN, Kubernetes without a custom image, standalone).
#
#   examples/pack_venv.sh [OUT.tar.gz] [ENV_DIR]
#
# 1. builds the wheel from this checkout (or uses WHEEL=path/to/datakit-*.whl),
# 2. creates ENV_DIR (default ./datakit-env) and pip-installs the wheel with its dependencies and
#    extras EXTRAS (default s3,pii-fast; use EXTRAS=s3 on aarch64, which has no hyperscan wheel) and
#    the spaCy model SPACY_MODEL (default en_core_web_sm; empty for none), unless ENV_DIR already
#    has datakit installed (then it is packed as it is). The driver must use the same env;
# 3. compiles datakit's numba kernels into the environment (`datakit warmup`: executors start
#    without compiling), and
# 4. packs it with venv-pack (default datakit-env.tar.gz). Ship it with
#    `--archives datakit-env.tar.gz#environment --conf spark.pyspark.python=./environment/bin/python`
#    (see examples/spark_submit_packed.sh and docs/deploy.md).
#
# venv-pack does not copy the Python interpreter: every node needs the same Python at the same path
# as this machine (`head -1 ENV_DIR/pyvenv.cfg`). Where that cannot hold, use conda-pack or an image.
set -euo pipefail

OUT=${1:-datakit-env.tar.gz}
ENV_DIR=${2:-datakit-env}
PYTHON=${PYTHON:-python3}
HERE=$(cd "$(dirname "$0")" && pwd)

if ! "$ENV_DIR/bin/python" -c 'import datakit' 2>/dev/null; then
  if [ -z "${WHEEL:-}" ]; then
    "$PYTHON" -m build --wheel --outdir "$HERE/../dist" "$HERE/.."
    WHEEL=$(ls -t "$HERE"/../dist/datakit-*.whl | head -1)
  fi
  "$PYTHON" -m venv "$ENV_DIR"
  "$ENV_DIR/bin/pip" install --quiet "${WHEEL}[${EXTRAS:-s3,pii-fast}]"
  # scrub_pii's NER model (skip with SPACY_MODEL= for pipelines with `ner: off`)
  if [ -n "${SPACY_MODEL-en_core_web_sm}" ]; then
    "$ENV_DIR/bin/python" -m spacy download "${SPACY_MODEL-en_core_web_sm}"
  fi
fi
"$ENV_DIR/bin/datakit" warmup
VENV_PACK=${VENV_PACK:-$(command -v venv-pack || true)}
if [ -z "$VENV_PACK" ]; then
  "$ENV_DIR/bin/pip" install --quiet venv-pack
  VENV_PACK="$ENV_DIR/bin/venv-pack"
fi
# .tar.gz, not .tar or .zip: Spark unpacks .tar.gz with the system `tar`; its Java code for .tar and
# .zip loses the bin/python symlinks. COMPRESS_LEVEL=1 packs several times faster than the default 4.
"$VENV_PACK" --prefix "$ENV_DIR" --output "$OUT" --compress-level "${COMPRESS_LEVEL:-4}" --force --quiet
echo "packed $ENV_DIR -> $OUT ($(du -h "$OUT" | cut -f1))"
