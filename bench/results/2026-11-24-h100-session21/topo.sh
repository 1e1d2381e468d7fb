#!/bin/bash
# The guest's CPU topology as it is told, and what a cache-line round trip costs between CPUs.
set -u
C=$(pwd)/.carry21
lscpu | grep -E "^(Model name|Thread|Core|Socket|NUMA|L2|L3|Hypervisor|Virtualization)" 
for f in /sys/devices/system/cpu/cpu0/cache/index*/; do echo "cache L$(cat $f/level) $(cat $f/type) shared by $(cat $f/shared_cpu_list)"; done
echo "NUMA nodes: $(ls -d /sys/devices/system/node/node* 2>/dev/null | wc -l)"
for i in 1 2; do $C/c2c 0; $C/c2c 8; done
grep -E "^cpu " /proc/stat
