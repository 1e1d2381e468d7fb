#!/usr/bin/env python3
# Pools the per-request LC latencies of a call's runs (lat-<mode>-<build>-<round>.json, written by
# s16.sh, s17.sh) and compares the scheduler path with its reference (the bench-only controller; for
# "alone", LC alone native): p50, p90, p99, and a 95 % bootstrap interval of the p99 difference.
# usage: pool.py DIR [VARIANTS, default a,b] (DIR: an unpacked summaries.tgz)
import glob
import json
import random
import sys

PAIRS = {  # mode: (reference, scheduler path)
    "ts": ("xp-lv2-1proc", "xp-sched-lv2-1proc"),
    "mps": ("xp-lv2-1proc", "xp-sched-lv2-1proc"),
    "daemon": ("xp-mps-2proc", "xp-daemon-mps-2proc"),
    "pdaemon": ("xp-mps-2proc", "xp-daemon-mps-2proc"),
    "alone": ("lc-alone", "lc-alone-daemon"),
}


def q(xs, f):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(f * len(xs)))]


d = sys.argv[1]
for mode, (ref, path) in PAIRS.items():
    for v in sys.argv[2].split(",") if len(sys.argv) > 2 else ("a", "b"):
        s, c = [], []
        for f in sorted(glob.glob(f"{d}/lat-{mode}-{v}-*.json")):
            j = json.load(open(f))
            s += j.get(path, [])
            c += j.get(ref, [])
        if not s or not c:
            continue
        random.seed(1)
        diffs = sorted(
            q(random.choices(s, k=len(s)), 0.99) - q(random.choices(c, k=len(c)), 0.99)
            for _ in range(300)
        )
        print(
            f"{mode} {v}: n {len(s)}/{len(c)} p50 {q(s, .5):.1f}/{q(c, .5):.1f} "
            f"p90 {q(s, .9):.1f}/{q(c, .9):.1f} p99 {q(s, .99):.1f}/{q(c, .99):.1f} "
            f"gap {q(s, .99) - q(c, .99):+.1f} (95% {diffs[7]:+.1f}..{diffs[292]:+.1f}) "
            f"ratio {q(s, .99) / q(c, .99):.2f}"
        )
