#!/bin/bash
# CUDA interception on the GPU machine, in one run: the added cost per launch and per LC
# request (native, under `xpreempt run` high and low priority, pass-through), PyTorch results
# under the shim (checksums against native, with random suspensions too), and the CUDA
# conformance suite (tests/cuda-apps) natively and under the shim.
#
# The GPU machine needs no Rust toolchain: build elsewhere and copy BIN's files over,
#   cargo build --release -p xpreempt-cli -p xpreempt-shim -p xpreempt-daemon --features xpreempt-shim/chaos
#   (chaos: the torch and apps steps inject random suspensions, test machinery)
#   STEPS="overhead torch apps kill" bash bench/run-intercept.sh [OUT_DIR]
# BIN [default: target/release] holds xpreempt, xpreemptd and libxpreempt_shim.so; OUT_DIR
# [default: $OUT, else intercept-results] receives the results.
# (overhead: ROUNDS=N rounds, MODES="native lc be lv3 pass", PIN=CPUS to pin with taskset)
set -u -o pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
C=${BIN:-${C:-$ROOT/target/release}}
OUT=${1:-${OUT:-intercept-results}}
XP=$C/xpreempt
STEPS=${STEPS:-overhead torch apps kill}
mkdir -p "$OUT"
export XPREEMPT_SOCKET=/tmp/xp-intercept.sock
FAILED=""
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for step in $STEPS; do
  echo "=== $step $(date -u +%H:%M:%S)"
  case $step in
    overhead)
      nvcc -O2 -std=c++17 -arch=native -o /tmp/launch_overhead "$ROOT/bench/cuda/launch_overhead.cu" || { FAILED="$FAILED $step"; continue; }
      for round in $(seq "${ROUNDS:-2}"); do
        for mode in ${MODES:-native lc be lv3 pass}; do
          case $mode in
            native) cmd=(/tmp/launch_overhead) ;;
            lc) cmd=("$XP" run -q --priority 10 -- /tmp/launch_overhead) ;;
            be) cmd=("$XP" run -q --priority 0 --level 1 -- /tmp/launch_overhead) ;;
            lv3) cmd=("$XP" run -q --priority 0 --level 3 -- /tmp/launch_overhead) ;;
            pass) cmd=("$XP" run -q --pass-through -- /tmp/launch_overhead) ;;
          esac
          r=$(timeout 120 ${PIN:+taskset -c "$PIN"} "${cmd[@]}") || FAILED="$FAILED overhead-$mode"
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
      XPREEMPT_SHIM_BACKTRACE=1 XPREEMPT_BIN=$XP LEVELS="${LEVELS:-1 3}" CHAOS_SEEDS="${CHAOS_SEEDS:-1 2}" RESULTS=/tmp/apps-results \
        bash "$ROOT/tests/cuda-apps/run.sh" /tmp/apps-build || FAILED="$FAILED apps"
      cp /tmp/apps-results/summary.json "$OUT/cuda-apps.json" 2>/dev/null
      grep -A12 "^failures\|FAIL\|fail " /tmp/apps-results/summary.txt | head -60
      cp /tmp/apps-results/summary.txt "$OUT/cuda-apps.txt" 2>/dev/null
      tar czf "$OUT/cuda-apps-logs.tgz" -C /tmp/apps-results logs 2>/dev/null ;;
    passprobe)
      # Pass-through pair for a few seconds: what the daemon sees and does, and the shim's Lv3.
      "$XP" daemon --socket /tmp/xp-pp.sock >/tmp/pp-daemon.log 2>&1 &
      dpid=$!; sleep 1; rm -f /tmp/pp-train.ready
      XPREEMPT_SHIM_LOG=1 XPREEMPT_SOCKET=/tmp/xp-pp.sock "$XP" run --priority 0 --pass-through -- python3 \
        "$ROOT/bench/pytorch/train.py" --duration 120 --ready-file /tmp/pp-train.ready >/tmp/pp-train.log 2>&1 &
      tpid=$!
      for _ in $(seq 300); do [ -f /tmp/pp-train.ready ] && break; sleep 0.2; done
      XPREEMPT_SHIM_LOG=1 XPREEMPT_SOCKET=/tmp/xp-pp.sock "$XP" run --priority 10 --pass-through -- python3 \
        "$ROOT/bench/pytorch/infer.py" --duration 6 --out /tmp/pp-infer.json >/tmp/pp-infer.log 2>&1 &
      ipid=$!
      sleep 14; "$XP" list --socket /tmp/xp-pp.sock; "$XP" stats --socket /tmp/xp-pp.sock
      wait $ipid; kill -9 $tpid; wait $tpid 2>/dev/null
      python3 -c "import json; d=json.load(open('/tmp/pp-infer.json')); print('infer p99', d['latency'])"
      for f in /tmp/pp-train.log /tmp/pp-infer.log; do echo "-- $f"; grep xpreempt "$f" | sed 's/[0-9]\+ us/N us/' | sort | uniq -c | sort -rn | head -8; done
      kill $dpid; wait $dpid 2>/dev/null ;;
    debug)
      # A crash under the shim, with a backtrace where gdb exists.
      nvcc -O2 -std=c++20 -arch=native -I"$ROOT/tests/cuda-apps" -o /tmp/teardown "$ROOT/tests/cuda-apps/teardown.cu"
      for lvl in 1 3; do
        echo "-- teardown L$lvl"
        if command -v gdb >/dev/null; then
          XPREEMPT_INTERCEPT=1 XPREEMPT_LEVEL=$lvl XPREEMPT_SHIM_LOG=1 timeout 120 gdb -q -batch \
            -ex "set environment LD_PRELOAD $C/libxpreempt_shim.so" -ex run -ex "thread apply all bt 12" /tmp/teardown 2>&1 \
            | grep -v "^\[New Thread\|^\[Thread .* exited" | tail -80
        else
          LD_PRELOAD=$C/libxpreempt_shim.so XPREEMPT_INTERCEPT=1 XPREEMPT_LEVEL=$lvl XPREEMPT_SHIM_LOG=1 XPREEMPT_SHIM_BACKTRACE=1 timeout 120 /tmp/teardown 2>&1 | tail -30
          echo "rc=$?"
        fi
      done ;;
    probe)
      # Does the high inference capture its CUDA graph under the daemon, alone and beside a
      # training at each level?
      "$XP" daemon --socket /tmp/xp-probe.sock >/tmp/probe-daemon.log 2>&1 &
      dpid=$!; sleep 1
      for variant in alone train_lv3 train_lv1; do
        tpid=""
        if [ "$variant" != alone ]; then
          rm -f /tmp/probe-train.ready
          lvl=3; [ "$variant" = train_lv1 ] && lvl=1
          XPREEMPT_SOCKET=/tmp/xp-probe.sock "$XP" run -q --priority 0 --level $lvl -- python3 "$ROOT/bench/pytorch/train.py" \
            --duration 120 --ready-file /tmp/probe-train.ready >/tmp/probe-train.log 2>&1 &
          tpid=$!
          for _ in $(seq 300); do [ -f /tmp/probe-train.ready ] && break; sleep 0.2; done
        fi
        XPREEMPT_SHIM_LOG=1 XPREEMPT_SOCKET=/tmp/xp-probe.sock timeout 120 "$XP" run -q --priority 10 -- python3 \
          "$ROOT/bench/pytorch/infer.py" --duration 3 --out /tmp/probe-$variant.json >/tmp/probe-$variant.log 2>&1
        python3 -c "import json,sys; d=json.load(open('/tmp/probe-$variant.json')); print('$variant', 'graph', d.get('graph'), d.get('graph_error'))" \
          || { echo "$variant: no result"; tail -20 /tmp/probe-$variant.log; }
        grep -i "xpreempt-shim" /tmp/probe-$variant.log | sort | uniq -c | head -10
        [ -n "$tpid" ] && kill -9 $tpid && wait $tpid 2>/dev/null
      done
      kill $dpid; wait $dpid 2>/dev/null ;;
    kill)
      python3 "$ROOT/bench/pytorch/kill_low.py" --xpreempt-bin "$XP" --out "$OUT/kill-low.json" \
        --log-dir /tmp/kill-logs || FAILED="$FAILED kill"
      tail -n 3 /tmp/kill-logs/*.log ;;
  esac
done
if [ -n "$FAILED" ]; then echo "FAILED:$FAILED"; exit 1; fi
echo "all passed"
