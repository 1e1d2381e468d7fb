#!/bin/bash
# fork_after_init (tests/cuda-apps) repeated under random suspend/resume, to catch a rare hang:
# a child that leaves with exit() runs CUDA's exit handlers, which hang on any lock a thread of
# the parent held at the fork. Prints one JSON line per level and exits 1 on any hang or failure.
#   XP=/path/xpreempt SEEDS=24 LEVELS="1 3" bash bench/run-fork-chaos.sh
# (the shim beside XP must be built with `--features chaos`: random suspensions are test machinery)
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
XP=${XP:?path of the xpreempt binary}
OUT=${OUT:-/tmp/xp-fork}; mkdir -p "$OUT"
nvcc -O2 -std=c++20 -arch=native -I"$ROOT/tests/cuda-apps" -o /tmp/fork_after_init "$ROOT/tests/cuda-apps/fork_after_init.cu" || exit 2
bad=0
for lvl in ${LEVELS:-1 3}; do
  pass=0; hang=0; fail=0
  for seed in $(seq 1 "${SEEDS:-24}"); do
    XPREEMPT_SHIM_BACKTRACE=1 XPREEMPT_CHAOS=$seed:${PERIOD_US:-500} "$XP" run -q --level "$lvl" -- /tmp/fork_after_init \
      > "$OUT/fork-L$lvl-$seed.out" 2> "$OUT/fork-L$lvl-$seed.err" &
    pid=$!
    for _ in $(seq 1 150); do kill -0 $pid 2>/dev/null || break; sleep 0.1; done
    if kill -0 $pid 2>/dev/null; then
      hang=$((hang + 1)); echo "HANG level $lvl seed $seed (last: $(tail -1 "$OUT/fork-L$lvl-$seed.out"))"
      # Where each process stands: its threads' system calls, then (XPREEMPT_SHIM_BACKTRACE=1,
      # set below) a SIGABRT that prints the stack of the thread it lands on to the .err file.
      for p in $(pgrep -P $pid) $pid; do
        d=$OUT/fork-L$lvl-$seed.pid$p; mkdir -p "$d"; cp /proc/$p/maps "$d/maps" 2>/dev/null
        for t in /proc/$p/task/*; do
          echo "$(basename "$t") $(cat "$t/comm") state=$(awk '{print $3}' "$t/stat") wchan=$(cat "$t/wchan" 2>/dev/null) syscall=$(cat "$t/syscall" 2>/dev/null)"
        done > "$d/tasks"
        cat "$d/tasks"
      done
      for p in $(pgrep -P $pid); do kill -ABRT "$p"; done; sleep 1
      pkill -9 -P $pid; kill -9 $pid; wait $pid 2>/dev/null
    elif wait $pid; then pass=$((pass + 1))
    else fail=$((fail + 1)); echo "FAIL level $lvl seed $seed"; fi
  done
  echo "{\"level\": $lvl, \"runs\": ${SEEDS:-24}, \"pass\": $pass, \"hang\": $hang, \"fail\": $fail, \"chaos_period_us\": ${PERIOD_US:-500}}" | tee -a "$OUT/fork.jsonl"
  [ $((hang + fail)) -eq 0 ] || bad=1
done
exit $bad
