#!/bin/bash
# How fast a backlogged low-priority stream's window (16 commands) is fed, on any machine:
# backlog.c against the stand-in libcuda (2 µs kernels), natively and under the shim with the
# feeding regimes that XPREEMPT_OWN_WAIT_US and XPREEMPT_FEED_ON_SUBMIT select, on the legacy
# stream and a created one, with 0 and 1 µs of host work per launch. One JSON line per case.
#   cargo build --release -p xpreempt-shim && bash bench/shim-cpu/backlog.sh [ROUNDS]
set -eu -o pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
SHIM=${SHIM:-$HERE/../../target/release/libxpreempt_shim.so}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
gcc -O2 -shared -fPIC -Wl,-Bsymbolic -o "$W/libcuda.so.1" "$HERE/fake_libcuda.c" -lpthread
gcc -O2 -o "$W/backlog" "$HERE/backlog.c" -ldl
[ -f "$SHIM" ] || { echo "no shim at $SHIM (cargo build --release -p xpreempt-shim)" >&2; exit 1; }
shim=(LD_PRELOAD="$SHIM" XPREEMPT_INTERCEPT=1 XPREEMPT_PRIORITY=0 XPREEMPT_SOCKET="$W/no-daemon.sock")
for round in $(seq "${1:-3}"); do
  for regime in native default own-wait-off feed own-wait-off+feed; do
    case $regime in
      native) env=() ;;
      default) env=("${shim[@]}") ;;
      own-wait-off) env=("${shim[@]}" XPREEMPT_OWN_WAIT_US=0) ;;
      feed) env=("${shim[@]}" XPREEMPT_FEED_ON_SUBMIT=1) ;;
      own-wait-off+feed) env=("${shim[@]}" XPREEMPT_OWN_WAIT_US=0 XPREEMPT_FEED_ON_SUBMIT=1) ;;
    esac
    for stream in legacy created; do
      for host_ns in 0 1000; do
        r=$(env "${env[@]}" LD_LIBRARY_PATH="$W" "$W/backlog" 300 "$([ $stream = created ] && echo 1 || echo 0)" "$host_ns" 2>/dev/null)
        echo "{\"round\": $round, \"regime\": \"$regime\", \"stream\": \"$stream\", \"host_ns\": $host_ns, \"result\": $r}"
      done
    done
  done
done
