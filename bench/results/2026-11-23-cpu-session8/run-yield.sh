#!/bin/bash
# Eighth session, 2-core build VM: local mode's preemption thread spinning with a CPU pause (A)
# or a yield (B) per turn, A/B. Usage: XP_A=… XP_B=… bash run-yield.sh (writes here).
set -eu
busy() { ( while :; do :; done ) > /dev/null 2>&1 & echo $!; }
for round in 1 2 3; do
  for v in A B; do
    xp=XP_$v; xp=${!xp}
    $xp --json bench-request --paths local-alone,local --requests 2000 --out yield-quiet-$v-$round.json > /dev/null
    l1=$(busy); l2=$(busy)
    $xp --json bench-request --paths local --requests 500 --out yield-loaded-$v-$round.json > /dev/null
    kill $l1 $l2
  done
done
