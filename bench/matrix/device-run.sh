#!/bin/bash
# One device run of the workload matrix: bench/matrix/run.py $MATRIX_ARGS into a fresh folder
# ($MATRIX_DIR, default /tmp/matrix; kept with MATRIX_RESUME=1, which passes --resume), bounded in
# time, its results copied to $OUT in four files: log.txt, summary.md, summary.json and
# matrix.tgz (plots/, runs/, raw/, logs/, calibrate.json, state.json).
#
#   MATRIX_ARGS="--only r50-vit" bash bench/matrix/device-run.sh
#   MATRIX_ARGS="--only cuda-pairs,levels --duration 2" bash bench/matrix/device-run.sh
#
# No run starts after MATRIX_DEADLINE seconds (default 540) and the runner is stopped with SIGTERM
# after MATRIX_TIMEOUT (default 570): it then stops its jobs and daemons and writes the summary of
# what ran, so that the whole step ends inside a ten-minute command.
set -u -o pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-/tmp/matrix-device-out}
DIR=${MATRIX_DIR:-/tmp/matrix}
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
resume=()
if [ "${MATRIX_RESUME:-0}" = 1 ]; then resume=(--resume); else rm -rf "$DIR"; fi
date -u
nvidia-smi --query-gpu=name,driver_version,compute_mode --format=csv,noheader
python3 -c 'import torch, torchvision, transformers; print("torch", torch.__version__, "torchvision", torchvision.__version__, "transformers", transformers.__version__)'
command -v nvcc || ls -d /usr/local/cuda*/bin 2>/dev/null
export PYTHONUNBUFFERED=1
cd "$ROOT" || exit 2
# shellcheck disable=SC2086
timeout --signal=TERM --kill-after=15 "${MATRIX_TIMEOUT:-570}" \
  python3 bench/matrix/run.py --out "$DIR" --deadline-s "${MATRIX_DEADLINE:-540}" "${resume[@]}" ${MATRIX_ARGS:-}
rc=$?
cp "$DIR/summary.md" "$DIR/summary.json" "$OUT/" 2>/dev/null
tar czf "$OUT/matrix.tgz" --exclude=./bin --exclude=./tmp --exclude=./ipc -C "$DIR" .
date -u
exit $rc
