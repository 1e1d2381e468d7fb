#!/bin/bash
# Session 6, run 3: the persistent BE in one process under MPS, with CUDA_DEVICE_MAX_CONNECTIONS at its default and at 32; then without MPS.
set -u
C=$(pwd)/.carry-s6; R=/tmp/xp-s6g; mkdir -p $R
exec > >(tee $OUT/log.txt) 2>&1
finish() { (cd $R && tar czf $OUT/results.tgz .); }
NV=$(dirname "$(find /usr/local/cuda*/ /usr/lib /opt -name 'libnvrtc.so*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=$NV:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export XPREEMPT_LOG=${XPREEMPT_LOG:-warn}
S=lc-alone,be-alone,xp-lv2-1proc,xp-sched-lv2-1proc
one() { # name, then env
  local name=$1; shift
  echo "== $name $(date -u +%T)"
  env "$@" timeout 120 $C/xpreempt bench lcbe --scenarios $S --secs 6 --persistent --marks $R/marks-$name --out $R/lcbe-$name.json > $R/lcbe-$name.txt 2>&1 || echo "FAILED rc $?"
  grep -E "^(lc-alone|be-alone|xp-)" $R/lcbe-$name.txt
}
one nomps-default X=1
one nomps-conn32 CUDA_DEVICE_MAX_CONNECTIONS=32
export CUDA_MPS_PIPE_DIRECTORY=/tmp/xp-mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/xp-mps-log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
nvidia-cuda-mps-control -d && echo "MPS daemon started"
trap 'echo quit | nvidia-cuda-mps-control; finish' EXIT
one mps-default X=1
one mps-conn32 CUDA_DEVICE_MAX_CONNECTIONS=32
one mps-conn1 CUDA_DEVICE_MAX_CONNECTIONS=1
date -u
