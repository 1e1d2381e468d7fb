#!/usr/bin/env python3
"""Killing the low-priority process mid-run leaves the daemon and the high-priority one unharmed.

Starts `xpreempt daemon` on a private socket, ResNet-50 training at priority 0 and CUDA-graph
ResNet-50 inference (Poisson arrivals) at priority 10, both under `xpreempt run`; SIGKILLs the
training halfway through the inference's measured window. Checks that:
  - the inference captures its CUDA graph, finishes with status 0 and its results;
  - its p99 after the kill is not worse than before it (1.25x slack for noise);
  - the daemon still answers `xpreempt list` and has dropped the dead process's queues while
    it still lists the inference's.
Exit 0 iff all hold. Writes a JSON summary (--out) and the logs (--log-dir).

    python3 bench/pytorch/kill_low.py --xpreempt-bin target/release/xpreempt --out kill.json
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from common import percentile  # noqa: E402


def p99(xs):
    return percentile(sorted(xs), 99)


def wait_file(path, proc, timeout):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if os.path.exists(path):
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.1)
    return False


def xp_json(xp, sock, *args):
    r = subprocess.run([xp, "--json", *args, "--socket", sock], capture_output=True, text=True, timeout=20)
    return r.returncode, r.stdout


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--xpreempt-bin", default=os.environ.get("XPREEMPT_BIN", "xpreempt"))
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--duration", type=float, default=20.0, help="inference's measured window, s")
    p.add_argument("--mps", action="store_true", help="the daemon owns MPS (xpreempt daemon --mps)")
    p.add_argument("--out", default="kill-low.json")
    p.add_argument("--log-dir", default="kill-low-logs")
    a = p.parse_args()
    os.makedirs(a.log_dir, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="xp-kill-")
    sock = os.path.join(tmp, "xp.sock")
    env = dict(os.environ, XPREEMPT_SOCKET=sock)
    logs = {n: open(os.path.join(a.log_dir, f"{n}.log"), "w") for n in ("daemon", "train", "infer")}
    procs = {}
    result = {"checks": {}, "mps": a.mps}
    try:
        procs["daemon"] = subprocess.Popen([a.xpreempt_bin, "daemon", "--socket", sock] + (["--mps"] if a.mps else []),
                                           stdout=logs["daemon"], stderr=subprocess.STDOUT, env=env)
        end = time.monotonic() + 20
        while not os.path.exists(sock) and time.monotonic() < end:
            time.sleep(0.05)
        tr_ready, inf_ready = os.path.join(tmp, "train.ready"), os.path.join(tmp, "infer.ready")
        inf_out = os.path.join(tmp, "infer.json")
        procs["train"] = subprocess.Popen(
            [a.xpreempt_bin, "run", "--priority", "0", "--", a.python, os.path.join(HERE, "train.py"),
             "--duration", "600", "--ready-file", tr_ready],
            stdout=logs["train"], stderr=subprocess.STDOUT, env=env)
        if not wait_file(tr_ready, procs["train"], 180):
            raise RuntimeError("training did not start (see train.log)")
        procs["infer"] = subprocess.Popen(
            [a.xpreempt_bin, "run", "--priority", "10", "--", a.python, os.path.join(HERE, "infer.py"),
             "--duration", str(a.duration), "--ready-file", inf_ready, "--out", inf_out],
            stdout=logs["infer"], stderr=subprocess.STDOUT, env=env)
        if not wait_file(inf_ready, procs["infer"], 180):
            raise RuntimeError("inference did not start (see infer.log)")
        rc, before = xp_json(a.xpreempt_bin, sock, "list")
        result["list_before"] = json.loads(before) if rc == 0 else before
        time.sleep(a.duration / 2)
        t_kill = time.monotonic()
        os.kill(procs["train"].pid, signal.SIGKILL)
        procs["train"].wait()
        time.sleep(0.5)
        rc, after = xp_json(a.xpreempt_bin, sock, "list")
        result["list_after"] = json.loads(after) if rc == 0 else after
        result["checks"]["daemon_answers_after_kill"] = rc == 0
        text = after if rc == 0 else ""
        result["checks"]["dead_process_queues_dropped"] = rc == 0 and f'"process":{procs["train"].pid}' not in text.replace(" ", "")
        result["checks"]["inference_still_listed"] = rc == 0 and f'"process":{procs["infer"].pid}' in text.replace(" ", "")
        infer_rc = procs["infer"].wait(timeout=a.duration + 120)
        result["checks"]["inference_exit_0"] = infer_rc == 0
        inf = json.load(open(inf_out)) if os.path.exists(inf_out) else None
        if inf:
            lat = inf["latencies_ms"]
            t0, t1 = inf["t_start"], inf["t_end"]
            cut = int(len(lat) * min(1.0, max(0.0, (t_kill - t0) / (t1 - t0))))
            result["infer"] = {"requests": len(lat), "p99_ms": inf["latency"]["p99_ms"],
                               "graph": inf.get("graph"), "graph_error": inf.get("graph_error"),
                               "p99_before_kill_ms": p99(lat[:cut]), "p99_after_kill_ms": p99(lat[cut:]),
                               "requests_before_kill": cut}
            result["checks"]["inference_captured_its_graph"] = inf.get("graph") is True
            result["checks"]["p99_after_not_worse"] = p99(lat[cut:]) <= 1.25 * p99(lat[:cut])
        else:
            result["checks"]["inference_results"] = False
        result["checks"]["daemon_alive_at_end"] = procs["daemon"].poll() is None
    except Exception as e:  # a failed step is a failed check, with the reason
        result["error"] = str(e)
    finally:
        for n in ("infer", "train", "daemon"):
            pr = procs.get(n)
            if pr and pr.poll() is None:
                pr.send_signal(signal.SIGTERM)
                try:
                    pr.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    pr.kill()
    result["passed"] = "error" not in result and bool(result["checks"]) and all(result["checks"].values())
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({k: v for k, v in result.items() if not k.startswith("list_")}, indent=1))
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
