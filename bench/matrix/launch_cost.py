#!/usr/bin/env python3
"""What interception costs a launch-bound program: the matrix's GPT-2 decoder alone, closed loop,
natively and under `xpreempt run` (beside a private `xpreempt daemon`), in interleaved rounds.

    python3 bench/matrix/launch_cost.py --out /tmp/launch-cost --xpreempt-bin target/release/xpreempt
    python3 bench/matrix/launch_cost.py --out q --pin 2-5 --variant tick=/tmp/other/libxpreempt_shim.so

Modes: native, xp (the default level), xp_pass_through (`--pass-through`: the shim observes, the
driver gets every launch at once), and one `xp_NAME` per --variant (another shim build). The
commands per request come from the shim's exit report (XPREEMPT_SHIM_LOG=1) in one extra run.
Prints, and writes to OUT/summary.json, each mode's pooled service p50 with its 95 % bootstrap
interval, × native, and what that difference is per command.
"""

import argparse
import json
import os
import random
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from procs import Env, EnvError, short_dir  # noqa: E402
from stats import bootstrap_interval, percentile  # noqa: E402

DECODE = ["bench/matrix/decode.py", "--batch", "8", "--prompt", "32", "--tokens", "16", "--closed", "--warmup", "3", "--calib", "5"]
# Requests the decoder runs besides its window: warm-up, calibration and the output digest.
EXTRA_REQUESTS = 3 + 5 + 1


def commands_in_exit_report(stderr):
    """The commands of every stream queue in the shim's exit report."""
    total = 0
    for line in stderr.splitlines():
        if "stream queue:" in line:
            total += int(line.split("stream queue:", 1)[1].split()[0])
    return total


def summarize(services, commands_per_request):
    """Per mode: n, service p50 and interval (ms), × native, and the difference per command (µs)."""
    base = percentile(sorted(services["native"]), 50) if services.get("native") else None
    out = {}
    for mode, xs in services.items():
        if not xs:
            continue
        xs = sorted(xs)
        med = percentile(xs, 50)
        lo, hi = bootstrap_interval(xs, q=50) or (med, med)
        row = {"n": len(xs), "p50_ms": med, "lo_ms": lo, "hi_ms": hi}
        if base:
            row["x_native"] = med / base
            if commands_per_request:
                row["added_us_per_command"] = (med - base) * 1e3 / commands_per_request
        out[mode] = row
    return out


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--xpreempt-bin", default="target/release/xpreempt")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=float, default=3.0, help="closed-loop window per run, s")
    p.add_argument("--pin", help="CPUs for every run (taskset -c LIST)")
    p.add_argument("--variant", action="append", default=[], metavar="NAME=SHIM", help="another shim build, as mode xp_NAME")
    p.add_argument("--deadline-s", type=float, default=1e9, help="start no run after this many seconds")
    return p.parse_args()


def main():
    args = parse_args()
    xp_bin = os.path.abspath(args.xpreempt_bin)
    if not os.path.exists(xp_bin):
        sys.exit(f"no xpreempt binary at {xp_bin} (build it: cargo build --release -p xpreempt-cli -p xpreempt-shim)")
    os.makedirs(args.out, exist_ok=True)
    xp = [xp_bin, "run", "--priority", "10"]
    modes = {"native": [], "xp": xp + ["--"], "xp_pass_through": xp + ["--pass-through", "--"]}
    for v in args.variant:
        name, sep, shim = v.partition("=")
        if not sep or not os.path.exists(shim):
            sys.exit(f"--variant {v}: expected NAME=PATH to an existing libxpreempt_shim.so")
        modes[f"xp_{name}"] = xp + ["--shim", os.path.abspath(shim), "--"]
    daemon = Env("xp", short_dir(args.out), args.out, xp_bin, "launch-cost")
    try:
        env = daemon.start().env
    except EnvError as e:
        daemon.stop()
        sys.exit(str(e))
    try:
        t0 = time.monotonic()
        pin = ["taskset", "-c", args.pin] if args.pin else []
        decode = ["python3"] + DECODE + ["--duration", str(args.duration)]
        services = {m: [] for m in modes}
        digests = {}
        failed = 0
        for r in range(args.rounds):
            order = list(modes)
            random.Random(r).shuffle(order)
            for mode in order:
                if time.monotonic() - t0 > args.deadline_s:
                    print(f"deadline: round {r} {mode} not run", flush=True)
                    continue
                out = os.path.join(args.out, f"r{r}-{mode}.json")
                p = subprocess.run(pin + modes[mode] + decode + ["--out", out], env=env, capture_output=True, text=True, timeout=300)
                if p.returncode != 0:
                    print(f"round {r} {mode} failed ({p.returncode}): {p.stderr[-400:]}", flush=True)
                    failed += 1
                    continue
                with open(out) as f:
                    j = json.load(f)
                services[mode] += j["services_ms"]
                digests.setdefault(j["output_sha256"], set()).add(mode)
                print(f"round {r} {mode:20s} n={j['count']} service p50 {percentile(sorted(j['services_ms']), 50):.1f} ms", flush=True)
        counted = os.path.join(args.out, "count.json")
        p = subprocess.run(pin + modes["xp"] + decode + ["--out", counted], env=dict(env, XPREEMPT_SHIM_LOG="1"), capture_output=True, text=True, timeout=300)
        per_request = None
        if p.returncode == 0:
            with open(counted) as f:
                per_request = commands_in_exit_report(p.stderr) / (EXTRA_REQUESTS + json.load(f)["count"])
    finally:
        daemon.stop()
    summary = summarize(services, per_request)
    print(f"commands per request: {per_request and round(per_request)}")
    for mode, row in summary.items():
        added = row.get("added_us_per_command")
        print(f"{mode:20s} n={row['n']:3d} service p50 {row['p50_ms']:7.2f} ms [{row['lo_ms']:.2f}-{row['hi_ms']:.2f}]"
              f" × native {row.get('x_native', float('nan')):.3f}, per command {'-' if added is None else f'{added:+.2f} µs'}")
    agree = len(digests) == 1
    print("outputs:", "agree" if agree else {d: sorted(m) for d, m in digests.items()}, f"({failed} run(s) failed)")
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump({"commands_per_request": per_request, "modes": summary, "outputs_agree": agree, "failed_runs": failed, "services_ms": services}, f, indent=1)
    return 0 if agree and failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
