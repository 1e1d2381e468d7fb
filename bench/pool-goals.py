#!/usr/bin/env python3
"""Pools the per-request LC latencies of the goal rounds that bench/run-gpu.sh wrote
(lat-<goal>-<round>.json: {scenario: [µs, ...]}) and compares each scheduler path with its
reference: p50, p90, p99, and a 95 % bootstrap interval of the p99 difference.

    python3 bench/pool-goals.py DIR

Goals: ts and mps (in process: the direct suspend against LocalScheduler, p99 gap ≤ +10 µs),
daemon (two processes over MPS: the shared-word controller against xpreemptd, gap ≤ +10 µs),
alone (LC alone native against LC alone through the whole stack, ratio ≤ 1.05)."""

import glob
import json
import random
import sys

PAIRS = {  # goal: (reference, scheduler path)
    "ts": ("xp-lv2-1proc", "xp-sched-lv2-1proc"),
    "mps": ("xp-lv2-1proc", "xp-sched-lv2-1proc"),
    "daemon": ("xp-mps-2proc", "xp-daemon-mps-2proc"),
    "alone": ("lc-alone", "lc-alone-daemon"),
}


def q(xs, f):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(f * len(xs)))]


def pool(d, goal):
    ref, path = PAIRS[goal]
    s, c = [], []
    for f in sorted(glob.glob(f"{d}/lat-{goal}-*.json")):
        with open(f) as fh:
            j = json.load(fh)
        s += j.get(path, [])
        c += j.get(ref, [])
    return s, c


def main():
    d = sys.argv[1] if len(sys.argv) > 1 else "."
    for goal in PAIRS:
        s, c = pool(d, goal)
        if not s or not c:
            continue
        random.seed(1)
        diffs = sorted(
            q(random.choices(s, k=len(s)), 0.99) - q(random.choices(c, k=len(c)), 0.99)
            for _ in range(300)
        )
        print(
            f"{goal}: n {len(s)}/{len(c)} p50 {q(s, .5):.1f}/{q(c, .5):.1f} "
            f"p90 {q(s, .9):.1f}/{q(c, .9):.1f} p99 {q(s, .99):.1f}/{q(c, .99):.1f} "
            f"gap {q(s, .99) - q(c, .99):+.1f} (95% {diffs[7]:+.1f}..{diffs[292]:+.1f}) "
            f"ratio {q(s, .99) / q(c, .99):.2f}"
        )


if __name__ == "__main__":
    main()
