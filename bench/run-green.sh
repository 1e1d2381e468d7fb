#!/bin/bash
# Green contexts on the device: builds bench/cuda/green_{probe,timing}.cu with
# nvcc and answers, with the programs' JSON lines as evidence:
#   api     a-c: resources and split granularity, which kernel handles launch on a green-context
#           stream and where their blocks run, memory and events across the primary and green
#           contexts (green_probe, sections res launch mem event)
#   torch   PyTorch's matmul and ResNet-50 training steps on a green-context ExternalStream
#   timing  e (green_timing), in one process: LC requests against a GPU-filling BE spin workload, for
#           TIMING_CFGS under PATTERNS
#   short   e again with BE kernels of one wave (BE_WAVES=1: 2 blocks per SM, 200 us), where
#           confinement costs a whole second wave (SHORT_CFGS, poisson arrivals)
#   mps     d and e under a private MPS daemon: the api sections, torch, and the timing configs
#           with BE and LC in two processes (MPS_CFGS)
#   pairs   the PyTorch pair (bench/pytorch/pairs.py --groups pair) in PAIRS_MODES (default
#           mps_prio, mps_green16, mps_green8, and xp_lv1 where $XPREEMPT_BIN is set), PAIRS_SECS
#           per scenario
#
#   bash bench/run-green.sh [OUT_DIR]
#
# Writes OUT_DIR [default: $OUT, else green-results]/{log.txt,api.jsonl,torch.jsonl,timing.jsonl,
# summary.md,pairs.json,pairs.md}. Needs nvcc; the script and bench/cuda, bench/pytorch are all it
# reads from the checkout.
set -u -o pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${1:-${OUT:-green-results}}
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
B=/tmp/green-build
mkdir -p $B
STEPS=${STEPS:-api torch timing short mps}
PATTERNS=${PATTERNS:-poisson burst}
TIMING_CFGS=${TIMING_CFGS:-lc_alone be_alone prio conf8 conf16 split8 switch8_h0 switch8_h5000}
SHORT_CFGS=${SHORT_CFGS:-be_alone prio conf8 switch8_h0 switch8_h5000}
MPS_CFGS=${MPS_CFGS:-lc_alone be_alone prio conf8 switch8_h0 switch8_h5000}
export GREEN_CUBIN=$B/kernels.cubin
FAILED=""
date -u
nvidia-smi --query-gpu=name,driver_version,compute_mode,memory.total --format=csv
NVCC=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc)
$NVCC --version | tail -2
S=$HERE/cuda
CXX="$NVCC -O2 -std=c++17 -arch=sm_90"
$NVCC -arch=sm_90 -cubin -x cu -DGREEN_KERNELS_ONLY -o $B/kernels.cubin $S/green_common.cuh & k=$!
$CXX -shared -Xcompiler -fPIC -DGREEN_LIB -o $B/libgreen.so $S/green_probe.cu -lcuda & l=$!
$CXX -o $B/green_timing $S/green_timing.cu -lcuda & t=$!
$CXX -o $B/green_probe $S/green_probe.cu -lcuda && wait $k && wait $l && wait $t || { echo "FAILED: build"; exit 1; }
P=$B/green_probe

# Tags every JSON line of a run with where it ran.
tag() { sed -u "s/^{/{\"under\":\"$1\",/"; }
api() {
  for sec in res launch mem event; do
    timeout 60 $P $sec | tag "$1" | tee -a "$OUT/api.jsonl" || { echo "FAILED: api $sec ($1)"; FAILED="$FAILED api-$sec-$1"; }
  done
}
torch_step() {
  PYTHONUNBUFFERED=1 timeout 180 python3 "$HERE/cuda/green_torch.py" $B/libgreen.so | tag "$1" | tee -a "$OUT/torch.jsonl" ||
    { echo "FAILED: torch ($1)"; FAILED="$FAILED torch-$1"; }
}
timing() { # $1 under, $2 inproc|twoproc, $3 configs[, $4 patterns]
  for pat in ${4:-$PATTERNS}; do
    for cfg in $3; do
      PATTERN=$pat timeout 60 $B/green_timing "$cfg" "$2" | tag "$1" | tee -a "$OUT/timing.jsonl" ||
        { echo "FAILED: timing $cfg $2 $pat ($1)"; FAILED="$FAILED timing-$cfg-$1"; }
    done
  done
}

for step in $STEPS; do
  echo "=== $step ($(date -u +%H:%M:%S))"
  case $step in
    api) api native ;;
    torch) torch_step native ;;
    timing) timing native inproc "$TIMING_CFGS" ;;
    short) BE_WAVES=1 timing native-w1 inproc "$SHORT_CFGS" poisson ;;
    mps)
      export CUDA_MPS_PIPE_DIRECTORY=/tmp/green-mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/green-mps-log
      mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
      nvidia-cuda-mps-control -d && echo "MPS daemon started"
      api mps
      torch_step mps
      timing mps twoproc "$MPS_CFGS"
      echo quit | nvidia-cuda-mps-control
      sleep 1
      tail -20 $CUDA_MPS_LOG_DIRECTORY/control.log $CUDA_MPS_LOG_DIRECTORY/server.log 2>/dev/null
      unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY ;;
    pairs)
      modes=${PAIRS_MODES:-mps_prio,mps_green16,mps_green8${XPREEMPT_BIN:+,xp_lv1}}
      (cd "$HERE/pytorch" && PYTHONUNBUFFERED=1 python3 pairs.py --groups pair --modes "$modes" \
        --duration "${PAIRS_SECS:-10}" --green-lib $B/libgreen.so --out-dir /tmp/green-pairs) ||
        { echo "FAILED: pairs"; FAILED="$FAILED pairs"; }
      cp /tmp/green-pairs/summary.json "$OUT/pairs.json"
      cp /tmp/green-pairs/summary.md "$OUT/pairs.md"
      tar czf "$OUT/pairs-raw.tgz" -C /tmp/green-pairs raw ;;
    *) echo "unknown step $step"; FAILED="$FAILED $step" ;;
  esac
done

# LC latency and BE throughput relative to BE alone (same process layout, same pattern).
[ -f "$OUT/timing.jsonl" ] && python3 - "$OUT/timing.jsonl" >"$OUT/summary.md" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
alone = {(r["under"], r["procs"], r["pattern"]): r["be_blocks_per_s"] for r in rows if r["cfg"] == "be_alone"}
print("| under | procs | pattern | cfg | LC p50 us | p90 | p99 | max | first-of-burst p50/p99 | BE / alone | BE kernels (green) | switches | switch host us | errors |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    a = alone.get((r["under"], r["procs"], r["pattern"]))
    be = f'{r["be_blocks_per_s"] / a:.3f}' if a and r["be_blocks_per_s"] else "–"
    fb = f'{r["first_of_burst_p50_us"]:.0f} / {r["first_of_burst_p99_us"]:.0f}' if r["first_of_burst_p50_us"] else "–"
    lc = [f'{r[k]:.0f}' if r["lc_n"] else "–" for k in ("lc_p50_us", "lc_p90_us", "lc_p99_us", "lc_max_us")]
    print(f'| {r["under"]} | {r["procs"]} | {r["pattern"]} | {r["cfg"]} | {" | ".join(lc)} | {fb} | {be} | '
          f'{r["be_kernels"]} ({r["be_green_kernels"]}) | {r["switches"]} | {r["switch_host_us"]:.1f} | {r["lc_err"]} {r["be_err"]} |')
EOF
cat "$OUT/summary.md" 2>/dev/null
[ -n "$FAILED" ] && { echo "FAILED:$FAILED"; exit 1; }
echo "all steps ran"
