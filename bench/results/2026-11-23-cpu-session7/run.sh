#!/usr/bin/env bash
# Interleaved A/B of the doorbell's spin (A: busy spin, build 2bc8bc7+bench; B: yielding spin,
# this commit) on the CPU benchmarks. Usage: A=path/to/xpreempt-A B=path/to/xpreempt-B OUT=dir bash run.sh
set -euo pipefail
mkdir -p "$OUT"
for r in 1 2 3; do
  for v in A B; do
    xp=${!v}
    "$xp" bench-request --requests 2000 --out "$OUT/request-$v-$r.json" > "$OUT/request-$v-$r.txt"
    for c in 2 8; do
      "$xp" bench-daemon --clients $c --samples 2000 --idle-secs 1 --out "$OUT/daemon-$c-$v-$r.json" > "$OUT/daemon-$c-$v-$r.txt"
    done
  done
done
