#!/bin/bash
# The CUDA backend's measurements on a GPU machine: environment, GPU tests, preemption latency,
# LC/BE scenarios (time-sliced and under MPS, BE normal and persistent), global mode, the
# per-goal rounds pooled, the CUDA conformance suite.
#
#   bash bench/run-gpu.sh [OUT_DIR]        (from the repository root)
#
# OUT_DIR [default: $OUT, else gpu-results] receives log.txt and every step's JSON, SVG and text.
# The binaries come from BIN [default: target/release]: xpreempt, libxpreempt_shim.so and the
# benchmarks' binary xpreempt-bench; the test binaries
# from GPU_TESTS [default: $BIN/gpu-tests], CUDA_CONFORMANCE [default: $BIN/cuda-conformance] and
# SHIM_CONFORMANCE [default: $BIN/shim-conformance] (the HAL conformance suite against the CUDA queue
# through cudarc's driver, and through the shim's own libcuda table).
# The GPU machine needs no Rust toolchain: build elsewhere and copy BIN's files over. Test
# binaries get a hashed name, which cargo prints as "Executable ... (path)":
#   cargo build --release -p xpreempt-cli -p xpreempt-bench && cargo build --release -p xpreempt-shim --features chaos
# (the chaos feature: the conformance and fork-chaos steps inject random suspensions, test
# machinery that a product shim leaves out; it does nothing unless XPREEMPT_CHAOS is set. Build
# the shim on its own: with other packages beside it, `--features xpreempt-shim/chaos` left the
# feature out of the shim's library. tests/cuda-apps/run.sh refuses a shim without it.)
#   exe() { sed -n 's/^ *Executable .*(\(.*\))$/\1/p'; }
#   cp "$(cargo test --release -p xpreempt-bench --test gpu --no-run 2>&1 | exe)" target/release/gpu-tests
#   cp "$(cargo test --release -p xpreempt-cuda --test conformance --no-run 2>&1 | exe)" target/release/cuda-conformance
#   cp "$(cargo test --release -p xpreempt-shim --test gpu_conformance --no-run 2>&1 | exe)" target/release/shim-conformance
#
# STEPS picks what runs, in order [default: info tests latency lcbe mps]:
#   info lv3 tests latency smoke sched lcbe lcbe-persistent mps mps-persistent   one run each
#   daemon request       global mode's decision latency and a request's overhead (CPU only)
#   daemon-gpu mps-daemon  global mode on the GPU through a private `xpreempt daemon`, SECS per scenario
#   gpu-elapsed idle-poll  the LC's GPU time beside its wall time; the idle watcher's polling A/B
#   goal-ts goal-mps goal-daemon goal-alone   the scheduler paths against the bench-only
#                        controllers, ROUNDS rounds of SECS per scenario, each request's latency
#                        kept (lat-*.json); `pool` (last) pools them per goal (bench/pool-goals.py)
#   conformance conformance-lv2 fork-chaos   tests/cuda-apps under `xpreempt run` (every level;
#                        Lv2 alone with LV2_SEEDS); fork_after_init repeated under random
#                        suspensions (FORK_SEEDS per level)
# Other settings: SECS (5), ROUNDS ("1 2 3"), MPS_CONN (CUDA_DEVICE_MAX_CONNECTIONS under MPS),
# PROBE=1 (each goal run under bench/probe.py: thread switches, steal time), BUDGET (seconds
# after which the goal steps stop starting runs, default unlimited).
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${1:-${OUT:-gpu-results}}
mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
R=$OUT
BIN=${BIN:-$ROOT/target/release}
GPU_TESTS=${GPU_TESTS:-$BIN/gpu-tests}
CUDA_CONFORMANCE=${CUDA_CONFORMANCE:-$BIN/cuda-conformance}
SHIM_CONFORMANCE=${SHIM_CONFORMANCE:-$BIN/shim-conformance}
cd "$ROOT"
exec > >(tee "$OUT/log.txt") 2>&1
NV=$(dirname "$(find /usr/local/cuda*/ /usr/lib /opt -name 'libnvrtc.so*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=$NV:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export XPREEMPT_LOG=${XPREEMPT_LOG:-warn}
XP=$BIN/xpreempt
SHIM=$BIN/libxpreempt_shim.so
BENCH=${BENCH:-$BIN/xpreempt-bench}
BENCH_DAEMON=${BENCH_DAEMON:-$BENCH daemon}
BENCH_REQUEST=${BENCH_REQUEST:-$BENCH request}
START=$(date +%s)
late() { [ -n "${BUDGET:-}" ] && [ $(( $(date +%s) - START )) -gt "$BUDGET" ]; }
STEPS=${STEPS:-info tests latency lcbe mps}
# Measuring window of the global-mode steps (daemon-gpu, mps-daemon), seconds per scenario.
SECS=${SECS:-5}
# Steps that record failures here make the script exit 1 at the end.
FAILED=""
# `bench lcbe` for a step that must not fail silently: exit 3 means it ran and printed, but a
# scenario failed (its error is in the table and the JSON).
lcbe() {
  local what=$1; shift
  timeout ${LCBE_TIMEOUT:-110} $BENCH lcbe "$@" || { echo "FAILED: bench lcbe $what (rc $?)"; FAILED="$FAILED $what"; }
}
mps_start() {
  [ -n "${MPS_ON:-}" ] && return
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/xp-mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/xp-mps-log
  # MPS clients get few hardware connections by default, so streams of one process can share
  # one and serialize (seen: in-process LC p99 0.8 ms behind a persistent BE). MPS_CONN=32 raises it.
  [ -n "${MPS_CONN:-}" ] && export CUDA_DEVICE_MAX_CONNECTIONS=$MPS_CONN
  mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
  nvidia-cuda-mps-control -d && echo "MPS daemon started"; MPS_ON=1
  trap 'echo quit | nvidia-cuda-mps-control; finish' EXIT
}
mps_stop() { echo quit | nvidia-cuda-mps-control; sleep 1; MPS_ON=""; trap finish EXIT; }
# Rounds of the scheduler path against its bench-only controller: label, scenarios. Each run's
# per-request LC latencies (µs) go to lat-LABEL-ROUND.json as {scenario: [...]}, for pooling.
goal() {
  local label=$1 s=$2 round t
  for round in ${ROUNDS:-1 2 3}; do
    late && { echo "$label: budget spent, round $round not started"; return; }
    t=$label-$round
    timeout 150 ${PROBE:+python3 bench/probe.py $R/probe-$t.json} $BENCH lcbe ${LCBE_ARGS:-} --scenarios $s \
      --secs $SECS --label $t --samples --out $R/lcbe-$t.json | grep -v "^scenario .*\.\.\.$"
    [ -s "$R/lcbe-$t.json" ] || { echo "FAILED: $t wrote no JSON"; FAILED="$FAILED $t"; continue; }
    python3 - "$R/lcbe-$t.json" "$R/lat-$t.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))
rows = rows if isinstance(rows, list) else rows.get("results", rows)
json.dump({r["scenario"]: [round(x, 2) for x in (r.get("lc") or {}).get("samples_us") or []] for r in rows},
          open(sys.argv[2], "w"))
PY
  done
}
date -u; nvidia-smi --query-gpu=name,driver_version,compute_mode --format=csv; cat /proc/driver/nvidia/version
echo "nvrtc: $NV"
finish() { if [ -n "$FAILED" ]; then echo "FAILED steps:$FAILED"; exit 1; fi; }
trap finish EXIT
for s in $STEPS; do case $s in
info)
  timeout 60 $BENCH --json info | tee $R/info.json
  LD_PRELOAD=$SHIM XPREEMPT_SHIM_LOG=2 timeout 60 $BENCH --json info 2>$R/shim-allocs.txt | tee $R/info-shim.json
  grep -c RM_ALLOC $R/shim-allocs.txt; grep -i "a06c\|channel group" $R/shim-allocs.txt | head -20 ;;
lv3)
  LD_PRELOAD=$SHIM XPREEMPT_SHIM_LOG=1 timeout 60 $BENCH lv3-probe --out $R/lv3-probe.json ;;
tests)
  XPREEMPT_BIN=$XP XPREEMPT_SHIM=$SHIM timeout 180 $GPU_TESTS --ignored --test-threads=1 --nocapture 2>&1 | tee $R/gpu-tests.txt
  timeout 120 $CUDA_CONFORMANCE --ignored --test-threads=1 --nocapture 2>&1 | tee $R/cuda-conformance.txt
  timeout 120 $SHIM_CONFORMANCE --ignored --test-threads=1 --nocapture 2>&1 | tee $R/shim-conformance.txt ;;
daemon)
  # Global mode's decision latency (CPU only) on this idle 16-core machine: 2, 8, 64 clients.
  for n in 2 8 64; do
    timeout 120 $BENCH_DAEMON --json --clients $n --samples ${SAMPLES:-3000} --out $R/bench-daemon-c$n.json > /dev/null || echo "bench-daemon $n failed"
  done
  cat $R/bench-daemon-*.json ;;
request)
  # What the stack adds to a stand-in request (CPU only), each path three times, interleaved.
  for round in 1 2 3; do
    timeout 120 $BENCH_REQUEST --requests ${REQUESTS:-3000} --out $R/bench-request-$round.json || echo "bench-request $round failed"
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
  timeout 120 $BENCH lcbe --scenarios $S --label sched --out $R/lcbe-sched.json
  timeout 120 $BENCH lcbe --scenarios $S --persistent --label sched --out $R/lcbe-sched-persistent.json ;;
latency)
  timeout 200 $BENCH --json latency --trials ${TRIALS:-15} --out $R/latency.json --svg $R/latency.svg > /dev/null ;;
smoke)
  timeout 100 $BENCH lcbe --scenarios lc-alone,be-alone,be-alone-xp,xp-lv2-1proc --label smoke --out $R/lcbe-smoke.json
  timeout 100 $BENCH lcbe --scenarios lc-alone,be-alone,be-alone-xp,xp-lv2-1proc --persistent --label smoke --out $R/lcbe-smoke-persistent.json ;;
lcbe-persistent)
  S=lc-alone,be-alone,be-alone-xp,prio-1proc,xp-lv2-1proc,xp-sched-lv2-1proc
  timeout 100 $BENCH lcbe --scenarios $S --persistent --label timesliced --out $R/lcbe-persistent.json --svg $R/lcbe-persistent.svg ;;
mps-persistent)
  mps_start
  S=lc-alone,be-alone,be-alone-xp,mps-prio,xp-mps-2proc,xp-lv2-1proc
  timeout 120 $BENCH lcbe --scenarios $S --persistent --label mps --out $R/lcbe-mps-persistent.json --svg $R/lcbe-mps-persistent.svg
  mps_stop ;;
lcbe)
  S=lc-alone,be-alone,be-alone-xp,native-2proc,prio-1proc,xp-lv1-1proc,xp-lv2-1proc,xp-sched-lv2-1proc,xp-lv3-2proc,xp-lv3static-2proc
  timeout 150 $BENCH lcbe --scenarios $S --label timesliced --shim $SHIM --out $R/lcbe.json --svg $R/lcbe.svg
  timeout 150 $BENCH lcbe --scenarios $S --persistent --label timesliced --shim $SHIM --out $R/lcbe-persistent.json --svg $R/lcbe-persistent.svg ;;
mps)
  mps_start
  timeout 60 $BENCH --json info | tee $R/info-mps.json
  S=lc-alone,be-alone,be-alone-xp,mps-default,mps-prio,mps-client-prio,xp-mps-2proc,xp-lv2-1proc,xp-sched-lv2-1proc
  timeout 150 $BENCH lcbe --scenarios $S --label mps --out $R/lcbe-mps.json --svg $R/lcbe-mps.svg
  timeout 150 $BENCH lcbe --scenarios $S --persistent --label mps --out $R/lcbe-mps-persistent.json --svg $R/lcbe-mps-persistent.svg
  # Same-process scenarios again with more connections:
  CUDA_DEVICE_MAX_CONNECTIONS=32 timeout 100 $BENCH lcbe --scenarios lc-alone,be-alone,prio-1proc,xp-lv2-1proc,xp-sched-lv2-1proc --persistent --label mps-conn32 --out $R/lcbe-mps-conn32-persistent.json --svg $R/lcbe-mps-conn32-persistent.svg
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
  timeout 60 $BENCH --json info | tee $R/info-mps-daemon.json
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
conformance-lv2)
  # The suite at Lv2 alone (guard-built kernels stopped between blocks and relaunched), with
  # random suspensions at LV2_SEEDS; APPS narrows it to some programs (e.g. guard_lv2).
  PROGRAMS="${APPS:-}" LEVELS=2 CHAOS_SEEDS="${LV2_SEEDS:-1 2 3 4}" XPREEMPT_BIN=$XP TIMEOUT=60 RESULTS=$R/cuda-apps-lv2 \
    timeout 400 bash tests/cuda-apps/run.sh /tmp/xp-apps-lv2 > $R/cuda-apps-lv2.log 2>&1 \
    || { echo "FAILED: conformance-lv2"; FAILED="$FAILED conformance-lv2"; }
  tail -20 $R/cuda-apps-lv2/summary.txt ;;
fork-chaos)
  # fork_after_init repeated under random suspensions; a hang or failure fails the step.
  OUT=$R/fork SEEDS=${FORK_SEEDS:-40} LEVELS="${FORK_LEVELS:-1 2 3}" XP=$XP timeout 570 \
    bash bench/run-fork-chaos.sh > $R/fork-chaos.txt 2>&1 || { echo "FAILED: fork-chaos"; FAILED="$FAILED fork-chaos"; }
  grep -h HANG $R/fork-chaos.txt; cat $R/fork/fork.jsonl ;;
goal-ts)
  # In one process, time-sliced: the direct suspend against LocalScheduler. Before any MPS step.
  [ -n "${MPS_ON:-}" ] && mps_stop
  goal ts xp-lv2-1proc,xp-sched-lv2-1proc ;;
goal-mps)
  # 32 connections for these runs only: the daemon goal runs with MPS's default.
  mps_start
  CUDA_DEVICE_MAX_CONNECTIONS=32 goal mps be-alone,xp-lv2-1proc,xp-sched-lv2-1proc ;;
goal-daemon)
  # Two processes over MPS: the shared-word controller against xpreemptd (BE ≥ 0.93 of alone too).
  mps_start
  goal daemon be-alone,xp-mps-2proc,xp-daemon-mps-2proc ;;
goal-alone)
  # LC alone native against LC alone through the whole stack (goal: p99 ≤ 1.05×).
  mps_start
  goal alone lc-alone,lc-alone-daemon ;;
pool)
  python3 bench/pool-goals.py $R | tee $R/pool.txt ;;
esac; done
date -u
