#!/bin/bash
# CUDA interception on the GPU machine, in one run: the added cost per launch and per LC
# request (native, under `xpreempt run` high and low priority, pass-through), PyTorch results
# under the shim (checksums against native, with random suspensions too), and the CUDA
# conformance suite (tests/cuda-apps) natively and under the shim.
#
# Build here (no Rust on the GPU machine), then run with the device tool, carry [".carry"]:
#   cargo build --release -p xpreempt-cli -p xpreempt-shim -p xpreempt-daemon
#   mkdir -p .carry && cp target/release/{xpreempt,xpreemptd,libxpreempt_shim.so} .carry/ && strip --strip-debug .carry/*
#   STEPS="overhead torch apps" bash bench/run-intercept.sh
set -u -o pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
C=${C:-$ROOT/.carry}
OUT=${OUT:-/tmp/xp-out}
XP=$C/xpreempt
STEPS=${STEPS:-overhead torch apps}
mkdir -p "$OUT"
export XPREEMPT_SOCKET=/tmp/xp-intercept.sock
FAILED=""
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for step in $STEPS; do
  echo "=== $step $(date -u +%H:%M:%S)"
  case $step in
    overhead)
      nvcc -O2 -std=c++17 -arch=native -o /tmp/launch_overhead "$ROOT/bench/cuda/launch_overhead.cu" || { FAILED="$FAILED $step"; continue; }
      for round in 1 2; do
        for mode in native lc be pass; do
          case $mode in
            native) cmd=(/tmp/launch_overhead) ;;
            lc) cmd=("$XP" run -q --priority 10 -- /tmp/launch_overhead) ;;
            be) cmd=("$XP" run -q --priority 0 --level 1 -- /tmp/launch_overhead) ;;
            pass) cmd=("$XP" run -q --pass-through -- /tmp/launch_overhead) ;;
          esac
          r=$(timeout 120 "${cmd[@]}") || FAILED="$FAILED overhead-$mode"
          echo "{\"round\": $round, \"mode\": \"$mode\", \"result\": ${r:-null}}" | tee -a "$OUT/overhead.jsonl"
        done
      done ;;
    torch)
      want=$(timeout 300 python3 "$ROOT/bench/cuda/torch_smoke.py") || { FAILED="$FAILED torch-native"; continue; }
      echo "native $want" | tee "$OUT/torch.txt"
      for args in "--priority 10" "--priority 0" "--pass-through"; do
        got=$(timeout 300 "$XP" run -q $args -- python3 "$ROOT/bench/cuda/torch_smoke.py") || FAILED="$FAILED torch[$args]"
        echo "$args $got $([ "$got" = "$want" ] && echo same || echo DIFFERENT)" | tee -a "$OUT/torch.txt"
        [ "$got" = "$want" ] || FAILED="$FAILED torch[$args]"
      done
      for seed in 1 2; do
        got=$(XPREEMPT_CHAOS=$seed:300 XPREEMPT_WINDOW=4 timeout 300 "$XP" run -q --priority 0 -- python3 "$ROOT/bench/cuda/torch_smoke.py") || FAILED="$FAILED torch-chaos$seed"
        echo "chaos $seed $got $([ "$got" = "$want" ] && echo same || echo DIFFERENT)" | tee -a "$OUT/torch.txt"
        [ "$got" = "$want" ] || FAILED="$FAILED torch-chaos$seed"
      done ;;
    apps)
      XPREEMPT_BIN=$XP LEVELS="${LEVELS:-1}" CHAOS_SEEDS="${CHAOS_SEEDS:-1 2}" RESULTS=/tmp/apps-results \
        bash "$ROOT/tests/cuda-apps/run.sh" /tmp/apps-build || FAILED="$FAILED apps"
      cp /tmp/apps-results/summary.json "$OUT/cuda-apps.json" 2>/dev/null
      cp /tmp/apps-results/summary.txt "$OUT/cuda-apps.txt" 2>/dev/null
      tar czf "$OUT/cuda-apps-logs.tgz" -C /tmp/apps-results logs 2>/dev/null ;;
  esac
done
if [ -n "$FAILED" ]; then echo "FAILED:$FAILED"; exit 1; fi
echo "all passed"
