#!/bin/bash
# One device run of the CUDA-application harnesses. Steps (STEPS, default "cuda-apps quick"):
#   cuda-apps  build and run tests/cuda-apps (natively twice; under the shim too when
#              XPREEMPT_BIN / XPREEMPT_SHIM are set; see tests/cuda-apps/run.sh)
#   quick      bench/pytorch/pairs.py --quick   (~2 min)
#   full       bench/pytorch/pairs.py           (~8 min; PAIRS_ARGS adds arguments)
# Writes at most 8 files to $OUT: log.txt, cuda-apps.{json,txt}, cuda-apps-logs.tgz,
# pairs-<step>.{json,md}, the first CDF plot, pairs-<step>.tgz (summary, all plots, raw/).
#
# From a checkout without a GPU, with the device tool: copy tests/cuda-apps and bench/pytorch
# (and the xpreempt binaries, if any) into an ignored folder of the checkout that travels, e.g.
#   mkdir -p .carry-x/tests .carry-x/bench && cp -r tests/cuda-apps .carry-x/tests/ && cp -r bench/pytorch .carry-x/bench/
# and run `bash .carry-x/bench/pytorch/device-run.sh` there with carry [".carry-x"].
set -u -o pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-/tmp/device-run-out}
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
STEPS=${STEPS:-cuda-apps quick}
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
      RESULTS=/tmp/cuda-apps-results bash "$ROOT/tests/cuda-apps/run.sh" /tmp/cuda-apps-build \
        || FAILED="$FAILED cuda-apps"
      cp /tmp/cuda-apps-results/summary.json "$OUT/cuda-apps.json"
      cp /tmp/cuda-apps-results/summary.txt "$OUT/cuda-apps.txt"
      tar czf "$OUT/cuda-apps-logs.tgz" -C /tmp/cuda-apps-results logs ;;
    quick | full)
      dir=/tmp/pairs-$step
      args=(--out-dir "$dir")
      [ "$step" = quick ] && args+=(--quick)
      # shellcheck disable=SC2206
      args+=(${PAIRS_ARGS:-})
      (cd "$ROOT/bench/pytorch" && python3 pairs.py "${args[@]}") || FAILED="$FAILED $step"
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
