#!/bin/bash
# Session 10: GPU tests; global mode's CPU decision latency and bench-request on the 16-core host;
# under MPS (32 connections) the daemon path and per-request GPU time; then marks rounds (run-1.sh style).
set -u
C=$(pwd)/.carry; TOP=$OUT
mkdir -p $TOP/a $TOP/b
if [ -z "${SKIP_AB:-}" ]; then
OUT=$TOP/a STEPS="info tests daemon request" bash $C/run-gpu.sh > /dev/null 2>&1; echo "part a rc $?"
tail -5 $TOP/a/log.txt
OUT=$TOP/b MPS_CONN=32 STEPS="mps-daemon gpu-elapsed" bash $C/run-gpu.sh > /dev/null 2>&1; echo "part b rc $?"
grep -E "^(lc-alone|be-alone|xp-|mps-)" $TOP/b/log.txt | head -40
fi
R=/tmp/xp-s10m; mkdir -p $R
NV=$(dirname "$(find /usr/local/cuda*/ /usr/lib /opt -name 'libnvrtc.so*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=$NV:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} XPREEMPT_LOG=warn
export CUDA_MPS_PIPE_DIRECTORY=/tmp/xp-mps-pipe10 CUDA_MPS_LOG_DIRECTORY=/tmp/xp-mps-log10 CUDA_DEVICE_MAX_CONNECTIONS=32
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
nvidia-cuda-mps-control -d && echo "MPS daemon started"
trap 'echo quit | nvidia-cuda-mps-control; (cd $R && tar czf $TOP/marks.tgz .)' EXIT
A=lc-alone,lc-alone-daemon,be-alone,xp-mps-2proc,xp-daemon-mps-2proc,xp-lv2-1proc,xp-sched-lv2-1proc
B=lc-alone,lc-alone-daemon,be-alone,xp-daemon-mps-2proc,xp-mps-2proc,xp-sched-lv2-1proc,xp-lv2-1proc
for run in ${RUNS:-o1a o2b}; do
  extra=""; [ "${run#p}" != "$run" ] && extra=--persistent
  [ "${run: -1}" = a ] && S=$A || S=$B
  echo "== $run $(date -u +%T)"
  timeout 150 $C/xpreempt bench lcbe --scenarios $S --secs 8 $extra --label mps --marks $R/marks-$run --out $R/lcbe-$run.json > $R/lcbe-$run.txt 2>&1 || echo "FAILED rc $?"
  grep -E "^(lc-alone|be-alone|xp-)" $R/lcbe-$run.txt
  python3 $C/lcbe-marks.py $R/marks-$run --json $R/marks-$run.json > $R/marks-$run.txt 2>&1
done
date -u
