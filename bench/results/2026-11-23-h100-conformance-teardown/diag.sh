#!/bin/bash
# Device run of the teardown helper: how the runtime's cudaDeviceReset reaches libcuda, then the
# conformance suite with this build, then teardown repeated under the shim.
set -u
C=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$C/.." && pwd)
OUT=${OUT:-/tmp/out}
export PATH=/usr/local/cuda/bin:$PATH
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
LIBCUDA=$(readlink -f "$(ldconfig -p | awk '/libcuda.so.1 /{print $NF; exit}')")
echo "libcuda: $LIBCUDA; nvcc: $(nvcc --version | tail -1)"
echo "== libcuda exports: teardown, cuGetProcAddress, cuGetExportTable"
nm -D --defined-only "$LIBCUDA" | grep -E " (cuDevicePrimaryCtx|cuCtxDestroy|cuGetProcAddress|cuGetExportTable)"
echo "== exports sharing an address (first 40 groups), of $(nm -D --defined-only "$LIBCUDA" | wc -l)"
nm -D --defined-only "$LIBCUDA" | awk '{print $1, $3}' | sort | awk '$1==p{if(!shown)print pl; print; shown=1; next}{p=$1; pl=$0; shown=0}' | head -80
echo "== libcudart_static.a: driver-facing symbols"
nm /usr/local/cuda/lib64/libcudart_static.a 2>/dev/null | grep -i -E "reset|getprocaddress|exporttable| U dl" | sort | uniq -c | head -30
nvcc -O2 -arch=native -o /tmp/reset_probe "$C/reset_probe.cu" || echo "probe build failed"
if command -v gdb >/dev/null; then
  echo "== native, gdb breakpoints on libcuda's teardown exports"
  timeout 60 gdb -q -batch -ex 'set breakpoint pending on' \
    -ex 'break cuDevicePrimaryCtxReset_v2' -ex 'break cuDevicePrimaryCtxReset' \
    -ex 'break cuDevicePrimaryCtxRelease_v2' -ex 'break cuDevicePrimaryCtxRelease' \
    -ex 'break cuCtxDestroy_v2' -ex 'break cuCtxDestroy' -ex run \
    -ex 'bt 5' -ex c -ex 'bt 5' -ex c -ex 'bt 5' -ex c -ex 'bt 5' /tmp/reset_probe 2>&1 \
    | grep -v "^\[New Thread\|^\[Thread .* exited\|^\[Inferior" | head -60
else
  echo "(no gdb)"
fi
SHIM=(env LD_PRELOAD="$C/libxpreempt_shim.so" XPREEMPT_INTERCEPT=1 XPREEMPT_SHIM_BACKTRACE=1)
echo "== probe under the shim, L1, XPREEMPT_SHIM_LOG=2"
XPREEMPT_LEVEL=1 XPREEMPT_SHIM_LOG=2 timeout 60 "${SHIM[@]}" /tmp/reset_probe >"$OUT/probe-shim.log" 2>&1
echo "rc=$?"
P="$OUT/probe-shim.log"
grep -E "cuGetProcAddress (cuDevicePrimaryCtx|cuCtxDestroy|cuGetProcAddress|cuGetExportTable)|dlsym cu(GetProcAddress|DevicePrimaryCtx|CtxDestroy)" "$P" | head -30
echo "-- requests by outcome:"; grep -o "cuGetProcAddress .*): [A-Za-z]*" "$P" | awk '{print $NF}' | sort | uniq -c
echo "-- missed, by name, trampolines:"; grep -E "MISSED|requested name|trampoline" "$P" | head -30
echo "-- export tables:"; grep -c "cuGetExportTable" "$P"; grep "cuGetExportTable" "$P" | sort | uniq -c | head
echo "-- around the reset:"; sed -n '/== before/,/== after relaunch/p' "$P" | grep -v "RM_ALLOC\|channel group object" | head -50
echo "   ($(sed -n '/== before/,/== after relaunch/p' "$P" | grep -c RM_FREE) RM_FREE between the markers)"
tail -3 "$P"
echo "== conformance suite"
C="$C" STEPS=apps OUT="$OUT" bash "$ROOT/bench/run-intercept.sh" 2>&1 | tail -40
echo "== teardown repeated under the shim (LD_PRELOAD), 6 x {L1, L3 chaos}"
for i in 1 2 3 4 5 6; do
  for m in L1 L3c; do
    if [ $m = L1 ]; then e=(XPREEMPT_LEVEL=1); else e=(XPREEMPT_LEVEL=3 XPREEMPT_CHAOS=$i:500); fi
    env "${e[@]}" XPREEMPT_SHIM_LOG=1 timeout 60 "${SHIM[@]}" /tmp/apps-build/teardown >/tmp/td.out 2>/tmp/td.err
    rc=$?
    echo "$i $m rc=$rc $(grep -c ' ok' /tmp/td.out) ok, $(grep -c FAIL /tmp/td.out) FAIL; $(grep -o 'context teardown: [0-9]* queue(s) retired' /tmp/td.err | tr '\n' ';')"
    [ $rc = 0 ] || tail -5 /tmp/td.err
  done
done 2>&1 | tee "$OUT/teardown-repeat.txt"
