#!/bin/bash
# Session 13: A (marks only) against B (the variant under test; see the write-up),
# alternating, time-sliced then under MPS (32 connections), per-request marks.
set -u
C=$(pwd)/.carry; R=/tmp/s13; rm -rf $R; mkdir -p $R
exec > >(tee $OUT/log.txt) 2>&1
NV=$(dirname "$(find /usr/local/cuda*/ /usr/lib /opt -name 'libnvrtc.so*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=$NV:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} XPREEMPT_LOG=warn
SECS=${SECS:-8}
run() { # label scenarios
  for round in 1 2; do for v in a b; do
    t=$1-$v-$round
    timeout 150 $C/xpreempt-$v bench lcbe --scenarios $2 --secs $SECS --label $t --marks $R/marks-$t --out $R/lcbe-$t.json | grep -v "^scenario .*\.\.\.$"
    python3 bench/lcbe-marks.py $R/marks-$t --json $R/marks-$t.json > $R/marks-$t.txt 2>&1
    grep -A7 "^xp-sched\|^xp-daemon" $R/marks-$t.txt | grep -E "^[x]|latency|first_launch|between|after_launch|before_second|stop_at"
  done; done
}
date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
run ts lc-alone,xp-lv2-1proc,xp-sched-lv2-1proc
export CUDA_MPS_PIPE_DIRECTORY=/tmp/s13-mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/s13-mps-log CUDA_DEVICE_MAX_CONNECTIONS=32
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
nvidia-cuda-mps-control -d && echo "MPS started"
trap 'echo quit | nvidia-cuda-mps-control; (cd $R && tar czf $OUT/raw.tgz .)' EXIT
run mps lc-alone,be-alone,xp-lv2-1proc,xp-sched-lv2-1proc,xp-daemon-mps-2proc
date -u
