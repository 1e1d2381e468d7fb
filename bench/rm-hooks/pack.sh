#!/bin/bash
# Fills one folder for run.sh to run from on a GPU machine: release binaries (debug info stripped), the eBPF objects the
# build compiled, the CUDA program and the script.
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DEST=${1:-$ROOT/target/rm-hooks}
rm -rf "$DEST"
mkdir -p "$DEST/policies"
cp "$ROOT"/target/release/{xpreempt,xpreemptd,libxpreempt_shim.so} "$DEST/"
strip --strip-debug "$DEST"/xpreempt "$DEST"/xpreemptd "$DEST"/libxpreempt_shim.so
OBJ=$(ls -td "$ROOT"/target/release/build/xpreempt-bpf-*/out | head -1)
cp "$OBJ"/{lcbe,rm_timeslice,rm_admission,bad_loop}.o "$DEST/policies/"
cp "$ROOT"/bench/rm-hooks/{spin.cu,run.sh} "$DEST/"
du -sh "$DEST"
