#!/usr/bin/env python3
# Pools the per-request LC latencies of a call's runs (lat-<mode>-<a|b>-<round>.json, from s16.sh)
# and compares the scheduler path with the bench-only controller: p50, p90, p99, and a 95 %
# bootstrap interval of the p99 difference. usage: pool.py DIR (the unpacked summaries.tgz)
import json,glob,random,sys
d=sys.argv[1]
def q(xs,f): xs=sorted(xs); return xs[min(len(xs)-1,int(f*len(xs)))]
for mode in ['ts','mps']:
  for v in ['a','b']:
    S=[];C=[]
    for f in sorted(glob.glob(f'{d}/lat-{mode}-{v}-*.json')):
        j=json.load(open(f)); S+=j['xp-sched-lv2-1proc']; C+=j['xp-lv2-1proc']
    if not S: continue
    random.seed(1); diffs=[]
    for _ in range(300):
        s=random.choices(S,k=len(S)); c=random.choices(C,k=len(C))
        diffs.append(q(s,.99)-q(c,.99))
    diffs.sort()
    print(f"{mode} {v}: n {len(S)}/{len(C)} p50 sched {q(S,.5):.1f} ctrl {q(C,.5):.1f} | p99 sched {q(S,.99):.1f} ctrl {q(C,.99):.1f} gap {q(S,.99)-q(C,.99):+.1f} (95% {diffs[7]:+.1f}..{diffs[292]:+.1f}) | p90 gap {q(S,.9)-q(C,.9):+.1f}")
