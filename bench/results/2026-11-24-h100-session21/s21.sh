#!/bin/bash
# Session 21: session 20's script (s20.sh), its builds in .carry21/<name>/. VARIANTS names the builds a
# step alternates on one machine (default "c e": c1 e1, e2 c2, c3 e3 ...), or one build alone.
# STEPS picks what runs, in order:
#   cal    each process's kernel calibration (`bench info`), alone and two started together
#   tests  the GPU tests (HAL conformance, XQueues over CUDA) with build $TESTBUILD (default e);
#          before any MPS step, since the Lv3 test needs time-slicing
#   lv3    the Lv3 GPU test alone (time-sliced)
#   shimlv2  tests/cuda-apps' guard_lv2 (or the programs in APPS) under `xpreempt run --level 2`
#          with random suspensions (build $TESTBUILD)
#   ts     in process, time-sliced: the bench-only controller against the local scheduler
#   mps    the same under MPS (32 connections)
#   daemon over MPS (connections unset): the two-process controller against xpreemptd
#   pdaemon  the same with a persistent BE
#   alone  LC alone native against LC alone through xpreemptd (build $TESTBUILD)
# KEEP=1 keeps each run's marks (for a look at single requests).
set -u
C=$(pwd)/.carry21; R=/tmp/s21; rm -rf $R; mkdir -p $R
exec > >(tee $OUT/log.txt) 2>&1
NV=$(dirname "$(find /usr/local/cuda*/ /usr/lib /opt -name 'libnvrtc.so*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=$NV:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} XPREEMPT_LOG=warn
SECS=${SECS:-6}; ROUNDS=${ROUNDS:-1 2}; START=$(date +%s); BUDGET=${BUDGET:-540}
STEPS=${STEPS:-cal tests ts mps}
date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
late() { [ $(( $(date +%s) - START )) -gt $BUDGET ]; }
cal() { # tag: two alone, then three pairs started together
  for i in 1 2; do echo "$1 alone: $($C/${TESTBUILD:-e}/xpreempt bench info | grep -E 'iters_per_us_(full|light)' | tr -d ' \n')"; done
  for i in 1 2 3; do
    # (a bare `wait` would also wait for the log's tee)
    $C/${TESTBUILD:-e}/xpreempt bench info > $R/p1 & pid=$!; $C/${TESTBUILD:-e}/xpreempt bench info > $R/p2; wait $pid
    echo "$1 pair: $(grep -E 'iters_per_us_full' $R/p1 | tr -d ' \n') | $(grep -E 'iters_per_us_full' $R/p2 | tr -d ' \n')"
  done
}
run() { # label scenarios variants [env...]
  local label=$1 s=$2 vs=$3; shift 3
  for round in $ROUNDS; do
    # Every other round in the other order, so that neither side always goes first.
    order=$vs; [ $((round % 2)) = 0 ] && order=$(echo $vs | tr ' ' '\n' | tac | tr '\n' ' ')
    for v in $order; do
    late && return
    t=$label-$v-$round
    bin=$C/$v/xpreempt
    # Variants named in SAMPLES_ONLY run without marks: latencies from `--samples`, no marks' cost.
    case " ${SAMPLES_ONLY:-} " in *" $v "*) how="--samples";; *) how="--marks $R/marks-$t";; esac
    env "$@" timeout 150 ${PROBE:+python3 $C/probe.py $R/probe-$t.json} $bin bench lcbe ${LCBE_ARGS:-} --scenarios $s --secs $SECS --label $t $how --out $R/lcbe-$t.json | grep -v "^scenario .*\.\.\.$"
    if [ "$how" = --samples ]; then
      python3 -c "
import json,sys
rows=json.load(open(sys.argv[1]))
rows=rows if isinstance(rows,list) else rows.get('results',rows)
json.dump({r['scenario']:[round(x,2) for x in (r.get('lc') or {}).get('samples_us') or []] for r in rows},open(sys.argv[2],'w'))" $R/lcbe-$t.json $R/lat-$t.json
      continue
    fi
    python3 $C/lcbe-marks.py $R/marks-$t --json $R/marks-$t.json > $R/marks-$t.txt 2>&1
    # Each request's latency (µs), kept for pooling runs: {scenario: [...]}.
    python3 -c "
import json,glob,os,sys
out={}
for f in glob.glob(sys.argv[1]+'/*-lc.json'):
    by={}
    for t,w in json.load(open(f))['marks']: by.setdefault(w,[]).append(t)
    s,e=sorted(by.get('request_start',[])),sorted(by.get('request_end',[]))
    out[os.path.basename(f)[:-8]]=[round((b-a)/1e3,2) for a,b in zip(s,e)]
json.dump(out,open(sys.argv[2],'w'))" $R/marks-$t $R/lat-$t.json
    grep -A22 "^xp-" $R/marks-$t.txt | grep -E "^x|latency  |first_launch|launch_call|between_launches|after_launch|stop_at|stop_call|restart_after_end|announce|ready"
  done; done
}
mps_on() {
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/s18-mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/s18-mps-log
  mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
  nvidia-cuda-mps-control -d && echo "MPS started"; MPS=1
}
MPS=0
trap '[ $MPS = 1 ] && echo quit | nvidia-cuda-mps-control; python3 bench/results/2026-11-24-h100-session18/bands.py bench $R/marks-ts-* $R/marks-mps-* > $OUT/bands.txt 2>&1; (cd $R && { [ "${KEEP:-0}" = 1 ] || rm -rf marks-*/; } && rm -f p1 p2 && tar czf $OUT/summaries.tgz .)' EXIT
for step in $STEPS; do
  echo "=== $step $(date -u +%T)"
  case $step in
    cal) cal time-sliced; [ $MPS = 0 ] && mps_on; cal mps ;;
    tests)
      timeout 200 $C/conformance --ignored --test-threads=1 2>&1 | grep -E -A1 "^test |test result|panicked|stopped"
      XPREEMPT_BIN=$C/${TESTBUILD:-e}/xpreempt XPREEMPT_SHIM=$C/${TESTBUILD:-e}/libxpreempt_shim.so timeout 200 $C/gpu-tests --ignored --test-threads=1 --nocapture 2>&1 | grep -E -A1 "^test |test result|panicked|stopped|cycles|went ahead" ;;
    shimlv2) # guard-built kernels of an unmodified application under the shim at Lv2, with
      # random suspensions
      PROGRAMS="${APPS:-guard_lv2}" LEVELS=2 CHAOS_SEEDS="1 2 3 4" XPREEMPT_BIN=$C/${TESTBUILD:-e}/xpreempt RESULTS=$R/apps \
        timeout 300 bash tests/cuda-apps/run.sh /tmp/s18-apps | tail -15 ;;
    lv3) XPREEMPT_BIN=$C/${TESTBUILD:-e}/xpreempt XPREEMPT_SHIM=$C/${TESTBUILD:-e}/libxpreempt_shim.so timeout 100 $C/gpu-tests --ignored lv3 2>&1 | grep -E "^test |test result|panicked|stopped" ;;
    ts) [ $MPS = 1 ] && { echo "ts skipped: MPS is on (put ts before any MPS step)"; continue; }
        run ts xp-lv2-1proc,xp-sched-lv2-1proc "${VARIANTS:-k j}" ;;
    mps) [ $MPS = 0 ] && mps_on; run mps be-alone,${MPS_EXTRA:-}xp-lv2-1proc,xp-sched-lv2-1proc "${VARIANTS:-k j}" CUDA_DEVICE_MAX_CONNECTIONS=32 ;;
    daemon) [ $MPS = 0 ] && mps_on; run daemon be-alone,xp-mps-2proc,xp-daemon-mps-2proc "${VARIANTS:-k j}" ;;
    pdaemon) [ $MPS = 0 ] && mps_on; LCBE_ARGS=--persistent ROUNDS=1 run pdaemon be-alone,xp-mps-2proc,xp-daemon-mps-2proc "${VARIANTS:-k j}" ;;
    alone) [ $MPS = 0 ] && mps_on; run alone lc-alone,lc-alone-daemon ${TESTBUILD:-e} ;;
  esac
done
date -u
