#!/bin/bash
# Final device run of the teardown helper: the conformance suite with the final build, the
# cuGetProcAddress requests the shim still misses (XPREEMPT_SHIM_LOG=1), teardown repeated.
set -u
C=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$C/.." && pwd)
OUT=${OUT:-/tmp/out}
export PATH=/usr/local/cuda/bin:$PATH
echo "== conformance suite"
C="$C" STEPS=apps CHAOS_SEEDS="1 2 3" OUT="$OUT" bash "$ROOT/bench/run-intercept.sh" 2>&1 | tail -22
SHIM=(env LD_PRELOAD="$C/libxpreempt_shim.so" XPREEMPT_INTERCEPT=1 XPREEMPT_SHIM_BACKTRACE=1)
echo "== requests still missed (LOG=1), per program, L1"
for p in teardown per_thread driver_api memory_ops; do
  XPREEMPT_LEVEL=1 XPREEMPT_SHIM_LOG=1 timeout 60 "${SHIM[@]}" /tmp/apps-build/$p >/dev/null 2>/tmp/m.err
  echo "$p rc=$? missed=$(grep -c MISSED /tmp/m.err) teardowns=$(grep -c 'context teardown' /tmp/m.err)"; grep MISSED /tmp/m.err | head -5
done
echo "== teardown repeated under the shim (LD_PRELOAD), 10 x {L1, L3 chaos}"
for i in $(seq 1 10); do
  for m in L1 L3c; do
    if [ $m = L1 ]; then e=(XPREEMPT_LEVEL=1); else e=(XPREEMPT_LEVEL=3 XPREEMPT_CHAOS=$i:500); fi
    env "${e[@]}" XPREEMPT_SHIM_LOG=1 timeout 60 "${SHIM[@]}" /tmp/apps-build/teardown >/tmp/td.out 2>/tmp/td.err
    rc=$?
    echo "$i $m rc=$rc $(grep -c ' ok' /tmp/td.out) ok, $(grep -c FAIL /tmp/td.out) FAIL, teardowns $(grep -c 'context teardown' /tmp/td.err)"
    [ $rc = 0 ] || tail -5 /tmp/td.err
  done
done 2>&1 | tee "$OUT/teardown-repeat.txt"
