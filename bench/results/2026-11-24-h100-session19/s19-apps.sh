#!/bin/bash
# Session 19: tests/cuda-apps at Lv2 under `xpreempt run --priority 10`, scheduled by a running
# `xpreempt daemon`, while a best-effort program (guard_lv2 in a loop, `--priority 0`) shares the
# GPU: each program's digest must equal its native one. The top program's queues rank above
# every other queue of the device (all of one user's board): their reports ring the daemon late
# and their waiters report their Idle (build $B, default l).
set -u
C=$(pwd)/.carry19; B=${B:-l}; X=$C/$B/xpreempt
exec > >(tee $OUT/log.txt) 2>&1
NV=$(dirname "$(find /usr/local/cuda*/ /usr/lib /opt -name 'libnvrtc.so*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=$NV:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} XPREEMPT_LOG=warn
date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
export XPREEMPT_SOCKET=/tmp/s19-daemon/xpreempt.sock; mkdir -p /tmp/s19-daemon
$X daemon > $OUT/daemon.txt 2>&1 & DPID=$!
sleep 1
# Builds every program, runs each natively twice (so the BE program exists below).
PROGRAMS=guard_lv2 LEVELS="" CHAOS_SEEDS="" RESULTS=/tmp/s19-be timeout 200 bash tests/cuda-apps/run.sh /tmp/s19-apps | tail -3
( while [ ! -e /tmp/s19-stop ]; do
    $X run --level 2 --priority 0 -- /tmp/s19-apps/guard_lv2 > /dev/null 2>>$OUT/be-errors.txt || echo "BE run failed $?" >> $OUT/be-errors.txt
  done ) & BE=$!
sleep 2
echo "== daemon's view with the BE running"; $X list 2>&1 | head -20
LEVELS=2 CHAOS_SEEDS="" XP_RUN_ARGS="--priority 10" XPREEMPT_BIN=$X RESULTS=$OUT/apps \
  timeout 400 bash tests/cuda-apps/run.sh /tmp/s19-apps | tail -25
rc=$?
touch /tmp/s19-stop; wait $BE
echo "== daemon stats"; $X stats --json 2>&1 | head -c 3000; echo
kill $DPID; wait $DPID 2>/dev/null
echo "== BE errors"; cat $OUT/be-errors.txt 2>/dev/null | tail -5
date -u
exit $rc
