"""Helpers shared by infer.py and train.py (no torch import here: the callers set the
environment that must precede it)."""

import json
import math
import os
import signal
import sys
import time


class StopFlag:
    """Set by SIGTERM/SIGINT: the orchestrator ends a run this way, and the program still writes
    its results."""

    def __init__(self):
        self.stop = False
        signal.signal(signal.SIGTERM, self._handler)
        signal.signal(signal.SIGINT, self._handler)

    def _handler(self, signum, frame):
        self.stop = True


def now():
    # CLOCK_MONOTONIC is system-wide on Linux, so windows from different processes compare.
    return time.monotonic()


def wait_for_files(paths, stop, timeout_s=900.0):
    """Waits until every path exists (the other processes of a pair are warmed up)."""
    t0 = now()
    while not all(os.path.exists(p) for p in paths):
        if stop.stop or now() - t0 > timeout_s:
            return False
        time.sleep(0.01)
    return True


def touch(path):
    if path:
        with open(path + ".tmp", "w") as f:
            f.write(str(now()))
        os.replace(path + ".tmp", path)


def percentile(sorted_values, q):
    """Nearest-rank percentile of an ascending list (q in [0, 100])."""
    if not sorted_values:
        return float("nan")
    k = max(0, min(len(sorted_values) - 1, math.ceil(q / 100.0 * len(sorted_values)) - 1))
    return sorted_values[k]


def latency_stats(values_s):
    """p50/p90/p99/p99.9/mean/max in milliseconds of a list of seconds."""
    v = sorted(values_s)
    ms = lambda x: round(x * 1e3, 4)  # noqa: E731
    return {
        "count": len(v),
        "p50_ms": ms(percentile(v, 50)),
        "p90_ms": ms(percentile(v, 90)),
        "p99_ms": ms(percentile(v, 99)),
        "p999_ms": ms(percentile(v, 99.9)),
        "mean_ms": ms(sum(v) / len(v)) if v else float("nan"),
        "max_ms": ms(v[-1]) if v else float("nan"),
    }


def json_safe(obj):
    """NaN and infinities (a diverged loss, an empty window) become null: strict JSON."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def write_json(path, obj):
    text = json.dumps(json_safe(obj), indent=1, sort_keys=True)
    if path:
        with open(path + ".tmp", "w") as f:
            f.write(text)
        os.replace(path + ".tmp", path)
    else:
        print(text)


def log(*args):
    print(f"[{os.path.basename(sys.argv[0])} {os.getpid()}]", *args, file=sys.stderr, flush=True)
