#!/usr/bin/env python3
"""Samples a process's threads (name, CPU time, voluntary/involuntary switches) until it exits,
and the cgroup's throttling and the machine's steal time around it. usage: probe.py OUT.json CMD..."""
import json, os, subprocess, sys, time

def read(p):
    try:
        return open(p).read()
    except OSError:
        return None

def cpu_stat():
    out = {}
    for p in ("/sys/fs/cgroup/cpu.stat", "/sys/fs/cgroup/cpu/cpu.stat", "/sys/fs/cgroup/cpu,cpuacct/cpu.stat"):
        t = read(p)
        if t:
            out[p] = dict(l.split() for l in t.splitlines() if len(l.split()) == 2)
    cpu = read("/proc/stat").splitlines()[0].split()
    out["steal_ticks"] = int(cpu[8]); out["total_ticks"] = sum(int(x) for x in cpu[1:])
    return out

def threads(pid):
    res = {}
    base = f"/proc/{pid}/task"
    try:
        tids = os.listdir(base)
    except OSError:
        return res
    for tid in tids:
        st = read(f"{base}/{tid}/stat"); s = read(f"{base}/{tid}/status")
        if not st or not s:
            continue
        f = st[st.rfind(")") + 2:].split()
        d = dict(l.split(":\t", 1) for l in s.splitlines() if ":\t" in l)
        res[tid] = {"comm": d.get("Name", "").strip(), "utime": int(f[11]), "stime": int(f[12]),
                    "vol": int(d.get("voluntary_ctxt_switches", 0)), "invol": int(d.get("nonvoluntary_ctxt_switches", 0)),
                    "cpu": int(f[36])}
    return res

out, cmd = sys.argv[1], sys.argv[2:]
before = cpu_stat()
p = subprocess.Popen(cmd)
seen = {}
while p.poll() is None:
    for tid, v in threads(p.pid).items():
        seen[tid] = v
    # children (the BE process of two-process scenarios, xpreemptd)
    for c in (read(f"/proc/{p.pid}/task/{p.pid}/children") or "").split():
        for tid, v in threads(c).items():
            seen[f"{c}/{tid}"] = v
    time.sleep(0.2)
after = cpu_stat()
json.dump({"cmd": cmd, "rc": p.returncode, "before": before, "after": after, "threads": seen}, open(out, "w"), indent=1)
invol = sorted(seen.items(), key=lambda kv: -kv[1]["invol"])[:12]
print("threads by involuntary switches:", [(v["comm"], v["invol"], v["vol"], v["utime"] + v["stime"]) for _, v in invol])
for k in after:
    if isinstance(after[k], dict):
        print(k, {x: int(after[k][x]) - int(before[k].get(x, 0)) for x in after[k]})
print("steal ticks", after["steal_ticks"] - before["steal_ticks"], "of", after["total_ticks"] - before["total_ticks"])
sys.exit(p.returncode)
