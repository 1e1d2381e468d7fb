"""The matrix's summary: per scenario, mode and job, pooled over rounds, from the per-run records
(runs/*.json). Standard library only, so it runs (and is tested) without a GPU."""

import json
import os

from scenarios import MODES
from stats import bootstrap_interval, mean, percentile, ratio


def _r(x, nd=3):
    return None if x is None else round(x, nd)


def _lat(records, field):
    pooled = []
    for j in records:
        pooled += j.get(field) or []
    return sorted(pooled)


def _alone(runs):
    """Per job key: its alone records (ok ones) and their pooled statistics."""
    recs = {}
    for r in runs:
        if r["mode"] != "alone":
            continue
        for j in r["jobs"].values():
            recs.setdefault(j["key"], [])
            if j.get("status") == "ok":
                recs[j["key"]].append(j)
    out = {}
    for key, js in recs.items():
        lat, svc = _lat(js, "latencies_ms"), _lat(js, "services_ms")
        u_gpu = mean([j.get("u_gpu") for j in js])
        out[key] = {
            "runs": len(js), "count": len(lat),
            "p50_ms": percentile(lat, 50), "p99_ms": percentile(lat, 99),
            "p99_ci_ms": bootstrap_interval(lat) if lat else None,
            "service_p50_ms": percentile(svc, 50), "service_p99_ms": percentile(svc, 99),
            "throughput": mean([j.get("throughput") for j in js]),
            "unit": next((j.get("unit") for j in js if j.get("unit")), None),
            "u": u_gpu if u_gpu is not None else mean([j.get("u") for j in js]),
            "u_source": "gpu" if u_gpu is not None else "service",
            "digest": next((j.get("digest") for j in js if j.get("digest")), None),
            "service_calib_ms": mean([j.get("service_calib_ms") for j in js]),
            "gpu_calib_ms": mean([j.get("gpu_calib_ms") for j in js]),
            "kernel_ms_measured": mean([j.get("kernel_ms_measured") or j.get("launch_ms_measured") for j in js]),
            # a job whose alone runs disagree among themselves cannot be checked against them
            "alone_digests_differ": len({j.get("digest") for j in js if j.get("digest")}) > 1,
        }
    return out


def _correct(records, alone_digest, alone_differ=False):
    """'yes' when every record's output/checksum equals the alone one and its own check held."""
    if not records:
        return "n/a"
    if alone_differ:
        return "n/a: alone runs differ" + (" (not exact)" if any(j.get("exact") is False for j in records) else "")
    bad = []
    for j in records:
        if j.get("exact") is False:
            bad.append("not exact")
        if alone_digest and j.get("digest") and j["digest"] != alone_digest:
            bad.append("differs from alone")
        if not j.get("digest"):
            bad.append("no checksum")
    return "yes" if not bad else "NO: " + ", ".join(sorted(set(bad)))


def _job_row(job, records, total_runs, alone):
    a = alone.get(job["key"], {})
    ok = [j for j in records if j.get("status") == "ok"]
    row = {"job": job["name"], "role": job["role"], "priority": job["priority"], "workload": job["workload"],
           "key": job["key"], "runs_ok": len(ok), "runs": total_runs, "u_alone": _r(a.get("u")),
           "correct": _correct(ok, a.get("digest"), a.get("alone_digests_differ", False)),
           "failures": sorted({j.get("error") or j.get("status") for j in records if j.get("status") != "ok"})}
    if job["role"] == "LC":
        lat, svc = _lat(ok, "latencies_ms"), _lat(ok, "services_ms")
        p99, ci = percentile(lat, 99), bootstrap_interval(lat) if lat else None
        ap99, asp99 = a.get("p99_ms"), a.get("service_p99_ms")
        row.update({
            "count": len(lat), "p50_ms": _r(percentile(lat, 50)), "p99_ms": _r(p99),
            "p99_ci_ms": [_r(c) for c in ci] if ci else None,
            "service_p50_ms": _r(percentile(svc, 50)), "service_p99_ms": _r(percentile(svc, 99)),
            "p99_x_alone": _r(ratio(p99, ap99)),
            "p99_x_alone_ci": [_r(ratio(c, ap99)) for c in ci] if ci and ap99 else None,
            "service_p99_x_alone": _r(ratio(percentile(svc, 99), asp99)),
        })
    else:
        per_round = [ratio(j.get("throughput"), a.get("throughput")) for j in ok]
        per_round = [x for x in per_round if x is not None]
        be = mean(per_round)
        row.update({
            "throughput": _r(mean([j.get("throughput") for j in ok]), 4), "unit": a.get("unit"),
            "be_x_alone": _r(be), "be_x_alone_range": [_r(min(per_round)), _r(max(per_round))] if per_round else None,
            "wall_x_alone": _r(1 / be) if be else None,
            "partial_window": any(j.get("covered") is False for j in ok),
        })
    return row


def summarize(runs, scenarios):
    """{'alone': per key, 'scenarios': [{name, about, modes: [{mode, rows, worst LC, BE, ...}]}]}"""
    alone = _alone(runs)
    by = {}
    for r in runs:
        by.setdefault((r["scenario"], r["mode"]), []).append(r)
    out = []
    for s in scenarios:
        modes = []
        # Variants of the scenario's modes (scenarios.MODES' `variant_of`) that ran are shown too.
        variants = [m for m, spec in MODES.items()
                    if spec.get("variant_of") in s["modes"] and (s["name"], m) in by]
        for mode in ["alone"] + s["modes"] + variants:
            rows = []
            for job in s["jobs"]:
                if mode == "alone":
                    recs = [r["jobs"][job["key"]] for r in by.get(("alone", "alone"), []) if job["key"] in r["jobs"]]
                else:
                    recs = [r["jobs"].get(job["name"], {"status": r.get("status"), "error": r.get("error")})
                            for r in by.get((s["name"], mode), [])]
                rows.append(_job_row(job, recs, len(recs), alone))
            lcs = [x for x in rows if x["role"] == "LC"]
            bes = [x for x in rows if x["role"] == "BE"]
            sum_u = sum(x["u_alone"] or 0 for x in lcs)
            entry = {"mode": mode, "rows": rows,
                     "lc_p99_x_alone_worst": max((x["p99_x_alone"] for x in lcs if x["p99_x_alone"] is not None), default=None),
                     "lc_service_p99_x_alone_worst": max((x["service_p99_x_alone"] for x in lcs
                                                          if x["service_p99_x_alone"] is not None), default=None),
                     "be_x_alone_min": min((x["be_x_alone"] for x in bes if x["be_x_alone"] is not None), default=None),
                     "lc_u_sum": _r(sum_u) if lcs else None,
                     "be_goal": _r(0.9 * (1 - sum_u)) if lcs and bes else None}
            modes.append(entry)
        out.append({"name": s["name"], "group": s["group"], "about": s["about"], "reference": s["reference"],
                    "jobs": [{k: j[k] for k in ("name", "workload", "args", "role", "priority", "key")} for j in s["jobs"]],
                    "modes": modes})
    _references(out)
    for s in out:
        s["harm"] = _harm(s["modes"])
    jobs = {j["key"]: {"workload": j["workload"], "args": j["args"]} for s in scenarios for j in s["jobs"]}
    return {"alone": {k: {**v, "p99_ci_ms": list(v["p99_ci_ms"]) if v["p99_ci_ms"] else None} for k, v in alone.items()},
            "jobs": jobs, "scenarios": out}


def _harm(modes):
    """The goal "do no harm" for each xpreempt mode of a scenario with an LC and a BE: the
    baselines (modes without xpreempt) better on both axes at once (lower worst LC p99 × alone and
    higher lowest BE ÷ alone); and, where protection buys the LC nothing (native's worst LC
    service p99 within 5 % of alone's), whether the BE keeps ≥ 0.95 × native's."""
    measured = [m for m in modes if m["mode"] != "alone" and m["lc_p99_x_alone_worst"] is not None
                and m["be_x_alone_min"] is not None]
    xp = [m for m in measured if MODES[m["mode"]].get("xp")]
    baselines = [m for m in measured if not MODES[m["mode"]].get("xp")]
    if not xp or not baselines:
        return None
    beaten = {m["mode"]: [b["mode"] for b in baselines
                          if b["lc_p99_x_alone_worst"] < m["lc_p99_x_alone_worst"] and b["be_x_alone_min"] > m["be_x_alone_min"]]
              for m in xp}
    native = next((m for m in measured if m["mode"] == "native"), None)
    out = {"beaten_by": beaten, "gains_nothing": None, "be_floor": None, "be_floor_met": None}
    if native is not None and native["lc_service_p99_x_alone_worst"] is not None:
        out["gains_nothing"] = native["lc_service_p99_x_alone_worst"] <= 1.05
        if out["gains_nothing"]:
            out["be_floor"] = _r(0.95 * native["be_x_alone_min"])
            out["be_floor_met"] = {m["mode"]: m["be_x_alone_min"] >= out["be_floor"] for m in xp}
    return out


def _harm_lines(h):
    if not h:
        return []
    parts = [f"{mode}: beaten on both axes by {', '.join(by)}" if by else f"{mode}: no baseline better on both axes"
             for mode, by in h["beaten_by"].items()]
    lines = ["", "Do no harm (worst LC p99 × alone, lowest BE ÷ alone): " + "; ".join(parts) + "."]
    if h["gains_nothing"]:
        met = "; ".join(f"{mode} {'met' if ok else 'missed'}" for mode, ok in h["be_floor_met"].items())
        lines.append(f"Native's LC service p99 is within 5 % of alone's, so protection buys the LC nothing: "
                     f"BE ≥ 0.95 × native = {h['be_floor']:.2f}: {met}.")
    return lines


def _references(out):
    """p99 x reference: an LC's p99 over the same job's p99 in the reference scenario's mode, from
    arrival and at the service tail (a floor whose queue grows without bound has no finite p99
    from arrival, only a service tail)."""
    by_name = {s["name"]: s for s in out}
    for s in out:
        ref = s["reference"]
        if not ref:
            continue
        target = by_name.get(ref["scenario"])
        if target is None:
            continue
        for m in s["modes"]:
            if m["mode"] == "alone":
                continue
            ref_mode = m["mode"] if ref["mode"] == "same" else ref["mode"]
            tm = next((x for x in target["modes"] if x["mode"] == ref_mode), None)
            for row in m["rows"]:
                tr = next((x for x in tm["rows"] if x["job"] == row["job"]), None) if tm else None
                if row["role"] == "LC" and tr is not None:
                    row["p99_x_ref"] = _r(ratio(row["p99_ms"], tr["p99_ms"]))
                    row["service_p99_x_ref"] = _r(ratio(row.get("service_p99_ms"), tr.get("service_p99_ms")))
                    row["ref"] = f"{ref['scenario']}/{ref_mode}"


def _f(x, nd=2):
    return "–" if x is None else f"{x:.{nd}f}"


def markdown(summary, meta):
    lines = ["# Workload matrix", ""]
    for k in ("date", "device", "driver", "commit", "command", "rounds", "duration_s", "elapsed_s"):
        if meta.get(k) is not None:
            lines.append(f"- {k}: {meta[k]}")
    lines += ["", "## Alone", "", "| job | workload and arguments | runs | p50/p99 ms | request ms (GPU ms) | u | "
              "throughput | kernel (launch) ms | outputs |", "|---|---|---|---|---|---|---|---|---|"]
    for key, a in summary["alone"].items():
        job = summary.get("jobs", {}).get(key, {})
        lat = f"{_f(a['p50_ms'])}/{_f(a['p99_ms'])}" if a["count"] else ""
        req = f"{_f(a['service_calib_ms'], 3)} ({_f(a['gpu_calib_ms'], 3)})" if a["service_calib_ms"] is not None else ""
        tput = f"{a['throughput']:.2f} {a['unit'] or ''}/s" if a["throughput"] is not None else ""
        lines.append(f"| {key} | {job.get('workload', '')} {' '.join(job.get('args', []))} | {a['runs']} | {lat} | {req} | "
                     f"{_f(a['u']) if a['count'] else ''} | {tput} | {_f(a['kernel_ms_measured'], 3) if a['kernel_ms_measured'] else ''} | "
                     f"{'alone runs differ' if a['alone_digests_differ'] else 'agree'} |")
    lines += ["", "LC p99 from arrival and from service start, pooled over rounds (of fewer than 100 requests: their "
              "maximum, marked); [95 % bootstrap interval of p99] "
              "/ alone's p99; BE ÷ alone: the mean of each round's throughput inside the LC window over the alone "
              "throughput (min–max over rounds); u: the LC's GPU busy fraction alone; goal: 0.9 × (1 − Σu); "
              "outputs: every run's output/checksum equal to alone's and its own exactness check held.", ""]
    for s in summary["scenarios"]:
        lines.append(f"## {s['name']}" + (f" ({s['group']})" if s["group"] else ""))
        if s["about"]:
            lines += ["", s["about"]]
        lines += ["", "| mode | job | role/prio | p50 ms | p99 ms | p99 × alone [95 %] | service p50/p99 ms | "
                  "service p99 × alone | × ref | BE ÷ alone (range) | u alone | outputs | runs ok |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for m in s["modes"]:
            for x in m["rows"]:
                lc = x["role"] == "LC"
                ci = x.get("p99_x_alone_ci")
                be = "–"
                if not lc and x.get("be_x_alone") is not None:
                    rng = x.get("be_x_alone_range")
                    be = f"{x['be_x_alone']:.3f}" + (f" ({rng[0]:.2f}–{rng[1]:.2f})" if rng else "")
                    if x.get("partial_window"):
                        be += " (partial window)"
                    if not any(j["role"] == "LC" for j in s["jobs"]) and x.get("wall_x_alone"):
                        be += f"; wall × alone {x['wall_x_alone']:.3f}"
                lines.append("| " + " | ".join([
                    m["mode"], x["job"], f"{x['role']}/{x['priority']}",
                    _f(x.get("p50_ms")) if lc else "", _p99_cell(x) if lc else "",
                    (_f(x.get("p99_x_alone")) + (f" [{_f(ci[0])}–{_f(ci[1])}]" if ci else "")) if lc else "",
                    f"{_f(x.get('service_p50_ms'))}/{_f(x.get('service_p99_ms'))}" if lc else "",
                    _f(x.get("service_p99_x_alone")) if lc else "",
                    (f"{_f(x.get('p99_x_ref'))}, service {_f(x.get('service_p99_x_ref'))} ({x['ref']})")
                    if x.get("p99_x_ref") is not None else "",
                    be, _f(x.get("u_alone")) if lc else "", x["correct"], f"{x['runs_ok']}/{x['runs']}",
                ]) + " |")
            if m["be_goal"] is not None and m["mode"] != "alone":
                ok = m["be_x_alone_min"] is not None and m["be_x_alone_min"] >= m["be_goal"]
                lines.append(f"| {m['mode']} | goal | BE ≥ {m['be_goal']:.2f} | | | | | | | "
                             f"{'met' if ok else 'missed'} | Σu {m['lc_u_sum']:.2f} | | |")
        lines += _harm_lines(s.get("harm"))
        failures = sorted({f for m in s["modes"] for x in m["rows"] for f in x["failures"] if f})
        if failures:
            lines += ["", "Failures: " + "; ".join(failures)]
        lines.append("")
    return "\n".join(lines) + "\n"


def _p99_cell(row):
    """The pooled p99; below 100 requests the nearest-rank p99 is the slowest one, said so."""
    n = row.get("count") or 0
    return _f(row.get("p99_ms")) + (f" (max of {n})" if 0 < n < 100 else "")


def load_runs(runs_dir):
    runs = []
    for f in sorted(os.listdir(runs_dir)):
        if f.endswith(".json"):
            with open(os.path.join(runs_dir, f)) as fh:
                runs.append(json.load(fh))
    return runs
