#!/bin/bash
# The CUDA conformance suite: build every program with nvcc, run each natively (twice: the digest
# must be deterministic), then — given XPREEMPT_BIN and/or XPREEMPT_SHIM — under the shim at every
# level, with random suspend/resume injection, and in pass-through mode, comparing each run's
# digest bit for bit with the native one. A run that exceeds TIMEOUT seconds is a failure.
#
#   tests/cuda-apps/run.sh [BUILD_DIR]
#
# Environment:
#   XPREEMPT_BIN    path of `xpreempt`: shim runs go through `xpreempt run [--level L|--pass-through] --`
#   XPREEMPT_SHIM   path of libxpreempt_shim.so: without XPREEMPT_BIN, shim runs set LD_PRELOAD and
#                   XPREEMPT_INTERCEPT/XPREEMPT_LEVEL/XPREEMPT_PASS_THROUGH themselves
#   LEVELS          levels to run under the shim (default "1 2 3")
#   CHAOS_SEEDS     seeds for XPREEMPT_CHAOS=<seed>:<period_us> runs at every level (default "1 2 3");
#                   they need a shim built with `--features chaos` (checked before anything runs)
#   CHAOS_PERIOD_US mean period of injected suspend/resume (default 500)
#   XP_RUN_ARGS     extra arguments for `xpreempt run` (e.g. "--priority 5")
#   PROGRAMS        subset of programs to build and run (default: all)
#   TIMEOUT         seconds per run (default 120)
#   CUDA_ARCH       nvcc -arch value (default native)
#   RESULTS         where summary.json, summary.txt and logs/ go (default BUILD_DIR/results)
# Exit status: 0 iff every program built, passed in every mode and matched the native digest.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
BUILD=${1:-${TMPDIR:-/tmp}/xp-cuda-apps}
RESULTS=${RESULTS:-$BUILD/results}
TIMEOUT=${TIMEOUT:-120}
LEVELS=${LEVELS-1 2 3}
CHAOS_SEEDS=${CHAOS_SEEDS-1 2 3}
CHAOS_PERIOD_US=${CHAOS_PERIOD_US:-500}
ARCH=${CUDA_ARCH:-native}
ALL_PROGRAMS="sync_query wait_event default_stream per_thread memory_ops teardown driver_api launch_ex
capture_graph hostfunc_order mempool exit_pending threads fork_after_init guard_lv2 priority_chain"
PROGRAMS=${PROGRAMS:-$ALL_PROGRAMS}
# Random suspensions are test machinery, in a shim built with `--features chaos` only.
SHIM_FILE=${XPREEMPT_SHIM:-${XPREEMPT_BIN:+$(dirname "${XPREEMPT_BIN}")/libxpreempt_shim.so}}
if [ -n "$CHAOS_SEEDS" ] && [ -n "$SHIM_FILE" ] && ! grep -q xpreempt_shim_test_lv3_lowered "$SHIM_FILE"; then
  echo "CHAOS_SEEDS given, but $SHIM_FILE was built without the chaos feature:" >&2
  echo "  cargo build --release -p xpreempt-shim --features chaos (or CHAOS_SEEDS= to skip them)" >&2
  exit 2
fi
mkdir -p "$BUILD" "$RESULTS/logs"
export TMPDIR=${TMPDIR:-/tmp}
# nvcc and the CUDA libraries the programs link (libnvrtc) from the toolkit, where not on the path.
if ! command -v nvcc >/dev/null; then
  for d in /usr/local/cuda/bin /usr/local/cuda-*/bin; do [ -x "$d/nvcc" ] && PATH=$d:$PATH && break; done
fi
CUDA_HOME=$(dirname "$(dirname "$(command -v nvcc)")")
export LD_LIBRARY_PATH=$CUDA_HOME/lib64:${LD_LIBRARY_PATH:-}

# ---- build -------------------------------------------------------------------------------------
flags_for() {
  case $1 in
    per_thread) echo "--default-stream per-thread" ;;
    driver_api) echo "-lcuda -lnvrtc" ;;
    launch_ex) echo "-lcuda" ;;
    guard_lv2) echo "-I$HERE/../../crates/backends/cuda/src" ;;
  esac
}
echo "== build ($ARCH) into $BUILD"
BUILD_FAILED=""
for p in $PROGRAMS; do
  # shellcheck disable=SC2046
  ( nvcc -O2 -std=c++20 -arch="$ARCH" -I"$HERE" -o "$BUILD/$p" "$HERE/$p.cu" $(flags_for "$p") \
      >"$RESULTS/logs/build-$p.txt" 2>&1 || echo "$p" >>"$BUILD/.build-failed" ) &
done
rm -f "$BUILD/.build-failed"
wait
[ -f "$BUILD/.build-failed" ] && BUILD_FAILED=$(tr '\n' ' ' <"$BUILD/.build-failed")
for p in $BUILD_FAILED; do echo "BUILD FAILED: $p"; cat "$RESULTS/logs/build-$p.txt"; done

# ---- modes -------------------------------------------------------------------------------------
# A mode is a name; cmd_prefix prints what goes before the program for that mode.
MODES="native native2"
if [ -n "${XPREEMPT_BIN:-}${XPREEMPT_SHIM:-}" ]; then
  MODES="$MODES pass"
  for l in $LEVELS; do MODES="$MODES L$l"; done
  for l in $LEVELS; do for s in $CHAOS_SEEDS; do MODES="$MODES L$l-chaos$s"; done; done
fi

# Runs one program in one mode; sets RC and SECS, writes the logs.
run_one() {
  local p=$1 mode=$2 level="" chaos="" pass=0
  case $mode in
    pass) pass=1 ;;
    L*-chaos*) level=${mode%%-*}; level=${level#L}; chaos=${mode##*-chaos}:$CHAOS_PERIOD_US ;;
    L*) level=${mode#L} ;;
  esac
  local -a cmd=()
  if [ "$mode" != native ] && [ "$mode" != native2 ]; then
    if [ -n "${XPREEMPT_BIN:-}" ]; then
      # shellcheck disable=SC2206
      cmd=("$XPREEMPT_BIN" run ${XP_RUN_ARGS:-})
      if [ $pass = 1 ]; then cmd+=(--pass-through); else cmd+=(--level "$level"); fi
      cmd+=(--)
    else
      cmd=(env LD_PRELOAD="$XPREEMPT_SHIM" XPREEMPT_INTERCEPT=1)
      if [ $pass = 1 ]; then cmd+=(XPREEMPT_PASS_THROUGH=1); else cmd+=(XPREEMPT_LEVEL="$level"); fi
    fi
    [ -n "$chaos" ] && cmd=(env XPREEMPT_CHAOS="$chaos" "${cmd[@]}")
  fi
  local t0 t1
  t0=$(date +%s.%N)
  (cd "$TMPDIR" && timeout -k 10 "$TIMEOUT" "${cmd[@]}" "$BUILD/$p" \
      >"$RESULTS/logs/$p.$mode.out" 2>"$RESULTS/logs/$p.$mode.err")
  RC=$?
  t1=$(date +%s.%N)
  SECS=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
}

digest_of() { sed -n 's/^DIGEST \([0-9a-f]*\)$/\1/p' "$1" | tail -1; }

# ---- run ---------------------------------------------------------------------------------------
JSON="$RESULTS/summary.json"
TABLE="$RESULTS/summary.txt"
FAILURES=0
declare -A STATUS DIGEST
{
  echo "{"
  echo "  \"date\": \"$(date -u +%Y-%m-%dT%H:%M:%SZ)\","
  echo "  \"device\": \"$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)\","
  echo "  \"xpreempt_bin\": \"${XPREEMPT_BIN:-}\", \"xpreempt_shim\": \"${XPREEMPT_SHIM:-}\","
  echo "  \"timeout_s\": $TIMEOUT, \"chaos_period_us\": $CHAOS_PERIOD_US,"
  echo "  \"modes\": [$(for m in $MODES; do printf '"%s",' "$m"; done | sed 's/,$//')],"
  echo "  \"programs\": {"
} >"$JSON"
first_p=1
for p in $PROGRAMS; do
  [ $first_p = 1 ] || echo "    }," >>"$JSON"
  first_p=0
  echo "    \"$p\": {" >>"$JSON"
  first_m=1
  native_digest=""
  for mode in $MODES; do
    if [[ " $BUILD_FAILED " == *" $p "* ]]; then
      st=build-failed; RC=-1; SECS=0; dg=""
    else
      run_one "$p" "$mode"
      dg=$(digest_of "$RESULTS/logs/$p.$mode.out")
      if [ $RC = 124 ] || [ $RC = 137 ]; then
        st=timeout
      elif [ $RC != 0 ]; then
        st=fail
      elif [ -z "$dg" ]; then
        st=no-digest
      elif [ "$mode" = native ]; then
        st=pass; native_digest=$dg
      elif [ -z "$native_digest" ]; then
        st=no-native-digest
      elif [ "$dg" != "$native_digest" ]; then
        st=digest-mismatch
      else
        st=pass
      fi
    fi
    [ "$mode" = native ] && [ "$st" != pass ] && native_digest=""
    STATUS[$p.$mode]=$st
    DIGEST[$p.$mode]=$dg
    [ "$st" = pass ] || FAILURES=$((FAILURES + 1))
    printf '%-16s %-14s %-16s rc=%-4s %6ss %s\n' "$p" "$mode" "$st" "$RC" "$SECS" "$dg"
    if [ "$st" != pass ]; then
      grep -h "FAIL" "$RESULTS/logs/$p.$mode.out" 2>/dev/null | head -5 | sed 's/^/    /'
      tail -5 "$RESULTS/logs/$p.$mode.err" 2>/dev/null | sed 's/^/    /'
    fi
    [ $first_m = 1 ] || echo "," >>"$JSON"
    first_m=0
    printf '      "%s": {"status": "%s", "digest": "%s", "rc": %s, "secs": %s}' "$mode" "$st" "$dg" "$RC" "$SECS" >>"$JSON"
  done
  echo "" >>"$JSON"
done
{
  [ $first_p = 1 ] || echo "    }"
  echo "  },"
  echo "  \"failures\": $FAILURES"
  echo "}"
} >>"$JSON"

# ---- human table -------------------------------------------------------------------------------
{
  printf '%-16s' program
  for m in $MODES; do printf ' %-14s' "$m"; done
  printf '\n'
  for p in $PROGRAMS; do
    printf '%-16s' "$p"
    for m in $MODES; do printf ' %-14s' "${STATUS[$p.$m]}"; done
    printf '   %s\n' "${DIGEST[$p.native]}"
  done
  echo "failures: $FAILURES"
} >"$TABLE"
echo
cat "$TABLE"
echo "JSON: $JSON"
[ "$FAILURES" = 0 ]
