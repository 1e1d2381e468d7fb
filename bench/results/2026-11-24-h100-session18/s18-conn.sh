#!/bin/bash
# lv2_relaunch_skips_finished_blocks N times at each CUDA_DEVICE_MAX_CONNECTIONS: does the
# control stream's flag set wait behind the queue's own kernel when they share a hardware queue?
set -u
exec > >(tee $OUT/log.txt) 2>&1
NV=$(dirname "$(find /usr/local/cuda*/ /usr/lib /opt -name 'libnvrtc.so*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=$NV:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
for c in 1 2 8 32; do for i in $(seq 1 ${N:-10}); do
  out=$(CUDA_DEVICE_MAX_CONNECTIONS=$c timeout 60 .carry/gpu-tests --ignored --test-threads=1 --nocapture lv2_relaunch 2>&1)
  echo "conn $c run $i: $(echo "$out" | grep -oE 'stopped at [0-9]+|part-way: [0-9]+' | tr '\n' ' ')"
done; done
