#!/bin/bash
# The RM hooks' acceptance checks on the GPU machine, in one run:
#   record    one context's RM calls as the shim sees them (the test fixture; ordering; TSG id,
#             driver timeslice) and the solo kernel rate
#   share0    two processes, no policy: GPU shares
#   share1    two processes, rm_timeslice.o in the daemon: A 10 ms, B 2 ms (set live by pid)
#   admit     rm_admission.o, pinned (in-process): B's context waits until A exits
#   bound     the same with the default 1 s bound: B goes through after 1 s, logged
#   lcbe      lcbe.o in the daemon, fed by the agents' launches: small-kernel submitter LC,
#             long-kernel trainer BE (maps dumped live)
#   fault     a rejected program, no daemon, a daemon killed mid-run: processes unaffected
#
# The GPU machine needs no Rust toolchain: build elsewhere and pack one folder to copy over,
#   cargo build --release -p xpreempt-cli -p xpreempt-shim -p xpreempt-daemon
#   bash bench/rm-hooks/pack.sh DIR      # binaries, eBPF objects, spin.cu and this script
# then on the GPU machine: bash DIR/run.sh [OUT_DIR]
set -u -o pipefail
C=$(cd "$(dirname "$0")" && pwd)
OUT=${1:-${OUT:-rmhooks-results}}
W=/tmp/rmh
rm -rf "$W"
mkdir -p "$OUT" "$W"
SHIM=$C/libxpreempt_shim.so
XP=$C/xpreempt
XPD=$C/xpreemptd
P=$C/policies
R=$OUT/results.jsonl
: >"$R"
: >"$OUT/logs.txt"
FAILED=""
fail() { FAILED="$FAILED $1"; echo "FAILED: $1"; }
ms() { date +%s%3N; }
# A case's process: name, then env assignments and the command (stdout JSON, stderr log).
proc() {
  local name=$1
  shift
  env LD_PRELOAD="$SHIM" "$@" >"$W/$name.json" 2>"$W/$name.err"
}
emit() { # case, process names... (their stderr goes to logs.txt at once)
  local case=$1
  shift
  for n in "$@"; do
    { echo "### $case/$n"; grep -v 'rm-rec' "$W/$n.err" | head -60; } >>"$OUT/logs.txt" 2>&1
    echo "{\"case\": \"$case\", \"proc\": \"$n\", \"result\": $(cat "$W/$n.json" 2>/dev/null | tail -1 || echo null)}" >>"$R"
    grep -q '"ok": true' "$W/$n.json" || fail "$case/$n"
  done
}
start_daemon() { # policy.o name
  export XPREEMPT_SOCKET=$W/$2.sock
  XPREEMPT_LOG=info "$XPD" --socket "$XPREEMPT_SOCKET" --policy "$1" >"$W/daemon-$2.log" 2>&1 &
  DPID=$!
  for _ in $(seq 100); do [ -S "$XPREEMPT_SOCKET" ] && return 0; sleep 0.05; done
  fail "daemon-$2"
}
stop_daemon() { kill "$DPID" 2>/dev/null; wait "$DPID" 2>/dev/null; }
live() { "$XP" --json policy --daemon --socket "$XPREEMPT_SOCKET" "$@"; }
# The spin process a background `proc` started (bash may or may not fork once more for it).
spin_pid() {
  local p
  for p in /proc/[0-9]*; do
    [ "$(cat "$p/comm" 2>/dev/null)" = spin ] || continue
    if [ "$(awk '{print $4}' "$p/stat" 2>/dev/null)" = "$1" ]; then
      basename "$p"
      return
    fi
  done
  echo "$1"
}

{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  head -1 /proc/driver/nvidia/version
  nvcc --version | tail -2
}
nvcc -O2 -arch=native -o "$W/spin" "$C/spin.cu" || { echo "nvcc failed"; exit 1; }
SPIN=$W/spin

echo "=== record $(date -u +%T)"
proc rec XPREEMPT_RM_POLICY="$P/rm_timeslice.o" XPREEMPT_SHIM_LOG=3 "$SPIN" --mode share --seconds 2
grep 'rm-rec' "$W/rec.err" >"$OUT/rm-record.txt"
emit record rec

echo "=== share0 $(date -u +%T)"
go=$(($(ms) + 3000))
proc a0 "$SPIN" --mode share --seconds 3 --go-at-ms $go &
P0A=$!
proc b0 "$SPIN" --mode share --seconds 3 --go-at-ms $go &
P0B=$!
wait $P0A $P0B
emit share0 a0 b0

echo "=== share1 $(date -u +%T)"
start_daemon "$P/rm_timeslice.o" ts
go=$(($(ms) + 5000))
proc a1 XPREEMPT_RM_HOOKS=daemon XPREEMPT_SHIM_LOG=1 "$SPIN" --mode share --seconds 3 --go-at-ms $go --wait-file "$W/go1" &
PA=$!
proc b1 XPREEMPT_RM_HOOKS=daemon XPREEMPT_SHIM_LOG=1 "$SPIN" --mode share --seconds 3 --go-at-ms $go --wait-file "$W/go1" &
PB=$!
sleep 0.3
SA=$(spin_pid $PA)
SB=$(spin_pid $PB)
live map set process_timeslice_us "$SA" 10000 >"$W/set-a.json" || fail share1-set
live map set process_timeslice_us "$SB" 2000 >"$W/set-b.json" || fail share1-set
touch "$W/go1"
sleep 5.5
live map dump given_us >"$OUT/share1-given_us.json" || fail share1-dump
wait $PA $PB
stop_daemon
echo "{\"case\": \"share1\", \"pids\": {\"a\": $SA, \"b\": $SB}}" >>"$R"
emit share1 a1 b1

echo "=== admit $(date -u +%T)"
export XPREEMPT_STATE_DIR=$W/state
"$XP" --json policy load "$P/rm_admission.o" >"$W/admit-load.json" || fail admit-load
proc a2 XPREEMPT_RM_HOOKS=pinned XPREEMPT_RM_ADMIT_WAIT_MS=20000 XPREEMPT_SHIM_LOG=1 "$SPIN" --mode share --seconds 3 &
P2A=$!
sleep 1
proc b2 XPREEMPT_RM_HOOKS=pinned XPREEMPT_RM_ADMIT_WAIT_MS=20000 XPREEMPT_SHIM_LOG=1 "$SPIN" --mode share --seconds 1 &
P2B=$!
sleep 1.5
{
  "$XP" --json policy map dump holders
  "$XP" --json policy map dump refusals
} >"$OUT/admit-maps-while-waiting.json" 2>&1
wait $P2A $P2B
"$XP" --json policy map dump held >>"$OUT/admit-maps-while-waiting.json" 2>&1
emit admit a2 b2

echo "=== bound $(date -u +%T)"
proc a3 XPREEMPT_RM_HOOKS=pinned XPREEMPT_SHIM_LOG=1 "$SPIN" --mode share --seconds 3 &
P3A=$!
sleep 0.7
proc b3 XPREEMPT_RM_HOOKS=pinned XPREEMPT_SHIM_LOG=1 "$SPIN" --mode share --seconds 1 &
P3B=$!
wait $P3A $P3B
emit bound a3 b3
unset XPREEMPT_STATE_DIR

echo "=== lcbe $(date -u +%T)"
start_daemon "$P/lcbe.o" lcbe
export XPREEMPT_RM_HOOKS=daemon XPREEMPT_SHIM_LOG=1
"$XP" run -q --level 1 -- "$SPIN" --mode small --seconds 5 >"$W/small.json" 2>"$W/small.err" &
PS=$!
sleep 1.5
"$XP" run -q --level 1 -- "$SPIN" --mode train --seconds 3.5 >"$W/train.json" 2>"$W/train.err" &
PT=$!
sleep 2.5
{
  live map dump task_type_map
  live map dump task_stats_map
} >"$OUT/lcbe-maps-live.json" || fail lcbe-dump
wait $PS $PT
unset XPREEMPT_RM_HOOKS XPREEMPT_SHIM_LOG
stop_daemon
emit lcbe small train

echo "=== fault $(date -u +%T)"
proc f1 XPREEMPT_RM_POLICY="$P/bad_loop.o" "$SPIN" --mode share --seconds 1
proc f2 XPREEMPT_RM_HOOKS=daemon XPREEMPT_SOCKET=$W/none.sock "$SPIN" --mode share --seconds 1
start_daemon "$P/rm_admission.o" dies
proc f3 XPREEMPT_RM_HOOKS=daemon XPREEMPT_SHIM_LOG=1 "$SPIN" --mode share --seconds 2 &
P3=$!
sleep 1.2
kill -9 "$DPID"
wait $P3 "$DPID"
emit fault f1 f2 f3

# Shares and the admission timeline.
python3 - "$R" >"$OUT/summary.txt" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
res = {r["proc"]: r["result"] for r in rows if "proc" in r and r.get("result")}
def line(f):
    try:
        print(f())
    except Exception as e:
        print(f"(missing: {e!r})")
solo = res.get("rec", {}).get("rate_per_s", 0) or 1
line(lambda: f"solo rate {solo:.0f} kernels/s ({res['rec']['kernels']} in {res['rec']['busy_ms']:.0f} ms)")
for case, a, b in [("share0 (no policy)", "a0", "b0"), ("share1 (A 10 ms, B 2 ms)", "a1", "b1")]:
    def share(case=case, a=a, b=b):
        ra, rb = res[a]["rate_per_s"] / solo, res[b]["rate_per_s"] / solo
        return f"{case}: A {100*ra:.1f} % of solo, B {100*rb:.1f} %, A/B {ra/rb:.2f}"
    line(share)
for case, a, b in [("admit (bound 20 s)", "a2", "b2"), ("bound (1 s)", "a3", "b3")]:
    def timeline(case=case, a=a, b=b):
        A, B = res[a], res[b]
        t0 = A["t_start_ms"]
        return (f"{case}: A busy {A['t_busy_ms']-t0:.0f}..{A['t_end_ms']-t0:.0f} ms; B started at "
                f"{B['t_start_ms']-t0:.0f} ms, its context took {B['ctx_create_ms']:.0f} ms (ready at "
                f"{B['t_ctx_ms']-t0:.0f} ms); A ok {A['ok']}, B ok {B['ok']}")
    line(timeline)
for n in ["small", "train", "f1", "f2", "f3"]:
    line(lambda n=n: f"{n}: {res[n]['kernels']} kernels, {res[n]['rate_per_s']}/s, ok {res[n]['ok']}")
EOF
cat "$OUT/summary.txt"
for f in "$W"/daemon-*.log; do echo "### $f"; grep -v 'client connected\|client gone' "$f" | head -40; done >>"$OUT/logs.txt" 2>&1
if [ -n "$FAILED" ]; then
  echo "FAILED:$FAILED" | tee -a "$OUT/summary.txt"
  exit 1
fi
echo "all passed" | tee -a "$OUT/summary.txt"
