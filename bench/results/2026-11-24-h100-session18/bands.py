#!/usr/bin/env python3
# Session 17's bands.py, with stops ahead (session 18): a stop starts at its stop ahead if it
# went ahead, and the "BE in a launch call" line is given for the controller too (from the
# request's start, where it is told to stop). Where the time of a call's in-process requests
# goes, from the marks that `s18.sh` keeps with KEEP=1: for each run, the mean of each part of a request in bands of its latency (p0-50,
# p90-99, p99-100), controller against scheduler; then, through the scheduler, how long after
# the LC's announcement the BE's stop call started and how long after the request's start the
# announcement came (p50/p90/p99), and whether the BE was in a launch call at the announcement.
# Reads the marks with bench/lcbe-marks.py.
# usage: bands.py DIR MARKS-DIR... (DIR: the repository's bench/ folder; MARKS-DIR: an unpacked
# summaries.tgz's marks-<mode>-<build>-<round>)
import bisect
import importlib.util
import json
import sys
from pathlib import Path

spec = importlib.util.spec_from_file_location("lm", Path(sys.argv[1]) / "lcbe-marks.py")
lm = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lm)
KEYS = ["first_launch", "between_launches", "stop_at", "stop_call", "restarts_during"]


def rows_of(d, name):
    lc, be = lm.load(Path(d) / f"{name}-lc.json"), lm.load(Path(d) / f"{name}-be.json")
    seen = []
    real_sorted = sorted

    def keep(rows, key=None):
        rows = list(rows)
        seen.append(rows)
        return real_sorted(rows, key=key)

    lm.sorted = keep  # scenario() sorts its rows once: that is where they are caught
    try:
        lm.scenario(lc, be)
    finally:
        del lm.sorted
    return next(r for r in seen if r and isinstance(r[0], dict)), lc, be


def mean(rows, k):
    v = [r[k] for r in rows if r[k] is not None]
    return sum(v) / len(v) if v else float("nan")


def q(xs, f):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(f * len(xs)))] if xs else float("nan")


for d in [a for a in sys.argv[2:] if Path(a).is_dir()]:
    for name in ("xp-lv2-1proc", "xp-sched-lv2-1proc"):
        rows, lc, be = rows_of(d, name)
        rows.sort(key=lambda r: r["latency"])
        n = len(rows)
        for lo, hi in [(0, 0.5), (0.9, 0.99), (0.99, 1)]:
            b = rows[int(lo * n) : int(hi * n)]
            parts = " ".join(f"{k} {mean(b, k):.1f}" for k in KEYS)
            print(f"{Path(d).name} {name} p{lo * 100:g}-{hi * 100:g} n {len(b)} latency {mean(b, 'latency'):.1f} {parts}")
    stops = lm.merged(be, lm.STOP)
    after = []
    for a in lc.get("announce_end", []):
        i = bisect.bisect_left(stops, a - 2000)
        if i < len(stops) and stops[i] - a < 100_000:
            after.append((stops[i] - a) / 1e3)
    before = []
    starts = lc.get("announce_start", [])
    for s in lc.get("request_start", []):
        i = bisect.bisect_left(starts, s)
        if i < len(starts) and starts[i] - s < 100_000:
            before.append((starts[i] - s) / 1e3)
    fmt = lambda xs: "/".join(f"{q(xs, f):.1f}" for f in (0.5, 0.9, 0.99))
    print(f"{Path(d).name} announcement to the BE's stop {fmt(after)}; request start to announcement {fmt(before)}")
    # Whether the BE queue was in a launch call (which holds its queue's lock) when it was told
    # to stop (the scheduler: the LC's announcement; the controller: the request's start), and
    # how long the stop took to start then and otherwise.
    for name in ("xp-lv2-1proc", "xp-sched-lv2-1proc"):
        lc, be = lm.load(Path(d) / f"{name}-lc.json"), lm.load(Path(d) / f"{name}-be.json")
        stops = lm.merged(be, lm.STOP)
        told = lc.get("announce_end") or lc.get("request_start", [])
        launches, ends = be.get("launch", []), be.get("launch_end", [])
        busy, free = [], []
        for a in told:
            i = bisect.bisect_left(stops, a - 2000)
            if i == len(stops) or stops[i] - a > 100_000:
                continue
            j = bisect.bisect_right(launches, a) - 1
            k = bisect.bisect_left(ends, launches[j]) if j >= 0 else len(ends)
            (busy if k < len(ends) and ends[k] > a else free).append((stops[i] - a) / 1e3)
        calls = [(ends[k] - t) / 1e3 for t in launches if (k := bisect.bisect_left(ends, t)) < len(ends)]
        print(
            f"{Path(d).name} {name} BE in a launch call when told to stop: {len(busy)} of {len(busy) + len(free)};"
            f" stop after being told then {fmt(busy)}, otherwise {fmt(free)}; BE launch call {fmt(calls)}"
        )
