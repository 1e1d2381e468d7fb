#!/bin/bash
# lv2_relaunch_skips_finished_blocks N times: when a stop lands late, is the suspension late (CPU)
# or the flag (GPU)? Prints every run's line.
set -u
exec > >(tee $OUT/log.txt) 2>&1
NV=$(dirname "$(find /usr/local/cuda*/ /usr/lib /opt -name 'libnvrtc.so*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=$NV:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
for i in $(seq 1 ${N:-40}); do
  out=$(timeout 60 .carry/gpu-tests --ignored --test-threads=1 --nocapture ${TEST:-lv2_relaunch} 2>&1)
  echo "run $i: $(echo "$out" | grep -E 'stopped at|part-way' | tr '\n' ' ')"
done
