#!/bin/bash
# Session 15: one build, A = burst gap off (XP_BENCH_BURST_GAP_US=0), B = 20 µs (
# from call 2 on, the Idle also waits for the application's calls on the queue to return),
# alternating on one machine (a1 b1 a2 b2 ...). In-process time-sliced and under MPS (32
# connections): the bench-only controller against the local scheduler, with marks; then global
# mode over MPS (connections unset): the two-process controller against xpreemptd.
set -u
C=$(pwd)/.carry; R=/tmp/s15; rm -rf $R; mkdir -p $R
exec > >(tee $OUT/log.txt) 2>&1
NV=$(dirname "$(find /usr/local/cuda*/ /usr/lib /opt -name 'libnvrtc.so*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=$NV:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} XPREEMPT_LOG=warn
SECS=${SECS:-6}; ROUNDS=${ROUNDS:-1 2 3}; START=$(date +%s); BUDGET=${BUDGET:-540}
date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
gap() { [ $1 = a ] && echo 0 || echo 20; }
run() { # label scenarios [env...]
  local label=$1 s=$2; shift 2
  for round in $ROUNDS; do for v in a b; do
    [ $(( $(date +%s) - START )) -gt $BUDGET ] && return
    t=$label-$v-$round
    env "$@" XP_BENCH_BURST_GAP_US=$(gap $v) timeout 150 $C/xpreempt bench lcbe --scenarios $s --secs $SECS --label $t --marks $R/marks-$t --out $R/lcbe-$t.json | grep -v "^scenario .*\.\.\.$"
    python3 $C/lcbe-marks.py $R/marks-$t --json $R/marks-$t.json > $R/marks-$t.txt 2>&1
    grep -A15 "^xp-sched\|^xp-daemon" $R/marks-$t.txt | grep -E "^x|latency|after_launch|stop_at|restart_at|restart_after_second"
  done; done
}
trap '(cd $R && rm -rf marks-*/ && tar czf $OUT/summaries.tgz .)' EXIT
run ts xp-lv2-1proc,xp-sched-lv2-1proc
export CUDA_MPS_PIPE_DIRECTORY=/tmp/s15-mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/s15-mps-log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
nvidia-cuda-mps-control -d && echo "MPS started"
trap 'echo quit | nvidia-cuda-mps-control; (cd $R && rm -rf marks-*/ && tar czf $OUT/summaries.tgz .)' EXIT
run mps be-alone,xp-lv2-1proc,xp-sched-lv2-1proc CUDA_DEVICE_MAX_CONNECTIONS=32
ROUNDS=${DAEMON_ROUNDS:-1 2} run mps-daemon be-alone,xp-mps-2proc,xp-daemon-mps-2proc
date -u
