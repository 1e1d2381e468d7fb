#!/bin/bash
# One device run for the latency branch (global mode's fast path, local mode's preemption
# thread): bench-daemon (CPU) with 2/8/64 clients, then the LC/BE scenarios under MPS and
# time-sliced, the daemon path next to the shared-word controller, LC alone native and through
# the whole stack, and the in-process scheduler next to the direct suspend.
# Expects .carry-latency/xpreempt (release, debug info stripped). Writes $OUT/results.tgz, $OUT/log.txt.
set -u
C=$(pwd)/.carry-latency
R=/tmp/xp-latency; mkdir -p $R
exec > >(tee $OUT/log.txt) 2>&1
NV=$(dirname "$(find /usr/local/cuda*/ /usr/lib /opt -name 'libnvrtc.so*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=$NV:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export XPREEMPT_LOG=${XPREEMPT_LOG:-warn}
XP=$C/xpreempt
SECS=${SECS:-4}
finish() { (cd $R && tar czf $OUT/results.tgz .); }
trap finish EXIT
date -u; nvidia-smi --query-gpu=name,driver_version,compute_mode --format=csv; nproc
timeout 60 $XP --json bench info > $R/info.json; head -c 600 $R/info.json; echo
lcbe() { local what=$1; shift; timeout 150 $XP bench lcbe "$@" || echo "FAILED: lcbe $what (rc $?)"; }

echo "== bench-daemon (CPU)"
for n in 2 8 64; do
  timeout 60 $XP --json bench-daemon --clients $n --samples 2000 --idle-secs 1 --out $R/bench-daemon-c$n.json > /dev/null || echo "FAILED: bench-daemon $n"
done
for f in $R/bench-daemon-*.json; do echo "$f"; cat $f; echo; done

echo "== MPS"
export CUDA_MPS_PIPE_DIRECTORY=/tmp/xp-mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/xp-mps-log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
nvidia-cuda-mps-control -d && echo "MPS daemon started"
trap 'echo quit | nvidia-cuda-mps-control; finish' EXIT
S=lc-alone,lc-alone-daemon,be-alone,xp-mps-2proc,xp-daemon-mps-2proc,xp-lv2-1proc,xp-sched-lv2-1proc
lcbe mps --scenarios $S --secs $SECS --label mps --out $R/lcbe-mps.json
lcbe mps-persistent --scenarios $S --secs $SECS --persistent --label mps --out $R/lcbe-mps-persistent.json
echo quit | nvidia-cuda-mps-control; sleep 1; trap finish EXIT
unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY

echo "== time-sliced"
S=lc-alone,lc-alone-daemon,be-alone,xp-lv2-1proc,xp-sched-lv2-1proc,xp-daemon-2proc
lcbe ts --scenarios $S --secs $SECS --label timesliced --out $R/lcbe-timesliced.json
lcbe ts-persistent --scenarios $S --secs $SECS --persistent --label timesliced --out $R/lcbe-timesliced-persistent.json
date -u
