#!/usr/bin/env python3
"""Lines up the marks of `xpreempt-bench lcbe --marks DIR` (both sides on CLOCK_MONOTONIC) and
says, per scenario, where an LC request's time went: when the BE queue was told to stop
relative to the request's start, how long the stop call took, how long the LC's first launch
call took and what the LC did between its first two launches (on a queue: after its first
launch, up to the submission's return, where the queue reports Ready; and from there to the
second), when the stop was first seen settled, how often the BE queue was restarted and
stopped again during one request (when the first such restart came, from the request's start
and from the LC's second launch, and the latency of the requests without one), and when it was
restarted after the request ended (and, through the local scheduler, when the LC queue's Idle came
and how long after it the restart), which requests had their stop made on an application's thread
(in one process, the LC's own) and their latency, when the announcement to the local
scheduler came, how long it took and how long after it the stop started, how the time after
the first launch splits around the Ready report, how
many stops went ahead of the BE queue's lock (`stop_ahead`, whose start is then the stop's), and
(with XP_BENCH_GPU_ELAPSED=1, plain streams) the GPU's own duration of each request. All times
in µs; quantiles over the measured requests, and the same for the slowest 1 % of them.

usage: lcbe-marks.py DIR [--json OUT]
"""

import json
import sys
from bisect import bisect_left
from pathlib import Path

# A stop ahead comes first and the deactivate that takes it over after: the stop starts with the
# earlier, and each stop is counted once, by its deactivate.
STOP = ("stop_ahead_start", "deactivate_start", "interrupt_start")
STOP_END = ("stop_ahead_end", "deactivate_end", "interrupt_end")
TAKEN_OVER = ("deactivate_start", "interrupt_start")
RESTART = ("reactivate_start", "restore_start")


def load(path):
    marks = json.loads(path.read_text())["marks"]
    by = {}
    for t, what in marks:
        by.setdefault(what, []).append(t)
    for what, v in by.items():
        if what != "gpu_elapsed":  # durations, one per request in order, not times
            v.sort()
    return by


def first_in(times, lo, hi):
    i = bisect_left(times, lo)
    return times[i] if i < len(times) and times[i] <= hi else None


def count_in(times, lo, hi):
    return bisect_left(times, hi) - bisect_left(times, lo)


def merged(by, names):
    return sorted(t for n in names for t in by.get(n, []))


def quantiles(xs):
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    q = lambda f: xs[min(len(xs) - 1, int(f * len(xs)))]
    return {"n": len(xs), "p50": q(0.5), "p90": q(0.9), "p99": q(0.99)}


def scenario(lc, be):
    starts, ends = lc.get("request_start", []), lc.get("request_end", [])
    stops, stop_ends = merged(be, STOP), merged(be, STOP_END)
    counted, ahead = merged(be, TAKEN_OVER), set(be.get("stop_ahead_start", []))
    app_stops = be.get("stop_on_app_thread", [])
    restarts, settles = merged(be, RESTART), be.get("settled", [])
    launches, launch_ends = lc.get("launch", []), lc.get("launch_end", [])
    rows = []
    for s, e in zip(starts, ends):
        # A stop made for this request: from just before it (the controller stops first) to its end.
        stop = first_in(stops, s - 100_000, e)
        row = {
            "latency": (e - s) / 1e3,
            "first_launch": None,
            "launch_call": None,
            "between_launches": None,
            "after_launch": None,
            "before_second": None,
            "stop_at": None,
            "stop_call": None,
            "settled_at": None,
            "restarts_during": count_in(restarts, s, e),
            "restart_at": None,
            "restart_after_second_launch": None,
            "stops_during": count_in(counted, s, e),
            "ahead": stop in ahead,
            "app_stop_at": None,
            "to_announce": None,
            "announce_call": None,
            "stop_after_announce": None,
            "to_ready": None,
            "ready_call": None,
            "after_ready": None,
            "restart_after_end": None,
            "idle_after_end": None,
            "restart_after_idle": None,
        }
        app_stop = first_in(app_stops, s - 100_000, e)
        if app_stop is not None:
            row["app_stop_at"] = (app_stop - s) / 1e3
        restarted = first_in(restarts, s, e)
        if restarted is not None:
            row["restart_at"] = (restarted - s) / 1e3
        launch = first_in(launches, s, e)
        if launch is not None:
            row["first_launch"] = (launch - s) / 1e3
            done = first_in(launch_ends, launch, e)
            if done is not None:
                row["launch_call"] = (done - launch) / 1e3
                second = first_in(launches, done, e)
                if second is not None:
                    row["between_launches"] = (second - done) / 1e3
                    if restarted is not None:
                        row["restart_after_second_launch"] = (restarted - second) / 1e3
                # Only a queue's submissions are marked (a plain stream's launch is the submission).
                returned = first_in(lc.get("submitted", []), done, second or e)
                if returned is not None:
                    row["after_launch"] = (returned - done) / 1e3
                    if second is not None:
                        row["before_second"] = (second - returned) / 1e3
                    # Inside after_launch (local scheduler only): up to the Ready report, the
                    # report itself, and what follows it.
                    ready = first_in(lc.get("ready_start", []), done, returned)
                    if ready is not None:
                        row["to_ready"] = (ready - done) / 1e3
                        ready_end = first_in(lc.get("ready_end", []), ready, returned)
                        if ready_end is not None:
                            row["ready_call"] = (ready_end - ready) / 1e3
                            row["after_ready"] = (returned - ready_end) / 1e3
            announced = first_in(lc.get("announce_start", []), s, launch or e)
            if announced is not None:
                row["to_announce"] = (announced - s) / 1e3
                announce_end = first_in(lc.get("announce_end", []), announced, launch or e)
                if announce_end is not None:
                    row["announce_call"] = (announce_end - announced) / 1e3
                    if stop is not None and stop >= announce_end:
                        row["stop_after_announce"] = (stop - announce_end) / 1e3
        if stop is not None:
            row["stop_at"] = (stop - s) / 1e3
            end = first_in(stop_ends, stop, e + 10_000_000)
            if end is not None:
                row["stop_call"] = (end - stop) / 1e3
            restart = first_in(restarts, stop, e + 10_000_000)
            if restart is not None:
                row["restart_after_end"] = (restart - e) / 1e3
            # Through the local scheduler: when the LC queue's Idle came, and the restart after it.
            idle = first_in(lc.get("idle_start", []), e - 100_000, restart or e + 10_000_000)
            if idle is not None:
                row["idle_after_end"] = (idle - e) / 1e3
                if restart is not None:
                    row["restart_after_idle"] = (restart - idle) / 1e3
            # Seen settled before the restart (the watcher looks now and then, so this is late).
            settled = first_in(settles, stop, restart or e + 10_000_000)
            if settled is not None:
                row["settled_at"] = (settled - s) / 1e3
        rows.append(row)
    if not rows:
        return None
    keys = [k for k in rows[0] if k not in ("latency", "ahead")]
    slow = sorted(rows, key=lambda r: r["latency"])[-max(1, len(rows) // 100):]
    out = {"requests": len(rows), "latency": quantiles(r["latency"] for r in rows)}
    out["no_stop_seen"] = sum(r["stop_at"] is None for r in rows)
    out["stopped_ahead"] = sum(r["ahead"] for r in rows)
    out["flapped"] = sum(r["restarts_during"] > 0 for r in rows)
    out["latency_unflapped"] = quantiles(r["latency"] for r in rows if r["restarts_during"] == 0)
    out["stopped_on_app_thread"] = sum(r["app_stop_at"] is not None for r in rows)
    out["latency_app_stop"] = quantiles(r["latency"] for r in rows if r["app_stop_at"] is not None)
    for k in keys:
        out[k] = quantiles(r[k] for r in rows)
    out["slowest_1pct"] = {k: quantiles(r[k] for r in slow) for k in ["latency"] + keys}
    gpu = lc.get("gpu_elapsed", [])
    if gpu:
        out["gpu_elapsed"] = quantiles(v / 1e3 for v in gpu)
    return out


def main():
    args = sys.argv[1:]
    if not args or args[0].startswith("-"):
        sys.exit(__doc__)
    d = Path(args[0])
    json_out = args[args.index("--json") + 1] if "--json" in args else None
    report = {}
    for lc_path in sorted(d.glob("*-lc.json")):
        name = lc_path.name[: -len("-lc.json")]
        be_path = d / f"{name}-be.json"
        lc = load(lc_path)
        be = load(be_path) if be_path.exists() else {}
        report[name] = scenario(lc, be)
    if not report:
        sys.exit(f"no *-lc.json marks in {d}")
    fmt = lambda q: "-" if q is None else f"{q['p50']:.1f}/{q['p90']:.1f}/{q['p99']:.1f}"
    for name, r in report.items():
        if r is None:
            print(f"{name}: no measured requests")
            continue
        print(f"{name}: {r['requests']} requests, no stop seen {r['no_stop_seen']}, "
              f"stopped ahead {r['stopped_ahead']}, "
              f"restarted mid-request {r['flapped']}, stopped on an application's thread "
              f"{r['stopped_on_app_thread']}")
        for k in ["latency", "first_launch", "launch_call", "between_launches", "after_launch", "before_second",
                  "stop_at", "stop_call", "settled_at", "restarts_during", "restart_at",
                  "restart_after_second_launch", "restart_after_end", "app_stop_at",
                  "to_announce", "announce_call", "stop_after_announce", "to_ready", "ready_call",
                  "after_ready", "idle_after_end", "restart_after_idle"]:
            print(f"  {k:<18} p50/p90/p99 {fmt(r[k]):<24} slowest 1% {fmt(r['slowest_1pct'][k])}")
        print(f"  {'latency_unflapped':<18} p50/p90/p99 {fmt(r['latency_unflapped'])}")
        print(f"  {'latency_app_stop':<18} p50/p90/p99 {fmt(r['latency_app_stop'])}")
        if "gpu_elapsed" in r:
            print(f"  {'gpu_elapsed':<18} p50/p90/p99 {fmt(r['gpu_elapsed'])}")
    if json_out:
        Path(json_out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
