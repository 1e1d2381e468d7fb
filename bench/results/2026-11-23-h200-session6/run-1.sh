#!/bin/bash
# Session 6, run 1: marks on one clock for the controller, daemon and in-process scheduler paths under MPS.
set -u
C=$(pwd)/.carry-s6; R=/tmp/xp-s6${TAG:-a}; mkdir -p $R
exec > >(tee $OUT/log.txt) 2>&1
finish() { (cd $R && tar czf $OUT/results.tgz .); }
NV=$(dirname "$(find /usr/local/cuda*/ /usr/lib /opt -name 'libnvrtc.so*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=$NV:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export XPREEMPT_LOG=${XPREEMPT_LOG:-warn}
export CUDA_MPS_PIPE_DIRECTORY=/tmp/xp-mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/xp-mps-log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
[ -n "${CONN:-}" ] && export CUDA_DEVICE_MAX_CONNECTIONS=$CONN && echo "CUDA_DEVICE_MAX_CONNECTIONS=$CONN"
nvidia-cuda-mps-control -d && echo "MPS daemon started"
trap 'echo quit | nvidia-cuda-mps-control; finish' EXIT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv
S=${S:-lc-alone,lc-alone-daemon,be-alone,xp-mps-2proc,xp-daemon-mps-2proc,xp-lv2-1proc,xp-sched-lv2-1proc}
A=lc-alone,lc-alone-daemon,be-alone,xp-mps-2proc,xp-daemon-mps-2proc,xp-lv2-1proc,xp-sched-lv2-1proc
B=lc-alone,lc-alone-daemon,be-alone,xp-daemon-mps-2proc,xp-mps-2proc,xp-sched-lv2-1proc,xp-lv2-1proc
for run in ${RUNS:-o1 o2 o3}; do
  extra=""; [ "${run#p}" != "$run" ] && extra=--persistent
  [ -n "${ORDER:-}" ] && { [ "${run: -1}" = a ] && S=$A || S=$B; }
  echo "== $run $(date -u +%T)"
  timeout 200 $C/xpreempt bench lcbe --scenarios $S --secs ${SECS:-8} $extra --label mps --marks $R/marks-$run --out $R/lcbe-$run.json > $R/lcbe-$run.txt 2>&1 || echo "FAILED rc $?"
  grep -E "^(lc-alone|be-alone|xp-)" $R/lcbe-$run.txt
  python3 $C/lcbe-marks.py $R/marks-$run --json $R/marks-$run.json
done
date -u
