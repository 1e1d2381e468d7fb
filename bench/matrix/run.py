#!/usr/bin/env python3
"""The workload matrix: latency-critical (LC) and best-effort (BE) jobs sharing one GPU, each
scenario under every sharing mode, in interleaved rounds, against each job alone.

    python3 bench/matrix/run.py --out matrix-out                  # every scenario, 3 rounds
    python3 bench/matrix/run.py --out matrix-out --only pairs     # a group, or scenario names
    python3 bench/matrix/run.py --out q --quick                   # smoke test: 1 round, 2 s windows
    python3 bench/matrix/run.py --dry-run                         # the plan and its expected time
    python3 bench/matrix/run.py --out matrix-out --from-runs      # rebuild the summary, no GPU

Modes: alone (each distinct job by itself), native (together, time-sliced), mps (a private MPS
control daemon), mps_prio (the same, BE jobs at CUDA_MPS_CLIENT_PRIORITY=1), xp (a private
`xpreempt daemon`, every job under `xpreempt run --priority P`), xp_mps (`xpreempt daemon --mps`).
See README.md beside this file for the workloads, scenarios and outputs.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from procs import Env, EnvError, base_env, execute, kill_live, log, short_dir  # noqa: E402
from report import load_runs, markdown, summarize  # noqa: E402
from scenarios import MODES, ROOT, WORKLOADS, ScenarioError, estimate_s, load, plan, runs_mode, select  # noqa: E402
from svg import pareto_svg  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenarios", default=os.path.join(HERE, "scenarios", "matrix.json"), help="scenario file (JSON)")
    p.add_argument("--only", help="comma list of scenario names or groups (a scenario's reference comes along)")
    p.add_argument("--modes", help="comma list: run only these modes (alone always runs)")
    p.add_argument("--out", default="matrix-out", help="output folder (matrix-out is git-ignored)")
    p.add_argument("--duration", type=float, help="measured window per run, s (default 3; --quick 2)")
    p.add_argument("--rounds", type=int, help="interleaved rounds (default 3; --quick 1)")
    p.add_argument("--quick", action="store_true", help="smoke test: 1 round, 2 s windows")
    p.add_argument("--dry-run", action="store_true", help="print the plan and its expected time; run nothing")
    p.add_argument("--resume", action="store_true", help="keep the runs already in --out/runs and do the rest")
    p.add_argument("--from-runs", action="store_true", help="run nothing: rebuild the summary from --out/runs")
    p.add_argument("--deadline-s", type=float, help="start no run after this many seconds (the summary is still written)")
    p.add_argument("--xpreempt-bin", default=os.environ.get("XPREEMPT_BIN", os.path.join(ROOT, "target", "release", "xpreempt")))
    p.add_argument("--xpreempt-bin-base", default=os.environ.get("XPREEMPT_BIN_BASE"),
                   help="another build of xpreempt, for the modes named <mode>@base (an A/B of two builds)")
    p.add_argument("--trace", action="store_true",
                   help="each xpreempt daemon writes its timeline to logs/trace-r<round>-<mode>.json")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--startup-timeout", type=float, default=180.0, help="s for every job of a run to warm up")
    p.add_argument("--stop-timeout", type=float, default=30.0, help="s between SIGTERM and SIGKILL")
    a = p.parse_args(argv)
    a.out = os.path.abspath(a.out)  # the jobs run in the repository root, not here
    a.duration = a.duration or (2.0 if a.quick else 3.0)
    a.rounds = a.rounds or (1 if a.quick else 3)
    if a.rounds < 1 or a.duration <= 0:
        p.error("--rounds must be >= 1 and --duration > 0")
    if a.modes:
        bad = [m for m in a.modes.split(",") if m not in MODES]
        if bad:
            p.error(f"--modes: unknown {', '.join(bad)} (known: {', '.join(MODES)})")
        if not a.xpreempt_bin_base and any(MODES[m].get("base_bin") for m in a.modes.split(",")):
            p.error("--modes: the @base modes need --xpreempt-bin-base (or $XPREEMPT_BIN_BASE)")
    return a


def xp_bin(args, mode):
    """The xpreempt binary a mode runs: the base build for `<mode>@base`."""
    return args.xpreempt_bin_base if MODES[mode].get("base_bin") else args.xpreempt_bin


def compile_cuda(out):
    """Builds bench/matrix/cuda/work.cu once; returns (binary, error)."""
    nvcc = next((c for c in ["nvcc", "/usr/local/cuda/bin/nvcc"] if subprocess.run(
        ["sh", "-c", f"command -v {c}"], capture_output=True).returncode == 0), None)
    if nvcc is None:
        return None, "no nvcc on PATH or in /usr/local/cuda/bin"
    os.makedirs(os.path.join(out, "bin"), exist_ok=True)
    binary = os.path.join(out, "bin", "work")
    src = os.path.join(HERE, "cuda", "work.cu")
    with open(os.path.join(out, "logs", "nvcc.log"), "w") as f:
        for arch in ("-arch=native", "-arch=sm_90"):
            cmd = [nvcc, "-O2", "-std=c++17", arch, "-o", binary, src]
            f.write(" ".join(cmd) + "\n")
            f.flush()
            if subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=300).returncode == 0:
                return binary, None
    return None, "nvcc failed (logs/nvcc.log)"


def calibrate(binary, out):
    path = os.path.join(out, "calibrate.json")
    r = subprocess.run([binary, "calibrate", "--out", path], env=base_env(), capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise EnvError(f"work calibrate failed ({r.returncode}): {r.stderr.strip()[:300]}")
    with open(path) as f:
        return json.load(f)


def gpu_meta():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout.strip().splitlines()[0]
        name, driver = [x.strip() for x in out.split(",", 1)]
        return {"device": name, "driver": driver}
    except (OSError, subprocess.SubprocessError, IndexError, ValueError):
        return {}


def commit():
    try:
        return subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def brief(rec):
    parts = []
    for name, j in rec["jobs"].items():
        if j["status"] != "ok":
            parts.append(f"{name} FAILED")
        elif j.get("latencies_ms"):
            lat = sorted(j["latencies_ms"])
            parts.append(f"{name} p99 {lat[min(len(lat) - 1, int(0.99 * len(lat)))]:.2f} ms ({len(lat)} req)")
        elif j.get("throughput") is not None:
            parts.append(f"{name} {j['throughput']:.1f} {j.get('unit') or ''}/s")
    return ", ".join(parts)


def write_summary(args, scenarios, meta):
    runs = load_runs(os.path.join(args.out, "runs"))
    summary = summarize(runs, scenarios)
    summary["meta"] = meta
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1, sort_keys=True)
    with open(os.path.join(args.out, "summary.md"), "w") as f:
        f.write(markdown(summary, meta))
    os.makedirs(os.path.join(args.out, "plots"), exist_ok=True)
    for s in summary["scenarios"]:
        pts = []
        for m in s["modes"]:
            if m["mode"] == "alone":
                continue
            lcs = [x for x in m["rows"] if x["role"] == "LC"]
            ci = lcs[0].get("p99_x_alone_ci") if len(lcs) == 1 else None
            pts.append((m["mode"], m["lc_p99_x_alone_worst"], m["be_x_alone_min"], ci))
        if any(p[1] is not None and p[2] is not None for p in pts):
            with open(os.path.join(args.out, "plots", f"{s['name']}.svg"), "w") as f:
                f.write(pareto_svg(f"{s['name']}: LC p99 (worst LC) vs BE throughput (lowest BE)", pts))
    return summary


def main(argv=None):
    args = parse_args(argv)
    try:
        scenarios = select(load(args.scenarios), args.only)
    except (ScenarioError, OSError) as e:
        sys.exit(f"run.py: {e}")
    if args.modes:
        idle = [m for m in args.modes.split(",") if m != "alone" and not any(runs_mode(s, m) for s in scenarios)]
        if idle:
            sys.exit(f"run.py: --modes {', '.join(idle)}: no selected scenario runs it (give the mode a "
                     "`variant_of` in scenarios.MODES, or a scenario `modes` that names it)")
    runs = plan(scenarios, args.rounds, args.modes.split(",") if args.modes else None)
    command = " ".join(["python3", "bench/matrix/run.py"] + (argv if argv is not None else sys.argv[1:]))
    if args.dry_run:
        for i, r in enumerate(runs, 1):
            jobs = ", ".join(f"{j['name']}={j['workload']} {' '.join(j['args'])}".strip() + f" [{j['role']} p{j['priority']}]"
                             for j in r["jobs"])
            print(f"{i:4d}  round {r['round']}  {r['mode']:<8} {r['scenario']:<16} {jobs}")
        est = estimate_s(runs, args.duration)
        print(f"{len(runs)} runs, {len(scenarios)} scenarios, {args.rounds} round(s) of {args.duration:g} s windows: "
              f"about {est / 60:.1f} min")
        return 0
    for d in ("runs", "raw", "logs", "tmp"):
        os.makedirs(os.path.join(args.out, d), exist_ok=True)
    meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "command": command, "commit": commit(),
            "rounds": args.rounds, "duration_s": args.duration, "scenarios": [s["name"] for s in scenarios]}
    if args.from_runs:
        # The run's own facts (when, where, how long a window) come from the summary it wrote.
        try:
            with open(os.path.join(args.out, "summary.json")) as f:
                ran = json.load(f).get("meta", {})
        except (OSError, ValueError):
            ran = {}
        kept = {k: ran[k] for k in ("date", "device", "driver", "commit", "command", "rounds", "duration_s") if k in ran}
        write_summary(args, scenarios, {**meta, **kept, "rebuilt_from_runs": True})
        with open(os.path.join(args.out, "summary.md")) as f:
            print(f.read())
        return 0
    meta.update(gpu_meta())
    state_path = os.path.join(args.out, "state.json")
    state = {"rates": {}, "ipu": None}
    if args.resume and os.path.exists(state_path):
        with open(state_path) as f:
            state.update(json.load(f))

    def save_state():
        with open(state_path, "w") as f:
            json.dump(state, f, indent=1)

    ctx = {"python": args.python, "duration": args.duration, "rates": state["rates"], "startup_timeout": args.startup_timeout,
           "stop_timeout": args.stop_timeout, "lc_grace": 90.0}

    # A SIGTERM (a timeout around this script) unwinds like Ctrl-C, through every finally below,
    # with less patience for jobs that do not stop: whoever sent it is waiting.
    def on_term(signum, frame):
        ctx["stop_timeout"] = min(ctx["stop_timeout"], 5.0)
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    t_start = time.monotonic()
    if any(isinstance(WORKLOADS[j["workload"]]["program"], tuple) for r in runs for j in r["jobs"]):
        log("building bench/matrix/cuda/work.cu")
        ctx["work_bin"], ctx["work_error"] = compile_cuda(args.out)
        if ctx["work_bin"]:
            try:
                state["ipu"] = state["ipu"] if args.resume and state["ipu"] else calibrate(ctx["work_bin"], args.out)
                ctx["ipu"] = state["ipu"]
                save_state()
                log(f"calibrated: {state['ipu']}")
            except (EnvError, OSError, subprocess.SubprocessError) as e:
                ctx["work_bin"], ctx["work_error"] = None, str(e)
        if not ctx["work_bin"]:
            log(f"CUDA workloads unavailable: {ctx['work_error']}")
    ipc = short_dir(os.path.join(args.out, "ipc"))
    dirs = {"raw": os.path.join(args.out, "raw"), "logs": os.path.join(args.out, "logs"), "tmp": os.path.join(args.out, "tmp")}
    env, env_key, failed = None, None, 0
    try:
        for i, run in enumerate(runs, 1):
            path = os.path.join(args.out, "runs", run["id"] + ".json")
            if args.resume and os.path.exists(path):
                continue
            if args.deadline_s is not None and time.monotonic() - t_start > args.deadline_s:
                log(f"deadline of {args.deadline_s:.0f} s reached: {len(runs) - i + 1} runs not started")
                break
            key = (run["round"], run["mode"])
            if key != env_key:
                if env is not None:
                    env.stop()
                env, env_key = Env(run["mode"], ipc, dirs["logs"], xp_bin(args, run["mode"]), f"r{run['round']}-{run['mode']}", args.trace), key
                try:
                    env.start()
                except (EnvError, OSError, subprocess.SubprocessError) as e:
                    env.stop()
                    env = Env(run["mode"], ipc, dirs["logs"], xp_bin(args, run["mode"]), f"r{run['round']}-{run['mode']}", args.trace)
                    env.broken = str(e)
                    log(f"mode {run['mode']} round {run['round']}: {e}")
            if getattr(env, "broken", None):
                rec = {"id": run["id"], "round": run["round"], "scenario": run["scenario"], "mode": run["mode"],
                       "status": "failed", "error": env.broken, "window": None, "elapsed_s": 0,
                       "jobs": {j["name"]: {"workload": j["workload"], "role": j["role"], "priority": j["priority"],
                                            "key": j["key"], "status": "failed", "error": env.broken} for j in run["jobs"]}}
            else:
                try:
                    rec = execute(run, env, ctx, dirs)
                except EnvError as e:  # a job that cannot even be started (e.g. no CUDA build)
                    rec = {"id": run["id"], "round": run["round"], "scenario": run["scenario"], "mode": run["mode"],
                           "status": "failed", "error": str(e), "window": None, "elapsed_s": 0,
                           "jobs": {j["name"]: {"workload": j["workload"], "role": j["role"], "priority": j["priority"],
                                                "key": j["key"], "status": "failed", "error": str(e)} for j in run["jobs"]}}
            with open(path, "w") as f:
                json.dump(rec, f)
            if rec["mode"] == "alone":
                for name, j in rec["jobs"].items():
                    if j["status"] == "ok" and j.get("rate_per_s") and j["key"] not in state["rates"]:
                        state["rates"][j["key"]] = j["rate_per_s"]
                save_state()
            elapsed = time.monotonic() - t_start
            left = estimate_s(runs[i:], args.duration)
            log(f"{i}/{len(runs)} round {run['round']} {run['scenario']}/{run['mode']}: {rec['status']} "
                f"{rec.get('elapsed_s', 0):.1f} s [{brief(rec)}]{' ' + rec['error'] if rec['error'] else ''} "
                f"(elapsed {elapsed / 60:.1f} min, about {left / 60:.1f} min left)")
            if rec["status"] != "ok":
                failed += 1
                if MODES[run["mode"]] and env is not None and not getattr(env, "broken", None):
                    env.stop()  # a failed client can leave MPS or the daemon in a bad state: start afresh
                    env_key = None
            if i == len(runs) or runs[i]["round"] != run["round"]:
                meta["elapsed_s"] = round(time.monotonic() - t_start, 1)
                write_summary(args, scenarios, meta)
                log(f"round {run['round']} done: {args.out}/summary.md")
    except KeyboardInterrupt as e:
        log(f"interrupted ({e}): stopping daemons, writing the summary")
    finally:
        kill_live(5.0)
        if env is not None:
            env.stop()
    meta["elapsed_s"] = round(time.monotonic() - t_start, 1)
    write_summary(args, scenarios, meta)
    log(f"done in {meta['elapsed_s'] / 60:.1f} min, {failed} failed run(s); {args.out}/summary.md, plots/")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
