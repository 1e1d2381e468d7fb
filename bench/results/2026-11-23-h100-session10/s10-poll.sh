#!/bin/bash
# Session 10: LC/BE marks with the idle watcher polling (default) and without (XP_BENCH_IDLE_POLL_US=0),
# alternating, under MPS with 32 connections.
set -u
C=$(pwd)/.carry; R=$OUT/p; mkdir -p $R
NV=$(dirname "$(find /usr/local/cuda*/ /usr/lib /opt -name 'libnvrtc.so*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=$NV:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} XPREEMPT_LOG=warn
export CUDA_MPS_PIPE_DIRECTORY=/tmp/xp-mps-pipe10p CUDA_MPS_LOG_DIRECTORY=/tmp/xp-mps-log10p CUDA_DEVICE_MAX_CONNECTIONS=32
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
nvidia-cuda-mps-control -d && echo "MPS daemon started"
trap 'echo quit | nvidia-cuda-mps-control; true' EXIT
S=lc-alone,lc-alone-daemon,xp-daemon-mps-2proc,xp-sched-lv2-1proc
for run in ${RUNS:-poll1 wake1 poll2 wake2}; do
  p=50000; [ "${run#wake}" != "$run" ] && p=0
  echo "== $run $(date -u +%T)"
  XP_BENCH_IDLE_POLL_US=$p timeout 60 $C/xpreempt bench lcbe --scenarios $S --secs ${SECS:-4} --label mps --marks $R/marks-$run --out $R/lcbe-$run.json > $R/lcbe-$run.txt 2>&1 || echo "FAILED rc $?"
  grep -E "^(lc-alone|xp-)" $R/lcbe-$run.txt
  python3 $C/lcbe-marks.py $R/marks-$run --json $R/marks-$run.json > $R/marks-$run.txt 2>&1
  grep -A5 "^lc-alone-daemon\|^xp-daemon\|^xp-sched" $R/marks-$run.txt | grep -E "^[lx]|latency|between|first_launch"
done
date -u
