#!/bin/bash
# Eighth session, 2-core build VM: local mode's take-back of a handed-off stop (b949fba), A/B.
# A = build before (b949fba~1), B = b949fba, both `cargo build --release -p xpreempt-cli`.
# Usage: XP_A=/tmp/xp-old XP_B=/tmp/xp-new bash run.sh   (writes into the current directory)
set -eu
busy() { ( while :; do :; done ) > /dev/null 2>&1 & echo $!; }
for round in 1 2 3; do
  for v in A B; do
    xp=XP_$v; xp=${!xp}
    # Quiet machine: does the change cost anything when the preemption thread keeps up?
    $xp --json bench-request --paths local-alone,local --requests 2000 --out quiet-$v-$round.json > /dev/null
    # Overloaded: two busy loops take both cores.
    l1=$(busy); l2=$(busy)
    $xp --json bench-request --paths local --requests 500 --out loaded-$v-$round.json > /dev/null
    kill $l1 $l2
  done
done
