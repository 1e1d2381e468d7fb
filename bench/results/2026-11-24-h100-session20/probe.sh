#!/bin/bash
# Session 20: what the device machine gives a process (CPUs, cgroup quota, steal), and how often
# each thread of the LC/BE scenarios is switched out against its will.
set -u
C=$(pwd)/.carry19; R=/tmp/s20; rm -rf $R; mkdir -p $R
exec > >(tee $OUT/probe-log.txt) 2>&1
NV=$(dirname "$(find /usr/local/cuda*/ /usr/lib /opt -name 'libnvrtc.so*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=$NV:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} XPREEMPT_LOG=warn
date -u; nproc; grep -E "Cpus_allowed_list" /proc/self/status
for f in /sys/fs/cgroup/cpu.max /sys/fs/cgroup/cpuset.cpus.effective /sys/fs/cgroup/cpu/cpu.cfs_quota_us /sys/fs/cgroup/cpu/cpu.cfs_period_us; do [ -r $f ] && echo "$f: $(cat $f)"; done
cat /proc/loadavg; grep -c processor /proc/cpuinfo; lscpu | grep -E "Model name|Thread|Core|Socket|NUMA node\(s\)|Hypervisor"
cat /proc/sys/kernel/sched_min_granularity_ns /sys/kernel/debug/sched/base_slice_ns 2>/dev/null
ps -eo pid,pcpu,comm --sort=-pcpu | head -8
for s in ${SCEN:-xp-lv2-1proc xp-sched-lv2-1proc}; do for i in ${ROUNDS:-1 2}; do
  echo "=== $s $i $(date -u +%T)"
  python3 $C/probe.py $OUT/probe-$s-$i.json $C/${V:-m}/xpreempt bench lcbe --scenarios $s --secs ${SECS:-6} --label $s-$i --out $R/lcbe-$s-$i.json 2>&1 | grep -v "^scenario .*\.\.\.$"
done; done
date -u
