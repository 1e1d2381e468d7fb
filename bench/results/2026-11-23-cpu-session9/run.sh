#!/bin/bash
# A/B of local mode's announcement on the 2-core build machine: A = a3f9de6, B = 17c4428
# (release builds of xpreempt-cli at /tmp/xp-A and /tmp/xp-B). Quiet: three interleaved rounds;
# loaded: two busy loops on both cores, seven interleaved rounds.
set -u
for r in 1 2 3; do for v in A B; do
  /tmp/xp-$v --json bench-request --requests 2000 --paths local-alone,local,daemon --out quiet-$v-$r.json > /dev/null
done; done
( while :; do :; done ) & P1=$!; ( while :; do :; done ) & P2=$!
for r in 1 2 3 4 5 6 7; do for v in A B; do
  /tmp/xp-$v --json bench-request --requests 500 --paths local --out load-$v-$r.json > /dev/null
done; done
kill $P1 $P2
