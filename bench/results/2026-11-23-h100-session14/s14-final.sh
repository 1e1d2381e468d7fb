#!/bin/bash
# Session 14, call 4: build 2535ce7 only, in rounds while time is left (480 s):
# in-process time-sliced; in-process under MPS (32 connections); global mode under MPS
# (connections unset, as in session 13's mps-daemon step). 10 s per scenario.
set -u
C=$(pwd)/.carry; R=/tmp/s14d; rm -rf $R; mkdir -p $R
exec > >(tee $OUT/log.txt) 2>&1
NV=$(dirname "$(find /usr/local/cuda*/ /usr/lib /opt -name 'libnvrtc.so*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=$NV:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} XPREEMPT_LOG=warn
SECS=${SECS:-10}; START=$(date +%s)
date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
lcbe() { # tag scenarios [env...]
  local t=$1 s=$2; shift 2
  env "$@" timeout 150 $C/xpreempt bench lcbe --scenarios $s --secs $SECS --label $t --out $R/lcbe-$t.json | grep -v "^scenario .*\.\.\.$"
}
trap '(cd $R && tar czf $OUT/raw.tgz .)' EXIT
for round in 1 2 3; do
  [ $(( $(date +%s) - START )) -gt 330 ] && break
  echo "== ts round $round"; lcbe ts-$round lc-alone,xp-lv2-1proc,xp-sched-lv2-1proc
done
export CUDA_MPS_PIPE_DIRECTORY=/tmp/s14-mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/s14-mps-log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
nvidia-cuda-mps-control -d && echo "MPS started"
trap 'echo quit | nvidia-cuda-mps-control; (cd $R && tar czf $OUT/raw.tgz .)' EXIT
for round in 1 2 3; do
  [ $(( $(date +%s) - START )) -gt 360 ] && break
  echo "== mps round $round"; lcbe mps-$round lc-alone,be-alone,xp-lv2-1proc,xp-sched-lv2-1proc CUDA_DEVICE_MAX_CONNECTIONS=32
  echo "== mps-daemon round $round"; lcbe mps-daemon-$round lc-alone,lc-alone-daemon,be-alone,xp-mps-2proc,xp-daemon-mps-2proc
done
date -u
