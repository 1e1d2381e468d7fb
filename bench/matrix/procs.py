"""Processes of the workload matrix: the private MPS and xpreempt daemons of a mode, and one run
(its jobs started together, measured, stopped, their results read back)."""

import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

from scenarios import MODES, ROOT, WORKLOADS
from stats import window_rate


def log(msg):
    print(f"[matrix {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class EnvError(RuntimeError):
    pass


def base_env():
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("XPREEMPT_LOG", "warn")
    # xpreempt's own kernels need NVRTC, which is not on the loader's path everywhere.
    found = sorted(glob.glob("/usr/local/cuda*/lib64/libnvrtc.so*") + glob.glob("/usr/local/cuda*/targets/*/lib/libnvrtc.so*"))
    dirs = [os.path.dirname(found[0])] if found else []
    dirs += [d for d in ["/usr/local/cuda/lib64"] if os.path.isdir(d)]
    if dirs:
        env["LD_LIBRARY_PATH"] = ":".join(dirs + [p for p in env.get("LD_LIBRARY_PATH", "").split(":") if p])
    return env


def short_dir(preferred):
    """`preferred` if a Unix socket path under it fits (108 bytes, MPS adds its own names), else a
    short private directory under /tmp."""
    os.makedirs(preferred, exist_ok=True)
    if len(os.path.abspath(preferred)) <= 60:
        return os.path.abspath(preferred)
    return tempfile.mkdtemp(prefix="xpm-")


def pid_alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


def read_pid(path):
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def stop_mps(pipe_dir, env):
    """Stops the MPS control daemon (and its server) whose pipe directory is `pipe_dir`."""
    env = {**env, "CUDA_MPS_PIPE_DIRECTORY": pipe_dir}
    pid = read_pid(os.path.join(pipe_dir, "nvidia-cuda-mps-control.pid"))
    if pid is None or not pid_alive(pid):
        return
    servers = []
    try:
        out = subprocess.run(["nvidia-cuda-mps-control"], input="get_server_list\n", env=env, text=True,
                             capture_output=True, timeout=10).stdout
        servers = [int(x) for x in out.split() if x.isdigit()]
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", env=env, text=True, capture_output=True, timeout=20)
    except (OSError, subprocess.SubprocessError) as e:
        log(f"MPS quit failed: {e}")
    t0 = time.monotonic()
    while time.monotonic() - t0 < 20 and any(pid_alive(p) for p in [pid] + servers):
        time.sleep(0.1)
    for p in [pid] + servers:  # the daemon and the servers this runner started, by their ids
        if pid_alive(p):
            log(f"MPS process {p} still alive after quit: killing it")
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass


class Env:
    """The sharing infrastructure of one mode, for a group of runs: nothing, a private MPS control
    daemon, or a private xpreempt daemon (`--mps` for xp_mps). Always stopped by stop()."""

    def __init__(self, mode, ipc_dir, log_dir, xp_bin, tag, trace=False):
        self.mode, self.spec = mode, MODES[mode]
        self.trace = trace
        self.ipc, self.log_dir, self.xp_bin, self.tag = ipc_dir, log_dir, xp_bin, tag
        self.env = base_env()
        self.daemon = None
        self.mps_pipe = None
        self.xp_mps_pipe = None

    def start(self):
        if self.spec.get("mps"):
            root = os.path.join(self.ipc, f"mps-{self.tag}")
            self.mps_pipe = os.path.join(root, "pipe")
            logd = os.path.join(self.log_dir, f"mps-{self.tag}")
            for d in (self.mps_pipe, logd):
                os.makedirs(d, exist_ok=True)
            self.env["CUDA_MPS_PIPE_DIRECTORY"] = self.mps_pipe
            self.env["CUDA_MPS_LOG_DIRECTORY"] = logd
            r = subprocess.run(["nvidia-cuda-mps-control", "-d"], env=self.env, capture_output=True, text=True, timeout=30)
            if r.returncode != 0:
                raise EnvError(f"nvidia-cuda-mps-control -d failed ({r.returncode}): {r.stderr.strip()[:300]}")
            t0 = time.monotonic()
            while read_pid(os.path.join(self.mps_pipe, "nvidia-cuda-mps-control.pid")) is None:
                if time.monotonic() - t0 > 15:
                    raise EnvError("the MPS control daemon wrote no pid file in 15 s")
                time.sleep(0.05)
        if self.spec.get("xp"):
            if not self.xp_bin or not os.path.exists(self.xp_bin):
                raise EnvError(f"no xpreempt binary at {self.xp_bin} (build it: cargo build --release -p xpreempt-cli -p xpreempt-shim)")
            sock = os.path.join(self.ipc, f"xp-{self.tag}.sock")
            for stale in (sock,):
                if os.path.exists(stale):
                    os.remove(stale)
            self.env["XPREEMPT_SOCKET"] = sock
            cmd = [self.xp_bin, "daemon", "--socket", sock] + (["--mps"] if self.spec["xp"] == "mps" else [])
            if self.trace:
                cmd += ["--trace", os.path.join(self.log_dir, f"trace-{self.tag}.json")]
            if self.spec["xp"] == "mps":
                self.xp_mps_pipe = sock + ".mps/pipe"
            logf = open(os.path.join(self.log_dir, f"daemon-{self.tag}.log"), "w")
            logf.write(" ".join(cmd) + "\n")
            logf.flush()
            with logf:
                self.daemon = subprocess.Popen(cmd, env=self.env, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
            t0 = time.monotonic()
            while not os.path.exists(sock):
                if self.daemon.poll() is not None or time.monotonic() - t0 > 20:
                    raise EnvError(f"xpreempt daemon did not start (exit {self.daemon.poll()}; see logs/daemon-{self.tag}.log)")
                time.sleep(0.05)
        return self

    def stop(self):
        if self.daemon is not None:
            stop_proc(self.daemon, 20)
            self.daemon = None
        for pipe in (self.xp_mps_pipe, self.mps_pipe):
            if pipe:
                stop_mps(pipe, self.env)

    def mechanism_costs(self):
        """The daemon's measured mechanism costs per device (`xpreempt --json list`'s `costs`),
        read while the BE still runs; None without a daemon, the error where the read failed."""
        if self.daemon is None:
            return None
        try:
            out = subprocess.run([self.xp_bin, "--json", "list"], env=self.env, capture_output=True, text=True, timeout=10)
            return json.loads(out.stdout).get("costs")
        except (OSError, ValueError, subprocess.SubprocessError) as e:
            return {"error": str(e)[:200]}

    def job_env(self, job):
        env = dict(self.env)
        if (self.spec.get("mps") or self.spec.get("xp") == "mps") and "CUDA_VISIBLE_DEVICES" in env:
            # An MPS client numbers the server's devices from 0; the runner's GPU of a larger
            # host is the control daemon's to select. (Unset, PyTorch counts the host's GPUs.)
            env["CUDA_VISIBLE_DEVICES"] = "0"
        if self.spec.get("be_client_priority") and job["role"] == "BE":
            env["CUDA_MPS_CLIENT_PRIORITY"] = self.spec["be_client_priority"]
        if self.spec.get("be_thread_percentage") and job["role"] == "BE":
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = self.spec["be_thread_percentage"]
        if job["role"] == "BE":
            env.update(self.spec.get("be_env", {}))
        return env

    def prefix(self, job):
        if not self.spec.get("xp") or self.spec.get("only_role", job["role"]) != job["role"]:
            return []
        args = self.spec.get("run_args", []) + self.spec.get("role_run_args", {}).get(job["role"], [])
        return [self.xp_bin, "run", "--priority", str(job["priority"])] + args + ["--"]


def stop_proc(proc, timeout):
    """SIGTERM to the job's process group (its own session), then SIGKILL after `timeout` s."""
    if proc.poll() is not None:
        return proc.returncode
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except OSError:
        proc.terminate()
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            proc.kill()
        proc.wait()
        return "killed"


# Every job process the runner has started and not yet reaped: whatever interrupts the runner, its
# last act is to end these (kill_live), so no job outlives it.
LIVE = []


def stop_all(procs, timeout):
    """Stops every job at once (SIGTERM to each, then one shared wait): {name: exit code or 'killed'}."""
    for _, p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except OSError:
                p.terminate()
    deadline = time.monotonic() + timeout
    codes = {j["name"]: stop_proc(p, max(0.1, deadline - time.monotonic())) for j, p in procs}
    for _, p in procs:
        if p in LIVE:
            LIVE.remove(p)
    return codes


def kill_live(timeout):
    """Ends the job processes still running (SIGTERM, then SIGKILL after `timeout` s)."""
    while LIVE:
        stop_proc(LIVE.pop(), timeout)


def command(job, ctx, paths, alone, start_after):
    """The job's command line (without the xpreempt prefix)."""
    w = WORKLOADS[job["workload"]]
    prog = w["program"]
    if isinstance(prog, tuple):
        if not ctx.get("work_bin"):
            raise EnvError(f"the CUDA workloads were not built ({ctx.get('work_error', 'no nvcc')})")
        cmd = [ctx["work_bin"], prog[1]] + w["base"] + job["args"]
        cmd += ["--ipu-light", str(ctx["ipu"]["ipu_light"]), "--ipu-full", str(ctx["ipu"]["ipu_full"])]
        if ctx["ipu"].get("sms"):
            cmd += ["--sms", str(ctx["ipu"]["sms"])]
    else:
        cmd = [ctx["python"], os.path.join(ROOT, prog)] + w["base"] + job["args"]
    if alone:
        cmd += w.get("alone_args", [])
    cmd += ["--out", paths["out"], "--ready-file", paths["ready"], "--tag", paths["tag"]]
    rate = ctx["rates"].get(job["key"])
    if w["lc"]:
        cmd += ["--duration", str(ctx["duration"])]
        if rate and "--rate" not in job["args"] and "--closed" not in job["args"]:
            cmd += ["--rate", repr(rate)]
        for f in start_after:
            cmd += ["--start-after", f]
    else:  # runs until stopped; the bound only guards against a runner that vanished
        cmd += ["--duration", str(ctx["duration"] * 4 + 300)]
    return cmd


def _extract(job, res):
    """The small part of a program's JSON that the record keeps."""
    rec = {"digest": res.get("output_sha256") or res.get("weights_sha256") or res.get("checksum"),
           "exact": res.get("exact")}
    if WORKLOADS[job["workload"]]["lc"]:
        rec.update({k: res.get(k) for k in ("latencies_ms", "services_ms", "rate_per_s", "u", "u_gpu", "t_start",
                                             "t_end", "service_calib_ms", "gpu_calib_ms")})
        rec["count"] = len(res.get("latencies_ms") or [])
    else:
        if "step_end" in res:  # bench/pytorch/train.py
            rec["marks"] = (res.get("step_end") or [], res.get("step_index") or [])
            rec["unit"] = "steps"
        else:
            rec["marks"] = (res.get("mark_t") or [], res.get("mark_work") or [])
            rec["unit"] = res.get("unit")
        for k in ("kernel_ms_measured", "launch_ms_measured", "block_us", "kernel_ms", "streams"):
            if res.get(k) is not None:
                rec[k] = res[k]
    return rec


def execute(run, env, ctx, dirs):
    """Runs one plan entry under `env`; returns its record (never raises for a job's failure)."""
    alone = run["mode"] == "alone"
    jobs = run["jobs"]
    started, procs = time.monotonic(), []
    record = {"id": run["id"], "round": run["round"], "scenario": run["scenario"], "mode": run["mode"],
              "status": "ok", "error": None, "window": None, "jobs": {}, "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    paths = {}
    for j in jobs:
        tag = f"{run['id']}-{j['name']}"
        paths[j["name"]] = {"tag": tag, "out": os.path.join(dirs["raw"], tag + ".json"),
                            "ready": os.path.join(dirs["tmp"], tag + ".ready"), "log": os.path.join(dirs["logs"], tag + ".log")}
        for f in ("out", "ready"):
            if os.path.exists(paths[j["name"]][f]):
                os.remove(paths[j["name"]][f])
    try:
        for j in jobs:
            others = [paths[o["name"]]["ready"] for o in jobs if o is not j]
            cmd = env.prefix(j) + command(j, ctx, paths[j["name"]], alone, others)
            logf = open(paths[j["name"]]["log"], "w")
            logf.write(" ".join(cmd) + "\n")
            logf.flush()
            with logf:  # the child keeps its own descriptor
                procs.append((j, subprocess.Popen(cmd, env=env.job_env(j), stdout=logf, stderr=subprocess.STDOUT,
                                                  cwd=ROOT, start_new_session=True)))
            LIVE.append(procs[-1][1])
        t0 = time.monotonic()
        while not all(os.path.exists(paths[j["name"]]["ready"]) for j, _ in procs):
            dead = [j["name"] for j, p in procs if p.poll() is not None and not os.path.exists(paths[j["name"]]["ready"])]
            if dead:
                raise EnvError(f"exited before ready: {', '.join(dead)}")
            if time.monotonic() - t0 > ctx["startup_timeout"]:
                raise EnvError(f"not ready after {ctx['startup_timeout']:.0f} s")
            time.sleep(0.02)
        lcs = [(j, p) for j, p in procs if WORKLOADS[j["workload"]]["lc"]]
        if lcs:
            limit = time.monotonic() + ctx["duration"] + ctx["lc_grace"]
            for j, p in lcs:
                try:
                    p.wait(max(0.1, limit - time.monotonic()))
                except subprocess.TimeoutExpired:
                    raise EnvError(f"{j['name']} did not finish its window in {ctx['duration'] + ctx['lc_grace']:.0f} s") from None
            record["xp_costs"] = env.mechanism_costs()
        else:
            w0 = time.monotonic()
            while time.monotonic() - w0 < ctx["duration"]:
                if any(p.poll() is not None for _, p in procs):
                    break
                time.sleep(0.02)
            record["window"] = [w0, time.monotonic()]
    except EnvError as e:
        record["status"], record["error"] = "failed", str(e)
    finally:
        codes = stop_all(procs, ctx["stop_timeout"])
    results = {}
    for j in jobs:
        rec = {"workload": j["workload"], "role": j["role"], "priority": j["priority"], "key": j["key"],
               "exit_code": codes.get(j["name"]), "status": "failed"}
        try:
            with open(paths[j["name"]]["out"]) as f:
                res = json.load(f)
            rec.update(_extract(j, res))
            rec["status"] = "ok"
        except (OSError, ValueError):
            rec["error"] = f"{j['name']}: no result (exit {codes.get(j['name'])}); see logs/{paths[j['name']]['tag']}.log"
        if rec["status"] == "ok" and codes.get(j["name"]) == "killed":
            rec["status"], rec["error"] = "failed", f"{j['name']}: killed after {ctx['stop_timeout']:.0f} s"
        elif rec["status"] == "ok" and codes.get(j["name"]) not in (0, None):
            rec["error"] = f"{j['name']}: exit {codes.get(j['name'])}"  # a failed check: `exact` says which
        if record["status"] == "failed" and WORKLOADS[j["workload"]]["lc"] and rec["status"] == "ok":
            rec["status"], rec["error"] = "failed", record["error"]
        results[j["name"]] = rec
    # BE throughput inside the LC windows (their intersection), else the runner's own window.
    lc_windows = [(r["t_start"], r["t_end"]) for r in results.values()
                  if r["status"] == "ok" and r.get("t_start") is not None]
    if lc_windows:
        record["window"] = [max(a for a, _ in lc_windows), min(b for _, b in lc_windows)]
    for name, r in results.items():
        marks = r.pop("marks", None)
        if marks is not None and r["status"] == "ok":
            rate, covered = window_rate(marks[0], marks[1], *(record["window"] or (None, None)))
            r["throughput"], r["covered"] = rate, covered
            if rate is None:
                r["status"], r["error"] = "failed", f"{name}: no progress inside the window"
    if record["error"]:  # what stopped the run comes first in every failed job's reason
        for r in results.values():
            if r["status"] != "ok" and r.get("error") != record["error"]:
                r["error"] = f"{record['error']}; {r.get('error')}"
    if record["status"] == "ok" and any(r["status"] != "ok" for r in results.values()):
        record["status"] = "failed"
        record["error"] = "; ".join(r.get("error") or "" for r in results.values() if r["status"] != "ok")
    record["jobs"] = results
    record["elapsed_s"] = round(time.monotonic() - started, 2)
    return record
