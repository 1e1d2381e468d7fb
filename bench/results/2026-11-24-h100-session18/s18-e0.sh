#!/bin/bash
# The whole GPU test suite (XQueues over CUDA) with e and e0, N times each, failures in full.
set -u
exec > >(tee $OUT/log.txt) 2>&1
NV=$(dirname "$(find /usr/local/cuda*/ /usr/lib /opt -name 'libnvrtc.so*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=$NV:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
for i in $(seq 1 ${N:-6}); do for b in gpu-tests gpu-tests-e0; do
  out=$(XPREEMPT_BIN=.carry/e/xpreempt XPREEMPT_SHIM=.carry/e/libxpreempt_shim.so timeout 100 .carry/$b --ignored --test-threads=1 --nocapture ${TEST:-} 2>&1)
  echo "== $b $i: $(echo "$out" | grep -E 'stopped at|test result|went ahead' | tr '\n' ' ')"
  echo "$out" | grep -A4 panicked
done; done
