#!/usr/bin/env python3
"""The slowest LC requests of one scenario of a run kept with KEEP=1 (raw marks), each as one
line of both sides' marks in µs from the request's start (the BE's launches left out).
usage: timelines.py MARKS_DIR SCENARIO [N, default 12]"""
import json
import sys
from bisect import bisect_left

d, scen = sys.argv[1], sys.argv[2]
n = int(sys.argv[3]) if len(sys.argv) > 3 else 12
lc = json.load(open(f"{d}/{scen}-lc.json"))["marks"]
be = json.load(open(f"{d}/{scen}-be.json"))["marks"]
events = sorted([(t, "LC." + w) for t, w in lc if w != "gpu_elapsed"]
                + [(t, "BE." + w) for t, w in be if w != "gpu_elapsed"])
times = [t for t, _ in events]
starts = [t for t, w in lc if w == "request_start"]
ends = [t for t, w in lc if w == "request_end"]
for s, e in sorted(zip(starts, ends), key=lambda r: r[1] - r[0])[-n:]:
    print(f"--- latency {(e - s) / 1e3:.1f}")
    i = bisect_left(times, s - 5000)
    line = []
    while i < len(events) and events[i][0] <= e + 3000:
        t, w = events[i]
        if not w.startswith("BE.launch"):
            line.append(f"{(t - s) / 1e3:.1f}:{w[:2]}{w.split('.')[1]}")
        i += 1
    print(" ".join(line))
