#!/bin/bash
# Session 6, run 2 (build with local mode's early announce): the CUDA conformance suite, then the PyTorch pair group.
set -u
C=$(pwd)/.carry-s6; R=/tmp/xp-s6d; mkdir -p $R
exec > >(tee $OUT/log.txt) 2>&1
finish() { (cd $R && tar czf $OUT/results.tgz .); }
trap finish EXIT
export XPREEMPT_LOG=${XPREEMPT_LOG:-warn} XPREEMPT_SOCKET=/tmp/xp-s6.sock
NV=$(dirname "$(find /usr/local/cuda*/ /usr/lib /opt -name 'libnvrtc.so*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=$NV:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version --format=csv
if [ -z "${SKIP_APPS:-}" ]; then
  echo "== conformance $(date -u +%T)"
  XPREEMPT_BIN=$C/xpreempt TIMEOUT=40 RESULTS=$R/cuda-apps timeout 330 bash tests/cuda-apps/run.sh /tmp/xp-apps > $R/suite.log 2>&1; echo "cuda-apps rc $?"
  tail -22 $R/cuda-apps/summary.txt
fi
if [ -n "${PAIRS:-}" ]; then
  echo "== pairs $(date -u +%T)"
  cd bench/pytorch && XPREEMPT_BIN=$C/xpreempt timeout 500 python3 pairs.py --groups pair --duration 10 \
    --modes ${MODES:-xp_lv1,xp_mps} --out-dir $R/pairs; echo "pairs rc $?"
  cat $R/pairs/summary.md 2>/dev/null | head -40
fi
date -u
