"""The summary of a pairs.py run: metrics normalized to alone, goal checks, the Markdown table,
the latency CDF plots. No torch here: `pairs.py --from-raw` re-summarizes on any machine."""

import os
import random

from common import percentile

PRIORITY = {"high": 10, "medium": 5, "low": 0}
ALONE_AFTER = "aloneafter"  # the training alone again, after the shared runs
# Bootstrap resamples per interval: the interval's ends move by about 0.01 between seeds.
RESAMPLES = 1000


def ratio_interval(values, ref_values, q=99.0, seed=0):
    """95 % bootstrap interval of percentile q of `values` over that of `ref_values`, each list
    resampled on its own (the runs are independent). A 10 s window holds ~500 requests, so its
    p99 rests on its five slowest: the interval says how far another window could land."""
    if len(values) < 2 or len(ref_values) < 2:
        return None
    rng = random.Random(seed)
    ratios = sorted(
        percentile(sorted(rng.choices(values, k=len(values))), q)
        / percentile(sorted(rng.choices(ref_values, k=len(ref_values))), q)
        for _ in range(RESAMPLES))
    return percentile(ratios, 2.5), percentile(ratios, 97.5)


def shim_report(log_path):
    """The shim's exit report in a process's log (XPREEMPT_SHIM_LOG=1): which calls waited for
    buffered commands, and how each stream queue's window was fed."""
    try:
        with open(log_path, errors="replace") as f:
            return [line.strip().removeprefix("xpreempt-shim: ") for line in f
                    if line.startswith("xpreempt-shim: ")
                    and ("waits for buffered commands" in line or "stream queue:" in line)]
    except OSError:
        return []


def preemptions_per_s(queues, priority):
    """Suspensions per second of the queues at `priority` while the measuring process ran (its
    warm-up included), from the daemon's queue rows read when it started and ended."""
    if not queues or len(queues) != 2 or any(not q or "list" not in q for q in queues):
        return None
    total = [sum(r["preemptions"] for r in q["list"] if r["logical_priority"] == priority) for q in queues]
    dt = queues[1]["t"] - queues[0]["t"]
    return (total[1] - total[0]) / dt if dt > 0 else None


def window_rate(train, t0, t1):
    """Training steps/s inside [t0, t1], from the step completion times."""
    ends, idx = train.get("step_end") or [], train.get("step_index") or []
    inside = [(t, k) for t, k in zip(ends, idx) if t0 <= t <= t1]
    if len(inside) < 2:
        return None
    return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])


def summarize(runs, alone):
    """Adds normalized metrics and goal checks to every shared run."""
    rows = []
    train_alone = alone.get("train")
    # The training alone is measured before and after the shared runs (the GPU's speed drifts by
    # a few per cent within a run); shared runs are normalized to the mean of the two.
    rates = [window_rate(t, t["t_ready"], t["t_stop"]) for t in (train_alone, alone.get("train_after"))
             if t and "step_end" in t]
    rates = [r for r in rates if r]
    train_ref = sum(rates) / len(rates) if rates else None
    for r in runs:
        res = r["results"]
        m = res.get(r["measuring"], {})
        ref = alone.get(r["measuring"], {})
        mode = {"alone": f"alone ({r['measuring']})", ALONE_AFTER: f"alone again ({r['measuring']})"}.get(
            r["mode"], r["mode"])
        row = {"group": r["group"], "mode": mode, "measuring": r["measuring"]}
        trainer = res.get("train", {})
        if trainer.get("shim_report"):
            row["shim_report"] = trainer["shim_report"]
        if "latency" in m:
            row.update({"p50_ms": m["latency"]["p50_ms"], "p99_ms": m["latency"]["p99_ms"],
                        "p999_ms": m["latency"]["p999_ms"], "mean_ms": m["latency"]["mean_ms"],
                        "count": m["latency"]["count"], "u": m.get("u")})
            row.update({"svc_p50_ms": m["service"]["p50_ms"], "svc_p99_ms": m["service"]["p99_ms"]})
            if "latency" in ref:
                row["p50_x"] = m["latency"]["p50_ms"] / ref["latency"]["p50_ms"]
                row["p99_x"] = m["latency"]["p99_ms"] / ref["latency"]["p99_ms"]
                row["p99_x_ci95"] = ratio_interval(m.get("latencies_ms") or [], ref.get("latencies_ms") or [])
                row["svc_p50_x"] = m["service"]["p50_ms"] / ref["service"]["p50_ms"]
                row["svc_p99_x"] = m["service"]["p99_ms"] / ref["service"]["p99_ms"]
                row["u_alone"] = ref.get("u")
                row["outputs_equal_alone"] = m.get("output_sha256") == ref.get("output_sha256")
        elif "steps_per_s_after_warmup" in m and "step_end" in m:
            row["train_steps_per_s"] = rate = window_rate(m, m["t_ready"], m["t_stop"])
            if rate and train_ref:
                row["train_x"] = rate / train_ref
            if r["mode"] not in ("alone", ALONE_AFTER):
                row["weights_equal_alone"] = (train_alone or {}).get("weights_sha256") == m.get("weights_sha256")
        if "medium" in res and r["measuring"] != "medium" and "latency" in res["medium"]:
            med, mref = res["medium"], alone.get("medium", {})
            row["medium_p99_ms"] = med["latency"]["p99_ms"]
            if "latency" in mref:
                row["medium_p99_x"] = med["latency"]["p99_ms"] / mref["latency"]["p99_ms"]
                row["u_medium_alone"] = mref.get("u")
        tr = res.get("train")
        if tr and "step_end" in tr and "t_start" in m and r["measuring"] != "train":
            rate = window_rate(tr, m["t_start"], m["t_end"])
            row["train_steps_per_s"] = rate
            if rate and train_ref:
                row["train_x"] = rate / train_ref
            row["weights_equal_alone"] = (train_alone or {}).get("weights_sha256") == tr.get("weights_sha256")
            row["train_loss_at_check"] = tr.get("loss_at_check")
        rate = preemptions_per_s(r.get("queues"), PRIORITY["low"])
        if rate is not None:
            row["low_preemptions_per_s"] = rate
        if "p99_x" in row and "train_x" in row and row.get("u_alone") is not None:
            row["goal_latency"] = row["p99_x"] <= 1.2
            row["goal_latency_service"] = row["svc_p99_x"] <= 1.2
            # The training's fair share is what every higher process leaves of the GPU.
            u_above = row["u_alone"] + (row.get("u_medium_alone") or 0.0)
            row["goal_train"] = row["train_x"] >= 0.9 * (1 - u_above)
            row["goal"] = row["goal_latency"] and row["goal_train"]
        rows.append(row)
    return rows


def fmt(v, spec=".2f"):
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "**no**"
    return format(v, spec)


def fmt_interval(v):
    return "–" if not v else f"{v[0]:.2f}–{v[1]:.2f}"


def markdown(rows, meta):
    out = [f"# PyTorch pairs: {meta['device']} ({meta['date']})", "",
           f"Command: `{meta['command']}`", "",
           f"torch {meta.get('torch')}, window {meta['duration']} s per scenario, inference target u "
           f"{meta['util']}, training {meta['train_model']} batch {meta['train_batch']}.", "",
           "Latency counts from the request's (Poisson) arrival, so queueing behind slow requests counts;"
           " service = request start to completion. Goals (issue 10): p99 ≤ 1.2× alone, training ≥ 0.9 × (1 − u) of alone"
           " (u: the inference's, plus the medium's in the trio). Training alone: the mean of its windows"
           " before and after the shared runs. p99/alone 95 %: a bootstrap interval (both runs' requests"
           " resampled); in the alone row, how far a second alone window could land.", "",
           "| group | mode | p50 ms | p99 ms | p50/alone | p99/alone | p99/alone 95 % | service p50 ms | service p99 ms "
           "| service p99/alone | train steps/s | train/alone | u (alone) | goal p99 | goal service p99 "
           "| goal train | weights = alone | outputs = alone | medium p99/alone | training stopped /s |",
           "|" + "---|" * 20]
    for r in rows:
        out.append("| " + " | ".join([
            r["group"], r["mode"], fmt(r.get("p50_ms"), ".2f"), fmt(r.get("p99_ms"), ".2f"),
            fmt(r.get("p50_x")), fmt(r.get("p99_x")), fmt_interval(r.get("p99_x_ci95")), fmt(r.get("svc_p50_ms"), ".2f"),
            fmt(r.get("svc_p99_ms"), ".2f"), fmt(r.get("svc_p99_x")), fmt(r.get("train_steps_per_s"), ".3f"),
            fmt(r.get("train_x")), fmt(r.get("u_alone", r.get("u")), ".3f"), fmt(r.get("goal_latency")),
            fmt(r.get("goal_latency_service")), fmt(r.get("goal_train")), fmt(r.get("weights_equal_alone")),
            fmt(r.get("outputs_equal_alone")), fmt(r.get("medium_p99_x")),
            fmt(r.get("low_preemptions_per_s"), ".0f")]) + " |")
    reports = [(r, line) for r in rows for line in r.get("shim_report", [])]
    if reports:
        out += ["", "The shim's exit reports (`XPREEMPT_SHIM_LOG=1`):", ""]
        out += [f"- {r['group']} {r['mode']} ({r['measuring']}): {line}" for r, line in reports]
    return "\n".join(out) + "\n"


def plot(runs, alone_runs, out_dir):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plots", flush=True)
        return []
    files = []
    for group in sorted({r["group"] for r in runs if r["measuring"] != "train"}):
        fig, axes = plt.subplots(1, 2, figsize=(13, 5), sharey=True)
        series = [("alone", a) for a in alone_runs if a["group"] == group and a["measuring"] != "train"]
        series += [(r["mode"], r) for r in runs if r["group"] == group]
        for ax, key, what in ((axes[0], "latencies_ms", "latency from arrival"),
                              (axes[1], "services_ms", "service time (start to done)")):
            for label, r in series:
                lat = r["results"].get(r["measuring"], {}).get(key)
                if not lat:
                    continue
                lat = sorted(lat)
                ax.plot(lat, [(i + 1) / len(lat) for i in range(len(lat))], label=label)
            ax.set_xscale("log")
            ax.set_xlabel(f"request {what} (ms)")
            ax.set_title(f"{group}: high-priority inference, {what}")
            ax.grid(True, which="both", alpha=0.3)
        axes[0].set_ylabel("fraction of requests")
        axes[1].legend()
        path = os.path.join(out_dir, f"cdf-{group}.png")
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        files.append(path)
    return files


def strip(result):
    """A run's results without the per-request and per-step lists (they stay in raw/)."""
    return {k: {f: v for f, v in r.items() if f not in ("latencies_ms", "services_ms", "step_end", "step_index")}
            for k, r in result.items()}
