#!/usr/bin/env python3
"""Real PyTorch pairs on one GPU, in one run: each program alone, then together under every
sharing mode, with inference latency and training throughput normalized to alone.

Groups (--groups):
  pair   GPU-bound inference (ResNet-50, CUDA graph, batch 96, ~40 % busy, Poisson) at high
         priority against ResNet-50 training at low priority.
  trio   three processes at three priorities: the pair plus a medium-priority GPT-2 decoder step.
  eager  the launch-bound sanity case: eager ResNet-50 batch 1 against the same training.
  solo   the training alone under each xpreempt mode (no inference): what the interception itself
         costs the training, apart from any preemption.

Modes (--modes): alone (always), native (time-sliced), mps, mps_prio (CUDA_MPS_CLIENT_PRIORITY=1
on the trainer: below normal), mps70 (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=70 on the trainer), and,
with --xpreempt-bin / $XPREEMPT_BIN: xp_lv1, xp_lv3, xp_mps (daemon with --mps), xp_pass
(--pass-through), each under a private `xpreempt daemon`; with --green-lib / $XP_GREEN_LIB (libgreen.so
of bench/cuda/green_probe.cu): mps_green<N>, e.g. mps_green16 (mps_prio with the trainer's work on a
green-context stream holding all SMs but N, N a multiple of 8 on Hopper;
docs/results/h100-green-contexts.md).
MPS runs use private pipe/log dirs.

Goal: inference p99 <= 1.2 x alone and training >= 0.9 x (1 - u) of alone, u being the
fraction of the time the inference alone keeps the GPU busy. The training alone runs again after
the shared runs (not with --quick), and "alone" for the training is the mean of the two windows.

Writes to --out-dir: summary.json, summary.md, cdf-<group>.png, and raw/ (every process's JSON
and log).
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from common import json_safe  # noqa: E402
from summary import ALONE_AFTER, PRIORITY, markdown, plot, shim_report, strip, summarize  # noqa: E402

NATIVE_MODES = ["native", "mps", "mps_prio", "mps70"]
XP_MODES = ["xp_lv1", "xp_lv3", "xp_mps", "xp_pass"]
GREEN_MODES = [f"mps_green{n}" for n in (8, 16, 32, 64, 96)]


def alone_key(kind, mode):
    """Where an alone run's result is kept: `train`, or `train_after` for ALONE_AFTER."""
    return kind if mode == "alone" else f"{kind}_after"
XP_RUN_ARGS = {"xp_lv1": ["--level", "1"], "xp_lv3": ["--level", "3"], "xp_mps": ["--level", "1"],
               "xp_pass": ["--pass-through"]}


def base_mode(mode):
    """An xpreempt mode may carry variants: `xp_lv1+bewindow4` is xp_lv1 with `--window 4` for
    the training;
    `+midwindow16` gives the trio's medium process `--window 16` (above priority 0 it runs
    unthrottled, so its in-flight work may delay the high process it is preempted by);
    `xp_mps+beclientnormal` runs the training at MPS client priority 0 (normal), where
    `xpreempt run` would put a priority-0 program below normal; `+midclientlow` runs the trio's
    medium process below normal too, so that its graph's blocks yield SMs to the high's;
    `+base` runs the mode with the build of `--xpreempt-bin-base`, for an A/B of two builds."""
    return mode.split("+", 1)[0]


def variant_args(mode, role="high"):
    args = []
    for part in mode.split("+")[1:]:
        if part in ("beclientnormal", "midclientlow", "base"):
            continue  # an environment setting (Env.process_env) or the binary (xp_bin)
        for prefix, flag, roles in (("bewindow", "--window", ["low"]),
                                    ("midwindow", "--window", ["medium"])):
            value = part[len(prefix):]
            if part.startswith(prefix) and value.isdigit():
                if roles is None or role in roles:
                    args += [flag, value]
                break
        else:
            raise ValueError(f"mode {mode}: unknown variant {part} (known: bewindow<N>, midwindow<N>, beclientnormal, midclientlow, base)")
    return args


def xp_bin(args, mode):
    """The xpreempt build a mode runs: `--xpreempt-bin-base` for `+base` variants."""
    return args.xpreempt_bin_base if "base" in mode.split("+")[1:] else args.xpreempt_bin


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="pair group, 5 s windows, fewer modes (~2 min)")
    p.add_argument("--duration", type=float, help="measured window per scenario, s (default 20, quick 5)")
    p.add_argument("--groups", help="comma list of pair,trio,eager,solo (default pair,trio,eager; quick: pair)")
    p.add_argument("--modes", help="comma list (default: native,mps,mps_prio,mps70 [+ xp modes]; "
                                   "quick: native,mps,mps_prio [+ xp_lv1,xp_pass])")
    p.add_argument("--xpreempt-bin", default=os.environ.get("XPREEMPT_BIN"))
    p.add_argument("--xpreempt-bin-base", default=os.environ.get("XPREEMPT_BIN_BASE"),
                   help="another build, for the `+base` variants of the xpreempt modes")
    p.add_argument("--green-lib", default=os.environ.get("XP_GREEN_LIB"),
                   help="libgreen.so (bench/cuda/green_probe.cu -DGREEN_LIB), for the mps_green modes")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--out-dir", default="pairs-results")
    p.add_argument("--infer-batch", type=int, default=96)
    p.add_argument("--util", type=float, default=0.4, help="target busy fraction of the high inference")
    p.add_argument("--medium-util", type=float, default=0.15)
    p.add_argument("--eager-util", type=float, default=0.25,
                   help="eager batch 1 is CPU-bound and its service time varies: keep it well below saturation")
    p.add_argument("--train-model", default="resnet50")
    p.add_argument("--train-batch", type=int, default=256)
    p.add_argument("--startup-timeout", type=float, default=240.0)
    p.add_argument("--from-raw", metavar="DIR",
                   help="run nothing: rebuild summary.json/.md and the plots from an earlier run's raw/ folder")
    return p.parse_args()


class Env:
    """One scenario's sharing infrastructure: a private MPS control daemon and/or xpreempt daemon."""

    def __init__(self, mode, tmp, xp_bin, log_dir):
        self.variant, self.tmp, self.xp_bin, self.log_dir = mode, tmp, xp_bin, log_dir
        self.mode = base_mode(mode)
        self.base = dict(os.environ)
        self.mps_dir = None
        self.daemon = None

    def __enter__(self):
        if self.mode in ("mps", "mps_prio", "mps70") or self.mode in GREEN_MODES:
            self.mps_dir = tempfile.mkdtemp(prefix="mps-", dir=self.tmp)
            for d in ("pipe", "log"):
                os.makedirs(os.path.join(self.mps_dir, d))
            self.base["CUDA_MPS_PIPE_DIRECTORY"] = os.path.join(self.mps_dir, "pipe")
            self.base["CUDA_MPS_LOG_DIRECTORY"] = os.path.join(self.mps_dir, "log")
            subprocess.run(["nvidia-cuda-mps-control", "-d"], env=self.base, check=True)
        if self.mode.startswith("xp_"):
            sock = os.path.join(self.tmp, f"xp-{self.variant}.sock")
            self.base["XPREEMPT_SOCKET"] = sock
            cmd = [self.xp_bin, "daemon", "--socket", sock] + (["--mps"] if self.mode == "xp_mps" else [])
            log = open(os.path.join(self.log_dir, f"daemon-{self.variant}.log"), "w")
            self.daemon = subprocess.Popen(cmd, env=self.base, stdout=log, stderr=subprocess.STDOUT)
            t0 = time.time()
            while not os.path.exists(sock):
                if self.daemon.poll() is not None or time.time() - t0 > 20:
                    raise RuntimeError(f"xpreempt daemon did not start (see daemon-{self.variant}.log)")
                time.sleep(0.05)
        return self

    def __exit__(self, *exc):
        if self.daemon is not None:
            stop_process(self.daemon, 20)
        if self.mps_dir:
            pid_file = os.path.join(self.base["CUDA_MPS_PIPE_DIRECTORY"], "nvidia-cuda-mps-control.pid")
            pid = None
            try:
                pid = int(open(pid_file).read().strip())
            except (OSError, ValueError):
                pass
            subprocess.run(["nvidia-cuda-mps-control"], input=b"quit\n", env=self.base, check=False)
            t0 = time.time()
            while pid and time.time() - t0 < 20:
                try:
                    os.kill(pid, 0)
                except OSError:
                    break
                time.sleep(0.1)
            shutil.rmtree(self.mps_dir, ignore_errors=True)
        return False

    def process_env(self, role):
        env = dict(self.base)
        env["PYTHONUNBUFFERED"] = "1"
        if (self.mps_dir or self.mode == "xp_mps") and "CUDA_VISIBLE_DEVICES" in env:
            # An MPS client numbers the server's devices from 0; the GPU of a larger host is the
            # control daemon's to select. (Unset, PyTorch counts the host's GPUs.)
            env["CUDA_VISIBLE_DEVICES"] = "0"
        if self.mode in GREEN_MODES and role == "low":
            env["CUDA_MPS_CLIENT_PRIORITY"] = "1"
            env["XP_GREEN_KEEP_FREE"] = self.mode.removeprefix("mps_green")  # read by train.py
        variants = self.variant.split("+")[1:]
        if "beclientnormal" in variants and role == "low":
            env["CUDA_MPS_CLIENT_PRIORITY"] = "0"
        if "midclientlow" in variants and role == "medium":
            env["CUDA_MPS_CLIENT_PRIORITY"] = "1"
        if self.mode == "mps_prio" and role == "low":
            env["CUDA_MPS_CLIENT_PRIORITY"] = "1"  # below normal; the others stay at 0 (normal)
        if self.mode == "mps70" and role == "low":
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = "70"
        return env

    def prefix(self, role):
        if not self.mode.startswith("xp_"):
            return []
        return ([self.xp_bin, "run", "--priority", str(PRIORITY[role])] + XP_RUN_ARGS[self.mode]
                + variant_args(self.variant, role) + ["--"])

    def queues(self):
        """The daemon's queue rows (`xpreempt --json list`'s `queues`), with the time they were read."""
        if self.daemon is None:
            return None
        try:
            out = subprocess.run([self.xp_bin, "--json", "list"], env=self.base, capture_output=True,
                                 text=True, timeout=10).stdout
            return {"t": time.time(), "list": json.loads(out)["queues"]}
        except (OSError, ValueError, subprocess.SubprocessError) as e:
            return {"t": time.time(), "error": str(e)}


def stop_process(proc, timeout):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Runner:
    def __init__(self, args):
        self.args = args
        self.raw = os.path.join(args.out_dir, "raw")
        os.makedirs(self.raw, exist_ok=True)
        self.tmp = tempfile.mkdtemp(prefix="pairs-")
        self.rates = {}

    def spawn(self, env, name, role, program, extra):
        out = os.path.join(self.raw, f"{name}.json")
        ready = os.path.join(self.tmp, f"{name}.ready")
        for f in (out, ready):
            if os.path.exists(f):
                os.remove(f)
        cmd = env.prefix(role) + [self.args.python, os.path.join(HERE, program), "--out", out,
                                  "--ready-file", ready, "--tag", name] + extra
        log = open(os.path.join(self.raw, f"{name}.log"), "w")
        log.write(" ".join(cmd) + "\n")
        log.flush()
        proc = subprocess.Popen(cmd, env=env.process_env(role), stdout=log, stderr=subprocess.STDOUT, cwd=HERE)
        return {"name": name, "role": role, "proc": proc, "out": out, "ready": ready, "cmd": cmd}

    def infer_args(self, kind):
        a = self.args
        if kind == "high":
            extra = ["--model", "resnet50", "--batch", str(a.infer_batch)]
            util = a.util
        elif kind == "eager":
            extra = ["--model", "resnet50-eager", "--batch", "1"]
            util = a.eager_util
        else:  # medium
            extra = ["--model", "gpt2", "--batch", "8", "--seq", "256"]
            util = a.medium_util
        rate = self.rates.get(kind)
        extra += ["--rate", str(rate)] if rate else ["--util", str(util)]
        return extra

    def train_args(self):
        a = self.args
        return ["--model", a.train_model, "--batch", str(a.train_batch), "--duration", str(a.duration * 4 + 600)]

    def wait_ready(self, procs):
        t0 = time.time()
        while not all(os.path.exists(p["ready"]) for p in procs):
            dead = [p["name"] for p in procs if p["proc"].poll() is not None]
            if dead or time.time() - t0 > self.args.startup_timeout:
                raise RuntimeError(f"not ready: {dead or 'timeout'}")
            time.sleep(0.05)

    def run(self, group, mode, members):
        """members: list of (role, kind) with kind in high/medium/eager/train. The first infer
        member measures; the others run until it is done."""
        tag = f"{group}-{mode}"
        print(f"== {tag}", flush=True)
        procs = []
        queues = None
        t0 = time.time()
        with Env(mode, self.tmp, xp_bin(self.args, mode), self.raw) as env:
            try:
                measuring_role, measuring_kind = members[0]
                for role, kind in members[1:]:
                    name = f"{tag}-{kind}"
                    if kind == "train":
                        procs.append(self.spawn(env, name, role, "train.py", self.train_args()))
                    else:  # runs past the measured window; stopped with SIGTERM
                        extra = self.infer_args(kind) + ["--duration", str(self.args.duration * 3 + 60)]
                        procs.append(self.spawn(env, name, role, "infer.py", extra))
                name = f"{tag}-{measuring_kind}"
                if measuring_kind == "train":  # training alone: a fixed window after warmup
                    m = self.spawn(env, name, measuring_role, "train.py", self.train_args())
                    procs.append(m)
                    self.wait_ready([m])
                    time.sleep(self.args.duration)
                else:
                    extra = self.infer_args(measuring_kind) + ["--duration", str(self.args.duration)]
                    for p in procs:
                        extra += ["--start-after", p["ready"]]
                    m = self.spawn(env, name, measuring_role, "infer.py", extra)
                    procs.append(m)
                    queues = [env.queues()]
                    limit = self.args.startup_timeout + self.args.duration + 60
                    try:
                        m["proc"].wait(limit)
                    except subprocess.TimeoutExpired:
                        print(f"  {name} did not finish in {limit:.0f} s", flush=True)
                    queues.append(env.queues())
                    if queues[0] is not None:
                        with open(os.path.join(self.raw, f"{tag}.queues.jsonl"), "w") as f:
                            f.writelines(json.dumps(q) + "\n" for q in queues)
            except RuntimeError as e:
                print(f"  {tag}: {e}", flush=True)
            finally:
                for p in procs:
                    stop_process(p["proc"], 120)
        results = {}
        for p in procs:
            kind = p["name"].rsplit("-", 1)[1]
            try:
                with open(p["out"]) as f:
                    results[kind] = json.load(f)
            except (OSError, ValueError):
                results[kind] = {"error": f"no result (exit {p['proc'].returncode}); see raw/{p['name']}.log"}
            results[kind]["exit_code"] = p["proc"].returncode
            report = shim_report(os.path.join(self.raw, f"{p['name']}.log"))
            if report:
                results[kind]["shim_report"] = report
        print(f"   {time.time() - t0:.0f} s", flush=True)
        return {"group": group, "mode": mode, "measuring": members[0][1], "results": results, "queues": queues}


GROUP_MEMBERS = {
    "pair": [("high", "high"), ("low", "train")],
    "trio": [("high", "high"), ("medium", "medium"), ("low", "train")],
    "eager": [("high", "eager"), ("low", "train")],
    "solo": [("low", "train")],
}


def load_raw(raw):
    """Runs (alone and shared) rebuilt from raw/<group>-<mode>-<kind>.json file names."""
    alone, alone_runs, runs, by_key = {}, [], [], {}
    queues = {}
    for f in sorted(os.listdir(raw)):
        if f.endswith(".queues.jsonl"):
            group, mode = f[:-len(".queues.jsonl")].split("-", 1)
            with open(os.path.join(raw, f)) as fh:
                queues[(group, mode)] = [json.loads(line) for line in fh if line.strip()]
        if not f.endswith(".json"):
            continue
        group, rest = f[:-5].split("-", 1)
        mode, kind = rest.rsplit("-", 1)
        with open(os.path.join(raw, f)) as fh:
            res = by_key.setdefault((group, mode), {})[kind] = json.load(fh)
        report = shim_report(os.path.join(raw, f[:-5] + ".log"))
        if report:
            res["shim_report"] = report
    for (group, mode), results in sorted(by_key.items()):
        if mode in ("alone", ALONE_AFTER):
            for kind, res in results.items():
                alone[alone_key(kind, mode)] = res
                alone_runs.append({"group": group, "mode": mode, "measuring": kind, "results": {kind: res}})
        else:
            runs.append({"group": group, "mode": mode, "measuring": GROUP_MEMBERS[group][0][1], "results": results,
                         "queues": queues.get((group, mode))})
    order = {m: i for i, m in enumerate(NATIVE_MODES + GREEN_MODES + XP_MODES)}
    groups = {g: i for i, g in enumerate(GROUP_MEMBERS)}
    runs.sort(key=lambda r: (groups.get(r["group"], 9), order.get(base_mode(r["mode"]), 99), r["mode"]))
    alone_runs.sort(key=lambda r: (groups.get(r["group"], 9), r["measuring"] == "train", r["mode"] == ALONE_AFTER))
    return alone, alone_runs, runs


def report(args, alone, alone_runs, runs, meta):
    rows = summarize(alone_runs + runs, alone)
    first = alone.get("high", {})
    meta.update({"device": first.get("device", "?"), "torch": first.get("torch"),
                 "train_model": args.train_model, "train_batch": args.train_batch, "util": args.util})
    try:
        meta["nvidia_smi"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,compute_mode", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    summary = {"meta": meta, "rows": rows, "alone": {alone_key(r["measuring"], r["mode"]): strip(r["results"]) for r in alone_runs},
               "runs": [{**{k: v for k, v in r.items() if k != "results"}, "results": strip(r["results"])}
                        for r in runs]}
    with open(os.path.join(args.out_dir, "summary.json"), "w") as f:
        json.dump(json_safe(summary), f, indent=1, sort_keys=True)
    md = markdown(rows, meta)
    with open(os.path.join(args.out_dir, "summary.md"), "w") as f:
        f.write(md)
    plot(runs, alone_runs, args.out_dir)
    print(md)


def main():
    args = parse_args()
    command = " ".join([os.path.basename(sys.argv[0])] + sys.argv[1:])
    if args.from_raw:
        os.makedirs(args.out_dir, exist_ok=True)
        alone, alone_runs, runs = load_raw(args.from_raw)
        first = alone.get("high", {})
        report(args, alone, alone_runs, runs, {
            "date": "see raw/", "command": command,
            "duration": (first.get("args") or {}).get("duration"), "rebuilt_from_raw": True})
        return
    if args.duration is None:
        args.duration = 5.0 if args.quick else 20.0
    groups = (args.groups or ("pair" if args.quick else "pair,trio,eager")).split(",")
    xp = XP_MODES if args.xpreempt_bin else []
    if args.modes:
        wanted = args.modes.split(",")
    elif args.quick:
        wanted = ["native", "mps", "mps_prio"] + (["xp_lv1", "xp_pass"] if xp else [])
    else:
        wanted = NATIVE_MODES + xp
    unknown = [m for m in wanted if base_mode(m) not in NATIVE_MODES + GREEN_MODES + XP_MODES]
    try:
        for m in wanted:
            variant_args(m)
    except ValueError as e:
        sys.exit(str(e))
    if unknown or (any(base_mode(m) in XP_MODES for m in wanted) and not args.xpreempt_bin):
        sys.exit(f"modes {unknown or wanted}: unknown, or xpreempt modes without --xpreempt-bin")
    if any("base" in m.split("+")[1:] for m in wanted) and not args.xpreempt_bin_base:
        sys.exit("the +base variants need --xpreempt-bin-base (or $XPREEMPT_BIN_BASE)")
    if any(m in GREEN_MODES for m in wanted):
        if not args.green_lib:
            sys.exit("mps_green modes need --green-lib")
        os.environ["XP_GREEN_LIB"] = os.path.abspath(args.green_lib)  # the processes inherit it
    group_modes = {"pair": wanted,
                   "trio": [m for m in wanted if base_mode(m) in ["native", "mps_prio"] + XP_MODES],
                   "eager": [m for m in wanted if base_mode(m) in ["native", "mps_prio"] + XP_MODES],
                   "solo": [m for m in wanted if base_mode(m) in XP_MODES]}
    os.makedirs(args.out_dir, exist_ok=True)
    runner = Runner(args)
    started = time.time()
    alone, alone_runs, runs = {}, [], []

    def run_alone(group, role, kind, mode="alone"):
        r = runner.run(group, mode, [(role, kind)])
        alone_runs.append(r)
        res = r["results"].get(kind, {})
        alone[alone_key(kind, mode)] = res
        if "rate_per_s" in res:
            runner.rates[kind] = res["rate_per_s"]

    run_alone("pair", "high", "high")
    run_alone("pair", "low", "train")
    for group in groups:
        if group == "trio":
            run_alone("trio", "medium", "medium")
        if group == "eager":
            run_alone("eager", "high", "eager")
        for mode in group_modes[group]:
            runs.append(runner.run(group, mode, GROUP_MEMBERS[group]))
    if runs and not args.quick:
        run_alone("pair", "low", "train", ALONE_AFTER)

    meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "command": command,
            "duration": args.duration, "xpreempt_bin": args.xpreempt_bin, "groups": groups,
            "elapsed_s": round(time.time() - started, 1)}
    report(args, alone, alone_runs, runs, meta)
    print(f"elapsed {meta['elapsed_s']} s; results in {args.out_dir}")
    shutil.rmtree(runner.tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
