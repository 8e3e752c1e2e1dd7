#!/usr/bin/env bash
# The accelerator check, prepared here and run on a lent GPU machine in one call.
#
#   bash benchmarks/device_check.sh stage   # here: fills .device/ (git-ignored, ~25 MiB)
#   bash benchmarks/device_check.sh run     # there, from the repository root, with .device
#                                           # carried; writes $OUT/accelerator.{log,jsonl}
#
# .device/ holds what a bare machine lacks: SST-2 from $PAPA_SHARED, the SPLADE-tiny
# checkpoint from the model cache (papa_jax.convert.fetch), and wheels of the packages its
# image lacks (ml_collections; Python 3.12, manylinux). The run installs them, prints the
# device, runs benchmarks/accelerator.py (every loop in bf16 and float32 at 256 x 128,
# then the SPLADE-tiny quickstart beside the CPU's: every stage it runs compiled for the
# device). About 5 minutes on an H100; give it timeout_s=540. ACCEL_ARGS adds arguments
# (`ACCEL_ARGS="--small --no-hf" bash benchmarks/device_check.sh run` tries it on a CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  stage)
    shared="${PAPA_SHARED:-../shared}"
    models="${PAPA_MODELS:-$HOME/.cache/papa_jax/models}"
    grep -qx '/.device/' .git/info/exclude 2>/dev/null || echo '/.device/' >> .git/info/exclude
    rm -rf .device && mkdir -p .device/shared/data .device/models .device/whl
    cp -r "$shared/data/sst2" .device/shared/data/
    cp -r "$models/splade_tiny" .device/models/
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
      --implementation cp --platform manylinux_2_17_x86_64 --platform any \
      -d .device/whl "ml_collections>=1.1.0"
    du -sh .device
    ;;
  run)
    out="${OUT:-/tmp/device_out}"
    mkdir -p "$out"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target \
      /tmp/site .device/whl/*.whl
    export PYTHONPATH="/tmp/site:$PWD" PAPA_SHARED="$PWD/.device/shared" \
      PAPA_MODELS="$PWD/.device/models" PYTHONUNBUFFERED=1
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
    python3 -c "import jax; print(jax.__version__, jax.devices())"
    timeout 420 python3 benchmarks/accelerator.py --json "$out/accelerator.jsonl" ${ACCEL_ARGS:-} \
      2>&1 | tee "$out/accelerator.log"
    ;;
  *)
    echo "usage: bash benchmarks/device_check.sh stage|run" >&2
    exit 2
    ;;
esac
