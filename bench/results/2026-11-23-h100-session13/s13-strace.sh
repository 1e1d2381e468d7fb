#!/bin/bash
# Session 13: which system calls each thread makes per LC request, in-process scheduler against
# the one-process bench-only controller (strace -f; timings under strace are not comparable).
set -u
C=$(pwd)/.carry; R=/tmp/s13st; rm -rf $R; mkdir -p $R
exec > >(tee $OUT/log.txt) 2>&1
NV=$(dirname "$(find /usr/local/cuda*/ /usr/lib /opt -name 'libnvrtc.so*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=$NV:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} XPREEMPT_LOG=warn
command -v strace || { echo "no strace on this machine"; command -v perf gdb ltrace; exit 0; }
for sc in xp-lv2-1proc xp-sched-lv2-1proc; do
  timeout 120 strace -f -qq -e trace=futex,sched_yield,write,ioctl,clock_nanosleep,nanosleep,poll,read -o $R/st-$sc.txt \
    $C/xpreempt-b bench lcbe --scenarios $sc --secs 3 --label strace > $R/$sc.out 2>&1
  tail -3 $R/$sc.out
  python3 - $R/st-$sc.txt <<'PY'
import re,sys,collections
per=collections.defaultdict(collections.Counter)
for line in open(sys.argv[1]):
    m=re.match(r"(\d+)\s+(\w+)\((.*)",line)
    if not m: continue
    tid,name,rest=m.groups()
    if name=="futex":
        op=re.search(r"FUTEX_\w+",rest); name="futex:"+(op.group(0) if op else "?")
    if name=="ioctl":
        code=rest.split(",")[1].strip() if "," in rest else "?"; name="ioctl:"+code[:40]
    per[tid][name]+=1
for tid,c in sorted(per.items(),key=lambda kv:-sum(kv[1].values()))[:8]:
    print(" tid",tid,"total",sum(c.values()),dict(c.most_common(8)))
PY
done
