#!/bin/bash
# The shim's own CPU cost per launch, on any machine: a launch loop (256 asynchronous launches
# per batch, as bench/cuda/launch_overhead.cu does on the GPU) against a stand-in libcuda whose
# launch costs ~25 ns (a global lock and a virtual timeline, no device), natively and under the
# shim as `xpreempt run` sets it up (high priority, low priority, pass-through). The difference
# is the shim's cost without the real driver's own contention, which only the GPU run shows.
# "requests": 3000 requests of 10 launches and a stream synchronize, 1 ms apart (LC requests
# on a 2 µs-per-kernel virtual device), p50/p90/p99 µs.
# "backlog" (second argument): how fast a backlogged low-priority stream's window (16 commands) is
# fed, natively and under the shim, on the legacy stream and a created one, with 0 and 1 µs of
# host work per launch.
#   cargo build --release -p xpreempt-shim && bash bench/shim-cpu/run.sh [ROUNDS] [backlog]
set -eu -o pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
SHIM=${SHIM:-$HERE/../../target/release/libxpreempt_shim.so}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
gcc -O2 -shared -fPIC -Wl,-Bsymbolic -o "$W/libcuda.so.1" "$HERE/fake_libcuda.c" -lpthread
gcc -O2 -o "$W/launch_loop" "$HERE/launch_loop.c" -ldl
[ -f "$SHIM" ] || { echo "no shim at $SHIM (cargo build --release -p xpreempt-shim)" >&2; exit 1; }
if [ "${2:-}" = backlog ]; then
  shim=(LD_PRELOAD="$SHIM" XPREEMPT_INTERCEPT=1 XPREEMPT_PRIORITY=0 XPREEMPT_SOCKET="$W/no-daemon.sock")
  for round in $(seq "${1:-3}"); do
    for regime in native default; do
      case $regime in
        native) env=() ;;
        default) env=("${shim[@]}") ;;
      esac
      for stream in legacy created; do
        for host_ns in 0 1000; do
          r=$(env "${env[@]}" LD_LIBRARY_PATH="$W" "$W/launch_loop" backlog 300 "$([ $stream = created ] && echo 1 || echo 0)" "$host_ns" 2>/dev/null)
          echo "{\"round\": $round, \"regime\": \"$regime\", \"stream\": \"$stream\", \"host_ns\": $host_ns, \"result\": $r}"
        done
      done
    done
  done
  exit 0
fi
for round in $(seq "${1:-3}"); do
  for mode in native lc be pass; do
    case $mode in
      native) env=() ;;
      lc) env=(LD_PRELOAD="$SHIM" XPREEMPT_INTERCEPT=1 XPREEMPT_PRIORITY=10) ;;
      be) env=(LD_PRELOAD="$SHIM" XPREEMPT_INTERCEPT=1 XPREEMPT_PRIORITY=0) ;;
      pass) env=(LD_PRELOAD="$SHIM" XPREEMPT_INTERCEPT=1 XPREEMPT_PASS_THROUGH=1) ;;
    esac
    r=$(env "${env[@]}" LD_LIBRARY_PATH="$W" "$W/launch_loop" 40000)
    q=$(env "${env[@]}" LD_LIBRARY_PATH="$W" "$W/launch_loop" 0 3000)
    echo "{\"round\": $round, \"mode\": \"$mode\", \"result\": $r, \"requests\": $q}"
  done
done
