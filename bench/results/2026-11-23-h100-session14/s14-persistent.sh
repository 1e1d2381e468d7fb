#!/bin/bash
# Session 14, call 8: build 54310c6's xpreempt (carried as .carry/xpreempt-a), global mode under MPS
# (connections unset) against a persistent BE, two rounds of 10 s per scenario.
set -u
C=$(pwd)/.carry; R=/tmp/s14f; rm -rf $R; mkdir -p $R
exec > >(tee $OUT/log.txt) 2>&1
NV=$(dirname "$(find /usr/local/cuda*/ /usr/lib /opt -name 'libnvrtc.so*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=$NV:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} XPREEMPT_LOG=warn
date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
export CUDA_MPS_PIPE_DIRECTORY=/tmp/s14-mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/s14-mps-log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
nvidia-cuda-mps-control -d && echo "MPS started"
trap 'echo quit | nvidia-cuda-mps-control; (cd $R && tar czf $OUT/results.tgz .)' EXIT
for round in 1 2; do
  echo "== mps-daemon persistent round $round"
  timeout 150 $C/xpreempt-a bench lcbe --persistent --scenarios lc-alone,lc-alone-daemon,be-alone,xp-mps-2proc,xp-daemon-mps-2proc --secs 10 --label mps-daemon-persistent-$round --out $R/lcbe-persistent-$round.json | grep -v "^scenario .*\.\.\.$"
done
date -u
