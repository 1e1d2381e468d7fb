#!/bin/bash
# What Lv2 buys an unmodified application (bench/cuda/lv2_pair.cu): a best-effort process with
# guard-built kernels of long blocks beside a latency-critical process doing short requests, under
# a private `xpreempt daemon`. Scenarios: the LC process alone; then, for each BE block length,
# the pair without xpreempt (time slicing), and with the BE process at `xpreempt run --level
# 1|2|3 --priority 0` (flow control by stream synchronizes; at Lv2 also by event records, which
# make its suspensions drain) and the LC at `xpreempt run --priority 10`; the BE alone at Lv1 and
# Lv2 (its throughput). Each BE run also checks that every block ran exactly once.
#
#   XPREEMPT_BIN=/path/xpreempt bench/run-lv2-pair.sh OUT_DIR
#
# Environment: BLOCK_US (BE block lengths in us, default "2000 200"), REQUESTS (LC requests, default 300),
# PERIOD_MS (between LC requests, default 10), BE_SECONDS (default 6), CUDA_ARCH (default native).
# Writes OUT_DIR/lv2-pair.json (one object per scenario) and OUT_DIR/lv2-pair.log.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${1:?usage: run-lv2-pair.sh OUT_DIR}
XP=${XPREEMPT_BIN:?set XPREEMPT_BIN}
BLOCK_US=${BLOCK_US:-2000 200}
REQUESTS=${REQUESTS:-300}
PERIOD_MS=${PERIOD_MS:-10}
BE_SECONDS=${BE_SECONDS:-6}
mkdir -p "$OUT"
if ! command -v nvcc >/dev/null; then
  for d in /usr/local/cuda/bin /usr/local/cuda-*/bin; do [ -x "$d/nvcc" ] && PATH=$d:$PATH && break; done
fi
GUARD_DIR=${GUARD_DIR:-$HERE/../crates/backends/cuda/src}
BIN=$OUT/lv2_pair
nvcc -O2 -std=c++20 -arch="${CUDA_ARCH:-native}" -I"$GUARD_DIR" -o "$BIN" "$HERE/cuda/lv2_pair.cu"

SOCK=$(mktemp -d)/xpreempt.sock
"$XP" daemon --socket "$SOCK" >"$OUT/daemon.log" 2>&1 &
DAEMON=$!
trap 'kill $DAEMON 2>/dev/null || true' EXIT
for _ in $(seq 200); do [ -S "$SOCK" ] && break; sleep 0.05; done
[ -S "$SOCK" ] || { echo "the daemon did not start"; cat "$OUT/daemon.log"; exit 1; }
export XPREEMPT_SOCKET=$SOCK

JSON=$OUT/lv2-pair.json
echo "[" >"$JSON"
first=1
emit() { # scenario be_json lc_json
  [ $first = 1 ] || echo "," >>"$JSON"
  first=0
  printf '{"scenario": "%s", "be": %s, "lc": %s}' "$1" "${2:-null}" "${3:-null}" >>"$JSON"
}

lc_cmd() { if [ "$1" = native ]; then echo "$BIN"; else echo "$XP run --priority 10 -q -- $BIN"; fi; }
be_cmd() {
  case $1 in
    native) echo "$BIN" ;;
    *) echo "$XP run --level $1 --priority 0 -q -- $BIN" ;;
  esac
}

# The LC process alone (under xpreempt, as in the pairs).
echo "== lc alone"
LC=$($(lc_cmd xp) lc "$REQUESTS" "$PERIOD_MS" | tail -1)
echo "$LC"
emit lc_alone "" "$LC"

for block in $BLOCK_US; do
  for mode in native 1 2 2-events 3; do
    level=${mode%-events}; flow=sync; [ "$mode" = 2-events ] && flow=events
    echo "== pair: be $mode, ${block} us blocks"
    lcmode=xp; [ "$mode" = native ] && lcmode=native
    tag=$mode-$block
    $(be_cmd "$level") be "$BE_SECONDS" "$block" "$flow" >"$OUT/be-$tag.out" 2>"$OUT/be-$tag.err" &
    BE=$!
    sleep 1
    LC=$($(lc_cmd $lcmode) lc "$REQUESTS" "$PERIOD_MS" 2>"$OUT/lc-$tag.err" | tail -1)
    wait $BE || echo "BE ($tag) failed: $(tail -3 "$OUT/be-$tag.err")"
    BEJ=$(tail -1 "$OUT/be-$tag.out")
    echo "BE: $BEJ"
    echo "LC: $LC"
    name=pair_native; [ "$mode" = native ] || name=pair_be_lv$mode
    emit "${name}_${block}us" "$BEJ" "$LC"
  done
  for level in 1 2; do
    echo "== be alone at level $level, ${block} us blocks"
    BEJ=$($(be_cmd "$level") be 3 "$block" | tail -1)
    echo "$BEJ"
    emit "be_alone_lv${level}_${block}us" "$BEJ" ""
  done
done
echo "]" >>"$JSON"
echo "JSON: $JSON"
