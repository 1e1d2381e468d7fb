#!/bin/bash
# Session 10: same-host A/B of the LC/BE marks, build a3f9de6 (xpreempt-old) against this build,
# alternating, under MPS with 32 connections.
set -u
C=$(pwd)/.carry; R=/tmp/xp-s10ab; mkdir -p $R
NV=$(dirname "$(find /usr/local/cuda*/ /usr/lib /opt -name 'libnvrtc.so*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=$NV:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} XPREEMPT_LOG=warn
export CUDA_MPS_PIPE_DIRECTORY=/tmp/xp-mps-pipe10ab CUDA_MPS_LOG_DIRECTORY=/tmp/xp-mps-log10ab CUDA_DEVICE_MAX_CONNECTIONS=32
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
nvidia-cuda-mps-control -d && echo "MPS daemon started"
trap 'echo quit | nvidia-cuda-mps-control; (cd $R && tar czf $OUT/ab.tgz .)' EXIT
S=lc-alone,xp-mps-2proc,xp-daemon-mps-2proc,xp-lv2-1proc,xp-sched-lv2-1proc
for run in ${RUNS:-new1 old1 new2 old2}; do
  bin=$C/xpreempt; [ "${run#old}" != "$run" ] && bin=$C/xpreempt-old
  echo "== $run $(date -u +%T)"
  timeout 120 $bin bench lcbe --scenarios $S --secs ${SECS:-6} --label mps --marks $R/marks-$run --out $R/lcbe-$run.json > $R/lcbe-$run.txt 2>&1 || echo "FAILED rc $?"
  grep -E "^(lc-alone|xp-)" $R/lcbe-$run.txt
  python3 $C/lcbe-marks.py $R/marks-$run --json $R/marks-$run.json > $R/marks-$run.txt 2>&1
  grep -A4 "^xp-daemon\|^xp-sched" $R/marks-$run.txt | grep -E "^xp|between|first_launch"
done
date -u
