#!/bin/bash
# Session 14, call 6: A (54310c6) against B (04cac0e: + a report supersedes a waiting announcement behind a claim + Readys handed to the spinning thread), alternating.
# 1. The report bench (a Ready and an Idle beside the spinning preemption thread).
# 2. bench lcbe, time-sliced then under MPS (32 connections): the LC on a plain stream and through
#    an unscheduled XQueue (-xq), with the bench-only controller and through the local scheduler.
set -u
C=$(pwd)/.carry; R=/tmp/s14e; rm -rf $R; mkdir -p $R
exec > >(tee $OUT/log.txt) 2>&1
NV=$(dirname "$(find /usr/local/cuda*/ /usr/lib /opt -name 'libnvrtc.so*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=$NV:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} XPREEMPT_LOG=warn
SECS=${SECS:-8}; ROUNDS=${ROUNDS:-1 2}
date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
for round in $ROUNDS; do for v in a b; do
  echo "== report-$v round $round"
  (cd $R && timeout 60 $C/report-$v --bench --warm-up-time 1 --measurement-time 4 2>&1 | grep -E "^[a-z_/ ]+time:|time:")
done; done
run() { # label scenarios
  for round in $ROUNDS; do for v in a b; do
    t=$1-$v-$round
    timeout 150 $C/xpreempt-$v bench lcbe --scenarios $2 --secs $SECS --label $t --marks $R/marks-$t --out $R/lcbe-$t.json | grep -v "^scenario .*\.\.\.$"
    python3 $C/lcbe-marks.py $R/marks-$t --json $R/marks-$t.json > $R/marks-$t.txt 2>&1
    grep -A7 "^xp-sched\|^xp-lv2-1proc-xq\|^lc-alone-xq" $R/marks-$t.txt | grep -E "^[xl]|latency|first_launch|between|after_launch|before_second|stop_at"
  done; done
}
trap '(cd $R && tar czf $OUT/raw.tgz .)' EXIT
run ts lc-alone,xp-lv2-1proc,xp-lv2-1proc-xq,xp-sched-lv2-1proc
export CUDA_MPS_PIPE_DIRECTORY=/tmp/s14-mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/s14-mps-log CUDA_DEVICE_MAX_CONNECTIONS=32
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
nvidia-cuda-mps-control -d && echo "MPS started"
trap 'echo quit | nvidia-cuda-mps-control; (cd $R && tar czf $OUT/raw.tgz .)' EXIT
run mps lc-alone,be-alone,xp-lv2-1proc,xp-lv2-1proc-xq,xp-sched-lv2-1proc
date -u
