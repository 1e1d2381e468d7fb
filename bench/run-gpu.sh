#!/bin/bash
# One device run of the CUDA backend: environment, GPU tests, preemption latency, LC/BE scenarios
# (time-sliced and under MPS, BE normal and persistent). Expects the release binaries in .carry/:
# xpreempt, libxpreempt_shim.so, gpu-tests (xpreempt-bench's tests/gpu.rs) and cuda-conformance
# (xpreempt-cuda's tests/conformance.rs), shim-conformance (xpreempt-shim's tests/gpu_conformance.rs).
# Writes $OUT/results.tgz and $OUT/log.txt.
#
# Producing .carry/ on the build machine, from the repository root (test binaries get a hashed
# name, which cargo prints as "Executable ... (path)"):
#   cargo build --release -p xpreempt-cli -p xpreempt-shim --features xpreempt-shim/chaos
# (the chaos feature: the conformance and fork-chaos steps inject random suspensions, test
# machinery that a product shim leaves out; it does nothing unless XPREEMPT_CHAOS is set)
#   mkdir -p .carry && cp target/release/xpreempt target/release/libxpreempt_shim.so bench/run-gpu.sh .carry/
#   exe() { sed -n 's/^ *Executable .*(\(.*\))$/\1/p'; }
#   cp "$(cargo test --release -p xpreempt-bench --test gpu --no-run 2>&1 | exe)" .carry/gpu-tests
#   cp "$(cargo test --release -p xpreempt-cuda --test conformance --no-run 2>&1 | exe)" .carry/cuda-conformance
#   cp "$(cargo test --release -p xpreempt-shim --test gpu_conformance --no-run 2>&1 | exe)" .carry/shim-conformance
# Then on the device: `bash .carry/run-gpu.sh` (or STEPS="tests" ... for a subset). Steps: info lv3
# tests daemon request sched latency smoke lcbe-persistent mps-persistent lcbe mps daemon-gpu
# mps-daemon gpu-elapsed idle-poll conformance fork-chaos (daemon-gpu, mps-daemon: global mode through a
# private `xpreempt daemon`, SECS=5 per scenario; conformance: tests/cuda-apps under `xpreempt run`;
# fork-chaos: fork_after_init FORK_SEEDS times per level under random suspensions).
set -u
C=$(pwd)/.carry
R=/tmp/xp-results; mkdir -p $R
exec > >(tee $OUT/log.txt) 2>&1
NV=$(dirname "$(find /usr/local/cuda*/ /usr/lib /opt -name 'libnvrtc.so*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=$NV:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export XPREEMPT_LOG=${XPREEMPT_LOG:-warn}
XP=$C/xpreempt
SHIM=$C/libxpreempt_shim.so
STEPS=${STEPS:-info tests latency lcbe mps}
# Measuring window of the global-mode steps (daemon-gpu, mps-daemon), seconds per scenario.
SECS=${SECS:-5}
# Steps that record failures here make the script exit 1 at the end.
FAILED=""
# `bench lcbe` for a step that must not fail silently: exit 3 means it ran and printed, but a
# scenario failed (its error is in the table and the JSON).
lcbe() {
  local what=$1; shift
  timeout ${LCBE_TIMEOUT:-110} $XP bench lcbe "$@" || { echo "FAILED: bench lcbe $what (rc $?)"; FAILED="$FAILED $what"; }
}
mps_start() {
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/xp-mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/xp-mps-log
  # MPS clients get few hardware connections by default, so streams of one process can share
  # one and serialize (seen: in-process LC p99 0.8 ms behind a persistent BE). MPS_CONN=32 raises it.
  [ -n "${MPS_CONN:-}" ] && export CUDA_DEVICE_MAX_CONNECTIONS=$MPS_CONN
  mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
  nvidia-cuda-mps-control -d && echo "MPS daemon started"
  trap 'echo quit | nvidia-cuda-mps-control; finish' EXIT
}
mps_stop() { echo quit | nvidia-cuda-mps-control; sleep 1; trap finish EXIT; }
date -u; nvidia-smi --query-gpu=name,driver_version,compute_mode --format=csv; cat /proc/driver/nvidia/version
echo "nvrtc: $NV"
finish() { (cd $R && tar czf $OUT/results.tgz .); if [ -n "$FAILED" ]; then echo "FAILED steps:$FAILED"; exit 1; fi; }
trap finish EXIT
for s in $STEPS; do case $s in
info)
  timeout 60 $XP --json bench info | tee $R/info.json
  LD_PRELOAD=$SHIM XPREEMPT_SHIM_LOG=2 timeout 60 $XP --json bench info 2>$R/shim-allocs.txt | tee $R/info-shim.json
  grep -c RM_ALLOC $R/shim-allocs.txt; grep -i "a06c\|channel group" $R/shim-allocs.txt | head -20 ;;
lv3)
  LD_PRELOAD=$SHIM XPREEMPT_SHIM_LOG=1 timeout 60 $XP bench lv3-probe --out $R/lv3-probe.json ;;
tests)
  XPREEMPT_BIN=$XP XPREEMPT_SHIM=$SHIM timeout 180 $C/gpu-tests --ignored --test-threads=1 --nocapture 2>&1 | tee $R/gpu-tests.txt
  timeout 120 $C/cuda-conformance --ignored --test-threads=1 --nocapture 2>&1 | tee $R/cuda-conformance.txt
  timeout 120 $C/shim-conformance --ignored --test-threads=1 --nocapture 2>&1 | tee $R/shim-conformance.txt ;;
daemon)
  # Global mode's decision latency (CPU only) on this idle 16-core machine: 2, 8, 64 clients.
  for n in 2 8 64; do
    timeout 120 $XP --json bench-daemon --clients $n --samples ${SAMPLES:-3000} --out $R/bench-daemon-c$n.json > /dev/null || echo "bench-daemon $n failed"
  done
  cat $R/bench-daemon-*.json ;;
request)
  # What the stack adds to a stand-in request (CPU only), each path three times, interleaved.
  for round in 1 2 3; do
    timeout 120 $XP bench-request --requests ${REQUESTS:-3000} --out $R/bench-request-$round.json || echo "bench-request $round failed"
  done ;;
gpu-elapsed)
  # Under MPS: each LC request's GPU time (timing events around its launches) next to its
  # wall time, alone and beside the controller-preempted BE; tells GPU queueing from a late
  # completion wake-up. Plain-stream LC scenarios only.
  # The SM clock and power state every 100 ms beside it: an idle GPU between LC requests may
  # clock down, which would make "alone" the slow mode.
  mps_start
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,pstate,power.draw,utilization.gpu --format=csv -lms 100 > $R/clocks-elapsed.csv 2>&1 &
  SMI=$!
  S=lc-alone,be-alone,xp-mps-2proc
  for p in "" --persistent; do
    XP_BENCH_GPU_ELAPSED=1 lcbe gpu-elapsed$p --scenarios $S --secs $SECS $p --label mps --marks $R/marks-elapsed$p --out $R/lcbe-elapsed$p.json
    python3 bench/lcbe-marks.py $R/marks-elapsed$p --json $R/marks-elapsed$p.json
  done
  kill $SMI
  mps_stop ;;
sched)
  # The scheduler path (LocalScheduler through the one driver loop) next to the direct suspend.
  S=lc-alone,be-alone,be-alone-xp,xp-lv2-1proc,xp-sched-lv2-1proc
  timeout 120 $XP bench lcbe --scenarios $S --label sched --out $R/lcbe-sched.json
  timeout 120 $XP bench lcbe --scenarios $S --persistent --label sched --out $R/lcbe-sched-persistent.json ;;
latency)
  timeout 200 $XP --json bench latency --trials ${TRIALS:-15} --out $R/latency.json --svg $R/latency.svg > /dev/null ;;
smoke)
  timeout 100 $XP bench lcbe --scenarios lc-alone,be-alone,be-alone-xp,xp-lv2-1proc --label smoke --out $R/lcbe-smoke.json
  timeout 100 $XP bench lcbe --scenarios lc-alone,be-alone,be-alone-xp,xp-lv2-1proc --persistent --label smoke --out $R/lcbe-smoke-persistent.json ;;
lcbe-persistent)
  S=lc-alone,be-alone,be-alone-xp,prio-1proc,xp-lv2-1proc,xp-sched-lv2-1proc
  timeout 100 $XP bench lcbe --scenarios $S --persistent --label timesliced --out $R/lcbe-persistent.json --svg $R/lcbe-persistent.svg ;;
mps-persistent)
  mps_start
  S=lc-alone,be-alone,be-alone-xp,mps-prio,xp-mps-2proc,xp-lv2-1proc
  timeout 120 $XP bench lcbe --scenarios $S --persistent --label mps --out $R/lcbe-mps-persistent.json --svg $R/lcbe-mps-persistent.svg
  mps_stop ;;
lcbe)
  S=lc-alone,be-alone,be-alone-xp,native-2proc,prio-1proc,xp-lv1-1proc,xp-lv2-1proc,xp-sched-lv2-1proc,xp-lv3-2proc,xp-lv3static-2proc
  timeout 150 $XP bench lcbe --scenarios $S --label timesliced --shim $SHIM --out $R/lcbe.json --svg $R/lcbe.svg
  timeout 150 $XP bench lcbe --scenarios $S --persistent --label timesliced --shim $SHIM --out $R/lcbe-persistent.json --svg $R/lcbe-persistent.svg ;;
mps)
  mps_start
  timeout 60 $XP --json bench info | tee $R/info-mps.json
  S=lc-alone,be-alone,be-alone-xp,mps-default,mps-prio,mps-client-prio,xp-mps-2proc,xp-lv2-1proc,xp-sched-lv2-1proc
  timeout 150 $XP bench lcbe --scenarios $S --label mps --out $R/lcbe-mps.json --svg $R/lcbe-mps.svg
  timeout 150 $XP bench lcbe --scenarios $S --persistent --label mps --out $R/lcbe-mps-persistent.json --svg $R/lcbe-mps-persistent.svg
  # Same-process scenarios again with more connections:
  CUDA_DEVICE_MAX_CONNECTIONS=32 timeout 100 $XP bench lcbe --scenarios lc-alone,be-alone,prio-1proc,xp-lv2-1proc,xp-sched-lv2-1proc --persistent --label mps-conn32 --out $R/lcbe-mps-conn32-persistent.json --svg $R/lcbe-mps-conn32-persistent.svg
  mps_stop ;;
daemon-gpu)
  # Global mode on the GPU: LC and BE in two processes whose agents register with a private
  # `xpreempt daemon` (time-sliced contexts), next to the one-process paths and Lv3 (shim).
  # lc-alone-daemon / lc-alone is the whole stack's cost on an idle GPU (goal: p99 <= 1.05x).
  # About 2 x (7 x (SECS + 3) s): under 4 minutes at SECS=5.
  S=lc-alone,lc-alone-daemon,be-alone,xp-lv2-1proc,xp-sched-lv2-1proc,xp-daemon-2proc,xp-lv3-2proc
  lcbe daemon-gpu --scenarios $S --secs $SECS --label daemon --shim $SHIM --out $R/lcbe-daemon.json --svg $R/lcbe-daemon.svg
  lcbe daemon-gpu-persistent --scenarios $S --secs $SECS --persistent --label daemon --shim $SHIM --out $R/lcbe-daemon-persistent.json --svg $R/lcbe-daemon-persistent.svg ;;
mps-daemon)
  # The same under MPS: LC and BE share one hardware context, stream priorities reach across
  # processes, and the daemon suspends the BE queue (Lv2) as in xp-mps-2proc's controller.
  mps_start
  timeout 60 $XP --json bench info | tee $R/info-mps-daemon.json
  S=lc-alone,lc-alone-daemon,be-alone,mps-prio,xp-mps-2proc,xp-daemon-mps-2proc
  lcbe mps-daemon --scenarios $S --secs $SECS --label mps-daemon --out $R/lcbe-mps-daemon.json --svg $R/lcbe-mps-daemon.svg
  lcbe mps-daemon-persistent --scenarios $S --secs $SECS --persistent --label mps-daemon --out $R/lcbe-mps-daemon-persistent.json --svg $R/lcbe-mps-daemon-persistent.svg
  mps_stop ;;
idle-poll)
  # Under MPS (32 connections): the idle watcher polling (the default) against woken at every
  # submission (XP_BENCH_IDLE_POLL_US=0), alternating ROUNDS times on this machine, per-request
  # marks summarized by lcbe-marks.py.
  MPS_CONN=${MPS_CONN:-32} mps_start
  S=lc-alone,lc-alone-daemon,be-alone,xp-daemon-mps-2proc,xp-lv2-1proc,xp-sched-lv2-1proc
  for round in $(seq 1 ${ROUNDS:-3}); do for poll in 50000 0; do
    t=poll$poll-$round
    XP_BENCH_IDLE_POLL_US=$poll lcbe idle-$t --scenarios $S --secs $SECS --label mps --marks $R/marks-$t --out $R/lcbe-$t.json
    python3 bench/lcbe-marks.py $R/marks-$t --json $R/marks-$t.json > $R/marks-$t.txt 2>&1
    grep -A5 "^lc-alone-daemon\|^xp-daemon\|^xp-sched" $R/marks-$t.txt | grep -E "^[lx]|latency|between"
  done; done
  mps_stop ;;
conformance)
  # The CUDA conformance suite: every program natively and under the shim at each level, with
  # and without random suspensions, digests compared with native (about 5 minutes).
  XPREEMPT_BIN=$XP TIMEOUT=40 RESULTS=$R/cuda-apps timeout 400 bash tests/cuda-apps/run.sh /tmp/xp-apps \
    > $R/cuda-apps.log 2>&1 || { echo "FAILED: conformance"; FAILED="$FAILED conformance"; }
  tail -20 $R/cuda-apps/summary.txt ;;
fork-chaos)
  # fork_after_init repeated under random suspensions; a hang or failure fails the step.
  OUT=$R/fork SEEDS=${FORK_SEEDS:-40} LEVELS="${FORK_LEVELS:-1 2 3}" XP=$XP timeout 570 \
    bash bench/run-fork-chaos.sh > $R/fork-chaos.txt 2>&1 || { echo "FAILED: fork-chaos"; FAILED="$FAILED fork-chaos"; }
  grep -h HANG $R/fork-chaos.txt; cat $R/fork/fork.jsonl ;;
esac; done
date -u
