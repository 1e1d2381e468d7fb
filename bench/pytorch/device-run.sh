#!/bin/bash
# One device run of the CUDA-application harnesses. Steps (STEPS, default "cuda-apps quick"):
#   cuda-apps  build and run tests/cuda-apps (natively twice; under the shim too when
#              XPREEMPT_BIN / XPREEMPT_SHIM are set; see tests/cuda-apps/run.sh), at most
#              CUDA_APPS_TIMEOUT seconds (default 400)
#   quick      bench/pytorch/pairs.py --quick $PAIRS_ARGS   (~2 min)
#   full       bench/pytorch/pairs.py $PAIRS_ARGS           (~8 min without PAIRS_ARGS)
#              each at most PAIRS_TIMEOUT seconds (default 560), so that what ran comes back
# Every step starts from an empty results folder (a warm machine keeps /tmp between calls).
# Writes to OUT_DIR [default: $OUT, else pytorch-results]: log.txt, cuda-apps.{json,txt},
# cuda-apps-logs.tgz, pairs-<step>.{json,md}, the first CDF plot, pairs-<step>.tgz (summary, all
# plots, raw/).
#
# The GPU machine needs no Rust toolchain: build the release binaries elsewhere, copy them over,
# and point XPREEMPT_BIN at them:
#   XPREEMPT_BIN=target/release/xpreempt STEPS=full PAIRS_ARGS="--groups pair --duration 20 --modes xp_lv1,xp_mps" \
#     bash bench/pytorch/device-run.sh OUT_DIR
set -u -o pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${1:-${OUT:-pytorch-results}}
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
STEPS=${STEPS:-cuda-apps quick}
export XPREEMPT_LOG=${XPREEMPT_LOG:-warn}
# NVRTC (xpreempt's own kernels) is not on the loader's path everywhere.
NV=$(dirname "$(find /usr/local/cuda*/ /usr/lib /opt -name 'libnvrtc.so*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=$NV:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
FAILED=""
date -u
nvidia-smi --query-gpu=name,driver_version,compute_mode,memory.total --format=csv
python3 -c 'import torch, torchvision, transformers; print("torch", torch.__version__, "torchvision", torchvision.__version__, "transformers", transformers.__version__)'
command -v nvcc || ls -d /usr/local/cuda*/bin 2>/dev/null
echo "XPREEMPT_BIN=${XPREEMPT_BIN:-} XPREEMPT_SHIM=${XPREEMPT_SHIM:-}"

for step in $STEPS; do
  echo "=== $step ($(date -u +%H:%M:%S))"
  case $step in
    cuda-apps)
      rm -rf /tmp/cuda-apps-results
      TIMEOUT=${TIMEOUT:-40} RESULTS=/tmp/cuda-apps-results timeout "${CUDA_APPS_TIMEOUT:-400}" \
        bash "$ROOT/tests/cuda-apps/run.sh" /tmp/cuda-apps-build || FAILED="$FAILED cuda-apps"
      tail -20 /tmp/cuda-apps-results/summary.txt
      cp /tmp/cuda-apps-results/summary.json "$OUT/cuda-apps.json"
      cp /tmp/cuda-apps-results/summary.txt "$OUT/cuda-apps.txt"
      tar czf "$OUT/cuda-apps-logs.tgz" -C /tmp/cuda-apps-results logs ;;
    quick | full)
      dir=/tmp/pairs-$step
      rm -rf "$dir"
      args=(--out-dir "$dir")
      [ "$step" = quick ] && args+=(--quick)
      # shellcheck disable=SC2206
      args+=(${PAIRS_ARGS:-})
      (cd "$ROOT/bench/pytorch" && timeout "${PAIRS_TIMEOUT:-560}" python3 pairs.py "${args[@]}") \
        || FAILED="$FAILED $step"
      cp "$dir/summary.json" "$OUT/pairs-$step.json"
      cp "$dir/summary.md" "$OUT/pairs-$step.md"
      png=$(ls "$dir"/cdf-*.png 2>/dev/null | head -1)
      [ -n "$png" ] && cp "$png" "$OUT/$step-$(basename "$png")"
      # everything (summary, every plot, raw/) in one archive: $OUT brings back 8 files at most
      tar czf "$OUT/pairs-$step.tgz" -C "$dir" . ;;
    *) echo "unknown step $step"; FAILED="$FAILED $step" ;;
  esac
done
date -u
if [ -n "$FAILED" ]; then echo "FAILED:$FAILED"; exit 1; fi
