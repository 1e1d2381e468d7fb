#!/usr/bin/env python3
"""A stand-in for the matrix's workloads in the runner's tests (no GPU): `lc` writes the LC JSON
keys after a window of --duration, `be` reports progress marks until SIGTERM. --misbehave makes
it fail the ways real jobs do: `die` (exit before ready), `hang` (ignore SIGTERM; `hang-under-xp`:
only beside an xpreempt daemon), `nooutput`."""
import argparse
import json
import os
import signal
import sys
import time


def main():
    p = argparse.ArgumentParser()
    p.add_argument("role", choices=["lc", "be"])
    p.add_argument("--out")
    p.add_argument("--ready-file")
    p.add_argument("--tag")
    p.add_argument("--duration", type=float, default=1.0)
    p.add_argument("--start-after", action="append", default=[])
    p.add_argument("--rate", type=float)
    p.add_argument("--util", type=float, default=0.3)
    p.add_argument("--service-ms", type=float, default=2.0)
    p.add_argument("--arrival-seed", type=int)
    p.add_argument("--misbehave", default="")
    a = p.parse_args()
    stop = []
    if a.misbehave == "hang" or (a.misbehave == "hang-under-xp" and os.environ.get("XPREEMPT_SOCKET")):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    if a.misbehave == "die":
        sys.exit(3)
    marks_t, marks_w, w = [time.monotonic()], [0], 0
    with open(a.ready_file, "w") as f:
        f.write("ready")
    if a.role == "lc":
        t0 = time.monotonic()
        while not all(os.path.exists(x) for x in a.start_after) and time.monotonic() - t0 < 30 and not stop:
            time.sleep(0.01)
        rate = a.rate or a.util / (a.service_ms / 1e3)
        t_start = time.monotonic()
        lat = []
        while time.monotonic() - t_start < a.duration and not stop:
            time.sleep(0.01)
            lat.append(a.service_ms * (1 + len(lat) % 7 / 10))
        res = {"t_start": t_start, "t_end": time.monotonic(), "latencies_ms": lat, "services_ms": lat,
               "rate_per_s": rate, "u": a.util, "output_sha256": "abc"}
    else:
        t0 = time.monotonic()
        while not stop and time.monotonic() - t0 < a.duration:
            time.sleep(0.01)
            w += 1
            marks_t.append(time.monotonic())
            marks_w.append(w)
        res = {"mark_t": marks_t, "mark_work": marks_w, "unit": "ticks", "checksum": "c0ffee", "exact": True}
    if a.misbehave != "nooutput":
        with open(a.out, "w") as f:
            json.dump(res, f)


if __name__ == "__main__":
    main()
