#!/usr/bin/env python3
"""How long each queue spent in each state, from an `xpreempt daemon --trace FILE` timeline: per
queue and state (ready, running, suspended), how many spans and their p10/p50/p90/p99 in µs,
and how many suspensions named which queue. Reads a trace whose daemon was killed as well (the
closing `]` missing).

    python3 bench/matrix/trace_spans.py OUT/logs/trace-r1-xp.json [--json]
"""

import argparse
import json
import sys


def load(path):
    """The trace's events; tolerates the missing end of a daemon that did not finish it."""
    with open(path) as f:
        text = f.read().rstrip()
    if not text.endswith("]"):
        text = text.rstrip(",") + "]"
    return [e for e in json.loads(text) if e]


def quantile(sorted_xs, q):
    return sorted_xs[min(len(sorted_xs) - 1, int(q * (len(sorted_xs) - 1) + 0.5))]


def summarize(events):
    """{queue name: {"states": {state: {n, p10_us, p50_us, p90_us, p99_us}}, "suspended_for": {name: n}}}"""
    names = {e["tid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"}
    spans, causes = {}, {}
    for e in events:
        name = names.get(e.get("tid"), f"q{e.get('tid')}")
        if e.get("ph") == "X":
            spans.setdefault(name, {}).setdefault(e["name"], []).append(e["dur"])
        elif e.get("ph") == "i" and e.get("name") == "suspend":
            by = (e.get("args") or {}).get("for")
            by_name = next((n for t, n in names.items() if by and n.split()[0] == by), by or "?")
            causes.setdefault(name, {}).setdefault(by_name, 0)
            causes[name][by_name] += 1
    out = {}
    for name in sorted(set(spans) | set(causes)):
        states = {}
        for state, durs in sorted(spans.get(name, {}).items()):
            durs.sort()
            states[state] = {"n": len(durs), **{f"p{int(q * 100)}_us": quantile(durs, q) for q in (0.1, 0.5, 0.9, 0.99)}}
        out[name] = {"states": states, "suspended_for": causes.get(name, {})}
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = p.parse_args(argv)
    try:
        summary = summarize(load(args.trace))
    except (OSError, ValueError, KeyError) as e:
        print(f"trace_spans: cannot read {args.trace}: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(summary, indent=1))
        return 0
    print("| queue | state | spans | p10 µs | p50 µs | p90 µs | p99 µs |")
    print("|---|---|---|---|---|---|---|")
    for name, q in summary.items():
        for state, s in q["states"].items():
            print(f"| {name} | {state} | {s['n']} | {s['p10_us']:.0f} | {s['p50_us']:.0f} | {s['p90_us']:.0f} | {s['p99_us']:.0f} |")
        for by, n in q["suspended_for"].items():
            print(f"| {name} | suspended for {by} | {n} | | | | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
