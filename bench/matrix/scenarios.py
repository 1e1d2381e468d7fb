"""Workloads, scenario files and the run plan of the workload matrix (no GPU, no torch here).

A scenario file (JSON) names job templates and scenarios:

    {"jobs": {"clc": {"workload": "cuda-lc", "args": ["--util", "0.3"]}, ...},
     "scenarios": [{"name": "clc-long", "group": "pairs", "about": "...",
                    "modes": ["native", "mps", ...],             (optional; default: DEFAULT_MODES)
                    "reference": {"scenario": "two-lc", "mode": "native"},   (optional)
                    "jobs": [{"job": "clc", "role": "LC", "priority": 10},
                             {"job": "long", "name": "be", "role": "BE", "priority": 0,
                              "extra_args": ["--seed", "2"]}]}]}

A job names a template (`job`) or a `workload` with `args` of its own; `extra_args` are appended.
Jobs whose workload and arguments are equal (apart from --arrival-seed, which only moves the
arrivals) share one alone run per round.
"""

import hashlib
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))

# How each workload is started. `program`: a Python file (run with the runner's python3) or
# ("cuda", MODE) for bench/matrix/cuda/work.cu's MODE. `roles`: what it may be in a scenario.
# `lc`: it measures a latency window (takes --duration as the window and --start-after);
# otherwise it runs until stopped and reports progress marks. `startup_s`: what the plan's time
# estimate assumes for starting and warming up (the PyTorch jobs' from their runs on an H200: a
# run took its window plus 11 s beside ResNet-50, 20 s beside GPT-2). `alone_args`: extra
# arguments in alone runs only, which take `alone_extra_s` longer.
WORKLOADS = {
    "resnet50-graph": {"program": "bench/pytorch/infer.py", "base": ["--model", "resnet50"], "roles": ["LC"],
                       "lc": True, "startup_s": 10.5},
    "gpt2-decode": {"program": "bench/matrix/decode.py", "base": [], "roles": ["LC"], "lc": True,
                    "startup_s": 18.0, "alone_args": ["--gpu-time"], "alone_extra_s": 5.0},
    "cuda-lc": {"program": ("cuda", "lc"), "base": [], "roles": ["LC"], "lc": True, "startup_s": 0.6},
    "train": {"program": "bench/pytorch/train.py", "base": [], "roles": ["BE"], "lc": False, "startup_s": 9.0,
              "stop_s": 2.0},
    "cuda-be": {"program": ("cuda", "be"), "base": [], "roles": ["BE"], "lc": False, "startup_s": 0.6},
    "cuda-persistent": {"program": ("cuda", "persistent"), "base": [], "roles": ["BE"], "lc": False,
                        "startup_s": 0.9, "stop_s": 0.3},
    "cuda-overlap": {"program": ("cuda", "overlap"), "base": [], "roles": ["BE"], "lc": False, "startup_s": 0.8},
}

# Modes: how the jobs of a run share the GPU. `mps`: a private MPS control daemon of the runner's;
# `xp`: a private `xpreempt daemon` ("plain" or "mps" = `xpreempt daemon --mps`) and every job under
# `xpreempt run --priority P`; `be_client_priority`: CUDA_MPS_CLIENT_PRIORITY of the BE jobs;
# `be_thread_percentage`: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE of the BE jobs (the SMs they may use);
# `be_env`: more environment of the BE jobs.
# A mode with `variant_of` runs, where it is asked for with --modes, on every scenario that has
# the mode it varies.
MODES = {
    "alone": {},
    "native": {},
    "mps": {"mps": True},
    "mps_prio": {"mps": True, "be_client_priority": "1"},
    "xp": {"xp": "plain"},
    "xp_mps": {"xp": "mps"},
    "xp_lv1": {"xp": "plain", "run_args": ["--level", "1"], "variant_of": "xp"},
    "mps_prio_be50": {"mps": True, "be_client_priority": "1", "be_thread_percentage": "50",
                      "variant_of": "mps_prio"},
    "xp_mps_be50": {"xp": "mps", "be_thread_percentage": "50", "variant_of": "xp_mps"},
    "mps_prio_be70": {"mps": True, "be_client_priority": "1", "be_thread_percentage": "70",
                      "variant_of": "mps_prio"},
    "xp_mps_be70": {"xp": "mps", "be_thread_percentage": "70", "variant_of": "xp_mps"},
    # The BE's window bounded by command count only (no GPU-time bound): the A/B of that bound.
    "xp_count": {"xp": "plain", "be_env": {"XPREEMPT_GPU_WINDOW_US": "0"}, "variant_of": "xp"},
    "xp_mps_count": {"xp": "mps", "be_env": {"XPREEMPT_GPU_WINDOW_US": "0"}, "variant_of": "xp_mps"},
    # Only one role's jobs under `xpreempt run`, the other's native: which side's interception
    # costs a pair what it costs (nothing is stopped: a native job is not scheduled).
    "xp_lc_only": {"xp": "plain", "only_role": "LC", "variant_of": "xp"},
    "xp_be_only": {"xp": "plain", "only_role": "BE", "variant_of": "xp"},
    # `xpreempt run --pass-through` (launches straight to the driver; waits still make a queue
    # Ready, and level 3 still lowers a stopped process's timeslice) for every job, or for the LC
    # jobs only: what the launch path costs the LC beside the daemon's stops.
    "xp_pass": {"xp": "plain", "run_args": ["--pass-through"], "variant_of": "xp"},
    "xp_lc_pass": {"xp": "plain", "role_run_args": {"LC": ["--pass-through"]}, "variant_of": "xp"},
}
# Every xpreempt mode again as `<mode>@base`, run with the binary of `--xpreempt-bin-base`: an A/B
# of two builds of xpreempt in one run, their rounds interleaved like any other modes.
BASE_SUFFIX = "@base"
for _name, _spec in list(MODES.items()):
    if _spec.get("xp"):
        MODES[_name + BASE_SUFFIX] = {**_spec, "base_bin": True, "variant_of": _spec.get("variant_of", _name)}
DEFAULT_MODES = ["native", "mps", "mps_prio", "xp", "xp_mps"]
ROLES = ("LC", "BE")
ENV_START_S = {"mps": 1.5, "xp": 0.5}
BUILD_S = 25.0


class ScenarioError(ValueError):
    """A scenario file that cannot be run; the message says where and why."""


def _check_keys(where, obj, allowed, required=()):
    if not isinstance(obj, dict):
        raise ScenarioError(f"{where}: expected an object, got {type(obj).__name__}")
    unknown = sorted(set(obj) - set(allowed))
    if unknown:
        raise ScenarioError(f"{where}: unknown key(s) {', '.join(unknown)} (allowed: {', '.join(sorted(allowed))})")
    missing = [k for k in required if k not in obj]
    if missing:
        raise ScenarioError(f"{where}: missing {', '.join(missing)}")


def _check_args(where, args):
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise ScenarioError(f"{where}: args must be a list of strings, e.g. [\"--util\", \"0.3\"]")
    return list(args)


def job_key(workload, args):
    """Identity of a job for its alone run: the workload and its arguments, less --arrival-seed."""
    kept, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a == "--arrival-seed":
            skip = True
        else:
            kept.append(a)
    digest = hashlib.sha256(json.dumps([workload, kept]).encode()).hexdigest()[:8]
    return f"{workload}-{digest}"


def load(path):
    with open(path) as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError as e:
            raise ScenarioError(f"{path}: not JSON: {e}") from None
    return validate(data, where=os.path.basename(path))


def validate(data, where="scenarios"):
    """Returns a list of scenarios with resolved jobs; raises ScenarioError on anything doubtful."""
    _check_keys(where, data, {"jobs", "scenarios", "about"}, ["scenarios"])
    templates = data.get("jobs", {})
    _check_keys(f"{where}: jobs", templates, set(templates))
    for name, t in templates.items():
        w = f"{where}: job template {name!r}"
        _check_keys(w, t, {"workload", "args", "about"}, ["workload"])
        if t["workload"] not in WORKLOADS:
            raise ScenarioError(f"{w}: unknown workload {t['workload']!r} (known: {', '.join(WORKLOADS)})")
        _check_args(w, t.get("args", []))
    if not isinstance(data["scenarios"], list) or not data["scenarios"]:
        raise ScenarioError(f"{where}: scenarios must be a non-empty list")
    out, names = [], set()
    for i, s in enumerate(data["scenarios"]):
        w = f"{where}: scenario #{i + 1}"
        _check_keys(w, s, {"name", "group", "about", "modes", "reference", "jobs"}, ["name", "jobs"])
        name = s["name"]
        if not isinstance(name, str) or not name.replace("-", "").replace("_", "").isalnum():
            raise ScenarioError(f"{w}: name {name!r} must be letters, digits, - and _")
        if name in names or name == "alone":
            raise ScenarioError(f"{w}: name {name!r} is used twice (or reserved)")
        names.add(name)
        w = f"{where}: scenario {name!r}"
        modes = s.get("modes", DEFAULT_MODES)
        if not isinstance(modes, list) or not modes:
            raise ScenarioError(f"{w}: modes must be a non-empty list")
        for m in modes:
            if m not in MODES or m == "alone":
                raise ScenarioError(f"{w}: unknown mode {m!r} (known: {', '.join(m for m in MODES if m != 'alone')}; "
                                    "every scenario's jobs run alone anyway)")
        if len(set(modes)) != len(modes):
            raise ScenarioError(f"{w}: a mode is listed twice")
        if not isinstance(s["jobs"], list) or not s["jobs"]:
            raise ScenarioError(f"{w}: jobs must be a non-empty list")
        jobs, job_names = [], set()
        for j_i, j in enumerate(s["jobs"]):
            jw = f"{w}, job #{j_i + 1}"
            _check_keys(jw, j, {"job", "workload", "args", "extra_args", "name", "role", "priority"}, ["role", "priority"])
            if ("job" in j) == ("workload" in j):
                raise ScenarioError(f"{jw}: give either job (a template) or workload, not both or neither")
            if "job" in j:
                if j["job"] not in templates:
                    raise ScenarioError(f"{jw}: unknown job template {j['job']!r} (known: {', '.join(templates) or 'none'})")
                if "args" in j:
                    raise ScenarioError(f"{jw}: a templated job takes extra_args, not args")
                t = templates[j["job"]]
                workload, args = t["workload"], list(t.get("args", []))
            else:
                workload, args = j["workload"], _check_args(jw, j.get("args", []))
                if workload not in WORKLOADS:
                    raise ScenarioError(f"{jw}: unknown workload {workload!r} (known: {', '.join(WORKLOADS)})")
            args += _check_args(jw, j.get("extra_args", []))
            jname = j.get("name", j.get("job", workload))
            if jname in job_names:
                raise ScenarioError(f"{jw}: job name {jname!r} is used twice in the scenario (give a name)")
            job_names.add(jname)
            if j["role"] not in ROLES:
                raise ScenarioError(f"{jw}: role must be LC or BE, not {j['role']!r}")
            if j["role"] not in WORKLOADS[workload]["roles"]:
                raise ScenarioError(f"{jw}: workload {workload} cannot be {j['role']} (it is {'/'.join(WORKLOADS[workload]['roles'])})")
            if not isinstance(j["priority"], int) or isinstance(j["priority"], bool):
                raise ScenarioError(f"{jw}: priority must be an integer")
            jobs.append({"name": jname, "workload": workload, "args": args, "role": j["role"],
                         "priority": j["priority"], "key": job_key(workload, args)})
        ref = s.get("reference")
        if ref is not None:
            _check_keys(f"{w}: reference", ref, {"scenario", "mode"}, ["scenario", "mode"])
        group = s.get("group", [])
        groups = [group] if isinstance(group, str) else group
        if not isinstance(groups, list) or not all(isinstance(g, str) and g for g in groups):
            raise ScenarioError(f"{w}: group must be a name or a list of names")
        out.append({"name": name, "group": ",".join(groups), "groups": groups, "about": s.get("about", ""), "modes": list(modes),
                    "reference": ref, "jobs": jobs})
    by_name = {s["name"]: s for s in out}
    for s in out:
        ref = s["reference"]
        if ref is None:
            continue
        w = f"{where}: scenario {s['name']!r}: reference"
        target = by_name.get(ref["scenario"])
        if target is None:
            raise ScenarioError(f"{w}: no scenario {ref['scenario']!r}")
        if ref["mode"] != "same" and ref["mode"] not in target["modes"]:
            raise ScenarioError(f"{w}: {ref['scenario']} does not run mode {ref['mode']!r}")
        if ref["mode"] == "same" and not set(s["modes"]) <= set(target["modes"]):
            raise ScenarioError(f"{w}: {ref['scenario']} lacks mode(s) "
                                f"{', '.join(sorted(set(s['modes']) - set(target['modes'])))} for 'same'")
        if not {j["name"] for j in target["jobs"]} & {j["name"] for j in s["jobs"] if j["role"] == "LC"}:
            raise ScenarioError(f"{w}: {ref['scenario']} has no LC job of the same name to compare with")
    return out


def select(scenarios, only):
    """Scenarios named in `only` (names or groups, comma separated); when empty, all but those
    of the group `extra` (kept for runs that ask for them by name)."""
    if not only:
        return [s for s in scenarios if "extra" not in s["groups"]]
    wanted = [w.strip() for w in only.split(",") if w.strip()]
    known = {s["name"] for s in scenarios} | {g for s in scenarios for g in s["groups"]}
    unknown = [w for w in wanted if w not in known]
    if unknown:
        raise ScenarioError(f"--only: unknown scenario or group {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    chosen = [s for s in scenarios if s["name"] in wanted or set(s["groups"]) & set(wanted)]
    # A scenario's reference comes along, or its ratio could not be computed.
    names = {s["name"] for s in chosen}
    extra = {s["reference"]["scenario"] for s in chosen if s["reference"]} - names
    return [s for s in scenarios if s["name"] in names or s["name"] in extra]


def alone_jobs(scenarios):
    """The distinct jobs (by key) in first-seen order, each as its first occurrence."""
    seen = {}
    for s in scenarios:
        for j in s["jobs"]:
            seen.setdefault(j["key"], {**j, "name": j["key"], "priority": 0})
    return list(seen.values())


def runs_mode(scenario, mode):
    """Whether `scenario` runs `mode`: one of its modes, or a variant of one."""
    return mode in scenario["modes"] or MODES[mode].get("variant_of") in scenario["modes"]


def plan(scenarios, rounds, modes=None):
    """Runs in order: every round holds every mode of every scenario, plus each distinct job
    alone. Within a round, runs are grouped by mode (one MPS or xpreempt daemon per group), and the
    order of the groups rotates from round to round so that no mode always runs first or last;
    round 1 starts with the alone runs, which calibrate the arrival rates the others reuse."""
    order = ["alone"] + [m for m in MODES if m != "alone"]
    used = [m for m in order if m == "alone" or any(runs_mode(s, m) for s in scenarios)]
    if modes:
        used = [m for m in used if m == "alone" or m in modes]
    else:
        used = [m for m in used if not MODES[m].get("variant_of")]
    runs = []
    for r in range(1, rounds + 1):
        k = (r - 1) % len(used)
        for mode in used[k:] + used[:k]:
            if mode == "alone":
                for j in alone_jobs(scenarios):
                    runs.append({"round": r, "mode": "alone", "scenario": "alone", "jobs": [j], "id": f"r{r}-alone-{j['key']}"})
                continue
            for s in scenarios:
                if runs_mode(s, mode):
                    runs.append({"round": r, "mode": mode, "scenario": s["name"], "jobs": s["jobs"],
                                 "id": f"r{r}-{s['name']}-{mode}"})
    return runs


def estimate_s(runs, duration):
    """Expected wall time of a plan: each run waits for its slowest job to warm up, measures for
    `duration`, and stops its jobs; each mode group starts its daemon once."""
    total, groups = 0.0, set()
    if any(isinstance(WORKLOADS[j["workload"]]["program"], tuple) for r in runs for j in r["jobs"]):
        total += BUILD_S  # nvcc and the calibration, once
    for r in runs:
        info = [WORKLOADS[j["workload"]] for j in r["jobs"]]
        total += max(i["startup_s"] for i in info) + duration + max(i.get("stop_s", 0.5) for i in info)
        if r["mode"] == "alone":
            total += max(i.get("alone_extra_s", 0.0) for i in info)
        m = MODES[r["mode"]]
        if (m.get("mps") or m.get("xp")) and (r["round"], r["mode"]) not in groups:
            groups.add((r["round"], r["mode"]))
            total += ENV_START_S["mps" if m.get("mps") or m.get("xp") == "mps" else "xp"]
    return total
