#!/bin/bash
# Session 12: the CUDA conformance suite if APPS=1, then PyTorch pairs (PAIRS_ARGS).
set -u
C=$(pwd)/.carry; R=/tmp/xp-s12; mkdir -p $R
exec > >(tee $OUT/log.txt) 2>&1
finish() { (cd $R && tar czf $OUT/results.tgz .); }
trap finish EXIT
export XPREEMPT_LOG=${XPREEMPT_LOG:-warn}
NV=$(dirname "$(find /usr/local/cuda*/ /usr/lib /opt -name 'libnvrtc.so*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=$NV:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version --format=csv
if [ -n "${APPS:-}" ]; then
  echo "== conformance $(date -u +%T)"
  XPREEMPT_BIN=$C/xpreempt TIMEOUT=40 RESULTS=$R/cuda-apps timeout 330 bash tests/cuda-apps/run.sh /tmp/xp-apps > $R/suite.log 2>&1; echo "cuda-apps rc $?"
  tail -22 $R/cuda-apps/summary.txt
fi
echo "== pairs $(date -u +%T)"
cd bench/pytorch && XPREEMPT_BIN=$C/xpreempt timeout ${PAIRS_TIMEOUT:-240} python3 pairs.py $PAIRS_ARGS --out-dir $R/pairs; echo "pairs rc $?"
cat $R/pairs/summary.md 2>/dev/null | head -60
date -u
