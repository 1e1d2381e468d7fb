//! `xpreempt sim` as a user runs it: the built-in scenario from any directory, the JSON shape,
//! byte-identical repeats, traces, and clear errors for bad scenario files.

use std::process::{Command, Output};

fn xpreempt_in(dir: &std::path::Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xpreempt"))
        .args(args)
        .current_dir(dir)
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("run xpreempt")
}

fn tmp(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("xpreempt-sim-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

#[test]
fn sim_json_has_the_promised_shape_and_repeats_byte_for_byte() {
    let dir = tmp("json");
    let a = xpreempt_in(&dir, &["--json", "sim"]);
    assert!(a.status.success(), "{}", String::from_utf8_lossy(&a.stderr));
    let b = xpreempt_in(&dir, &["sim", "--json"]);
    assert_eq!(a.stdout, b.stdout, "same scenario and seed, same bytes");
    let v: serde_json::Value = serde_json::from_slice(&a.stdout).unwrap();
    assert_eq!(v["scenario"], "train-vs-infer");
    let modes = v["modes"].as_array().unwrap();
    let names: Vec<&str> = modes.iter().map(|m| m["mode"].as_str().unwrap()).collect();
    assert_eq!(names, ["none", "lv1", "scheme-a", "lv2", "lv3"]);
    for m in modes {
        let mut keys: Vec<&str> = m.as_object().unwrap().keys().map(|k| k.as_str()).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "displacements",
                "exactly_once",
                "gpu_utilization",
                "hqd_wait_us",
                "kernels",
                "kernels_per_s",
                "latency_ratio",
                "makespan_us",
                "maps",
                "max_hqd_wait_us",
                "mode",
                "preempt_latency_us",
                "preemptions",
                "problems",
                "resumes",
                "rotations",
                "runlists",
                "tasks",
                "tiers",
                "unmaps",
                "yields"
            ]
        );
        assert!(
            m["preempt_latency_us"].get("p50").is_some()
                && m["preempt_latency_us"].get("p99").is_some()
        );
        assert_eq!(m["exactly_once"], true);
        assert_eq!(m["problems"], serde_json::json!([]));
        for t in m["tasks"].as_array().unwrap() {
            assert!(t["name"].is_string() && t["priority"].is_i64() && t["latency_us"].is_f64());
            assert!(
                t["hqd"]["maps"].is_u64() && t["hqd"]["hqd_wait_ns"].is_u64(),
                "{t}"
            );
            let p = &t["latency_pct_us"];
            let v = |k: &str| p[k].as_f64().unwrap();
            assert!(v("p50") <= v("p90") && v("p90") <= v("p99") && v("p99") <= v("max"));
            assert_eq!(v("max"), t["max_latency_us"].as_f64().unwrap());
        }
        let tiers: Vec<i64> = m["tiers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["priority"].as_i64().unwrap())
            .collect();
        assert_eq!(tiers, [12, 3], "highest priority first");
        assert_eq!(m["kernels"], 150);
        let util = m["gpu_utilization"].as_f64().unwrap();
        assert!(util > 0.5 && util <= 1.0, "{util}");
        let makespan = m["makespan_us"].as_f64().unwrap();
        let kps = m["kernels_per_s"].as_f64().unwrap();
        assert!(
            (kps - 150.0 / (makespan / 1e6)).abs() < 1.0,
            "{kps} {makespan}"
        );
        assert!(m["runlists"].as_u64().unwrap() >= 1 && m["maps"].as_u64().unwrap() >= 2);
    }
    let lv3 = modes.iter().find(|m| m["mode"] == "lv3").unwrap();
    assert!(lv3["latency_ratio"].as_f64().unwrap() > 3.0);
}

#[test]
fn sim_table_and_trace() {
    let dir = tmp("trace");
    let trace = dir.join("t.json");
    let o = xpreempt_in(&dir, &["sim", "--trace", trace.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let table = String::from_utf8_lossy(&o.stdout);
    for m in ["none", "lv1", "scheme-a", "lv2", "lv3"] {
        assert!(table.lines().any(|l| l.starts_with(m)), "{table}");
    }
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&trace).unwrap()).unwrap();
    let ev = doc["traceEvents"].as_array().unwrap();
    let pids: std::collections::BTreeSet<u64> =
        ev.iter().filter_map(|e| e["pid"].as_u64()).collect();
    assert_eq!(pids.len(), 5, "one process per mode");
    assert!(ev.iter().any(|e| e["ph"] == "i" && e["name"] == "preempt"));
    assert!(
        ev.iter()
            .any(|e| e["ph"] == "i" && e["name"] == "hw-preempt")
    );
    assert!(ev.iter().any(|e| e["ph"] == "i" && e["name"] == "arrival"));
}

#[test]
fn bad_scenarios_get_a_clear_error() {
    let dir = tmp("bad");
    let o = xpreempt_in(&dir, &["sim", "missing.toml"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("missing.toml"));
    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "name = \"x\"\n[[tasks]]\nname = \"a\"\npriority = 1\nkernels = 0\nkernel = { workgroups = 1, wg_us = 1.0 }\n").unwrap();
    let o = xpreempt_in(&dir, &["sim", bad.to_str().unwrap()]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("kernels") && err.contains("task `a`"), "{err}");
    let o = xpreempt_in(&dir, &["sim", "--policy", "lottery"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("lottery"));
}

#[test]
fn a_toml_error_prints_once() {
    let dir = tmp("toml-once");
    let bad = dir.join("unclosed.toml");
    std::fs::write(&bad, "name = \"x\"\nseed = [\n").unwrap();
    let o = xpreempt_in(&dir, &["sim", bad.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_eq!(err.matches("unclosed array").count(), 1, "{err}");
    assert_eq!(err.matches("TOML parse error").count(), 1, "{err}");
    let o = xpreempt_in(&dir, &["--json", "sim", bad.to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("one JSON object");
    let msg = v["error"].as_str().unwrap();
    assert_eq!(msg.matches("unclosed array").count(), 1, "{msg}");
    // A scenario the model refuses names its cause once too.
    let wrong = dir.join("wrong-type.toml");
    std::fs::write(&wrong, "name = \"x\"\nseed = \"a\"\n").unwrap();
    let o = xpreempt_in(&dir, &["sim", wrong.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.matches("invalid type").count(), 1, "{err}");
}

#[test]
fn a_scenario_past_the_models_clock_is_an_error_not_a_panic() {
    let dir = tmp("limits");
    let bad = dir.join("overflow.toml");
    std::fs::write(&bad, "name = \"x\"\n[[tasks]]\nname = \"a\"\npriority = 1\nkernels = 1\nkernel = { workgroups = 1, wg_us = 1.0 }\narrival = { at_us = 1e16, count = 2, every_us = 1e16 }\n").unwrap();
    let o = xpreempt_in(&dir, &["sim", bad.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(
        err.contains("overflow.toml")
            && err.contains("task `a` arrival.at_us")
            && err.contains("2^62 ns"),
        "{err}"
    );
}

#[test]
fn bench_reports_workgroups_per_second() {
    let dir = tmp("bench");
    let o = xpreempt_in(&dir, &["--json", "sim", "--bench"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v["total_workgroups_per_s"].as_f64().unwrap() > 0.0);
    assert_eq!(v["modes"].as_array().unwrap().len(), 5);
}

/// Scheme A drains with a 100 µs unmap fence while 3 ms workgroups run: the HWS hangs.
const HANG: &str = "name = \"hang\"\n[gpu]\nunmap_timeout_us = 100.0\n\
    [scheme_a]\ncheck_interval_us = 1000.0\nmode = \"drain\"\n\
    [[tasks]]\nname = \"train\"\npriority = 1\nkernels = 4\n\
    kernel = { workgroups = 2560, wg_us = 3000.0 }\n\
    [[tasks]]\nname = \"infer\"\npriority = 9\nkernels = 2\n\
    kernel = { workgroups = 10, wg_us = 100.0 }\narrival = { at_us = 500.0 }\n";

#[test]
fn a_mode_that_fails_its_checks_fails_the_command() {
    let dir = tmp("fails");
    let file = dir.join("hang.toml");
    std::fs::write(&file, HANG).unwrap();
    let o = xpreempt_in(&dir, &["--log", "off", "sim", file.to_str().unwrap()]);
    let (table, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert_eq!(o.status.code(), Some(3), "{table}\n{err}");
    assert!(err.contains("scheme-a") && err.contains("hung"), "{err}");
    assert!(
        table.contains("PROBLEM scheme-a: work still outstanding"),
        "{table}"
    );
    // The task that completed nothing shows no latency rather than 0.000.
    let train = table.lines().find(|l| l.starts_with("scheme-a")).unwrap();
    assert!(!train.contains("0.000") && train.contains(" - "), "{train}");
    let o = xpreempt_in(
        &dir,
        &["--log", "off", "--json", "sim", file.to_str().unwrap()],
    );
    assert_eq!(o.status.code(), Some(3));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("one JSON object");
    let a = v["modes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["mode"] == "scheme-a")
        .unwrap();
    assert_eq!(a["exactly_once"], false);
    assert!(a["problems"].as_array().unwrap().len() >= 3, "{a}");
    assert!(a["tasks"][0]["latency_us"].is_null(), "{a}");
    let none = &v["modes"][0];
    assert_eq!(none["problems"], serde_json::json!([]));
}

#[test]
fn arguments_are_checked_before_simulating() {
    let dir = tmp("args");
    let missing = dir.join("no-such-dir").join("t.json");
    for (args, needle) in [
        (
            vec!["sim", "--trace", missing.to_str().unwrap()],
            "creating trace file",
        ),
        (
            vec!["sim", "--base-policy", "fifo"],
            "--base-policy only applies",
        ),
        (
            vec!["sim", "--policy", "rr", "--base-policy", "fifo"],
            "--base-policy only applies",
        ),
        (vec!["sim", "--policy", "lottery"], "--policy lottery"),
        (vec!["sim", "--policy", "missing.o"], "missing.o"),
        (vec!["sim", "--bench", "--trace", "t.json"], "--trace"),
        (
            vec!["sim", "--svg", missing.to_str().unwrap()],
            "creating SVG file",
        ),
        // The trace's path is fine; it is removed again when the SVG's is not.
        (
            vec![
                "sim",
                "--trace",
                "t.json",
                "--timeline-svg",
                missing.to_str().unwrap(),
            ],
            "creating timeline SVG file",
        ),
        (vec!["sim", "--seeds", "2", "--svg", "c.svg"], "--svg"),
    ] {
        let t0 = std::time::Instant::now();
        let o = xpreempt_in(&dir, &args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?} succeeded");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(o.stdout.is_empty(), "{args:?} printed a result");
        // A full run takes a good part of a second even in release; checks take nothing.
        assert!(t0.elapsed().as_millis() < 2_000, "{args:?} simulated first");
    }
    assert!(!missing.exists() && !dir.join("t.json").exists());
    assert!(!dir.join("c.svg").exists());
}

#[test]
fn svg_plots_are_written_next_to_an_unchanged_table() {
    let dir = tmp("svg");
    let plain = xpreempt_in(&dir, &["sim"]);
    let o = xpreempt_in(
        &dir,
        &["sim", "--svg", "cdf.svg", "--timeline-svg", "timeline.svg"],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(o.stdout, plain.stdout, "plots change nothing in the table");
    let cdf = std::fs::read_to_string(dir.join("cdf.svg")).unwrap();
    assert!(cdf.starts_with("<svg") && cdf.trim_end().ends_with("</svg>"));
    assert_eq!(cdf.matches("<path class=\"cdf\"").count(), 5, "{cdf}");
    let tl = std::fs::read_to_string(dir.join("timeline.svg")).unwrap();
    assert!(tl.contains("which queue ran when") && tl.contains("class=\"preempt\""));
    // Deterministic like the table: the same bytes again.
    let again = xpreempt_in(&dir, &["sim", "--modes", "lv3", "--svg", "one.svg"]);
    assert!(again.status.success());
    let one = std::fs::read_to_string(dir.join("one.svg")).unwrap();
    assert_eq!(one.matches("<path class=\"cdf\"").count(), 1);
    let twice = xpreempt_in(&dir, &["sim", "--modes", "lv3", "--svg", "two.svg"]);
    assert!(twice.status.success());
    assert_eq!(one, std::fs::read_to_string(dir.join("two.svg")).unwrap());
}

#[test]
fn errors_under_json_are_one_json_object_on_stdout() {
    let dir = tmp("json-errors");
    for (args, needle, code) in [
        (vec!["--json", "sim", "--policy", "lottery"], "lottery", 1),
        (
            vec!["sim", "--json", "--base-policy", "fifo"],
            "--base-policy",
            1,
        ),
        (vec!["--json", "sim", "missing.toml"], "missing.toml", 1),
        (vec!["--json", "sim", "--no-such-flag"], "--no-such-flag", 2),
        (
            vec!["--json", "demo", "--batch", "0"],
            "batch must be at least 1",
            1,
        ),
    ] {
        let o = xpreempt_in(&dir, &args);
        assert_eq!(o.status.code(), Some(code), "{args:?}");
        let v: serde_json::Value = serde_json::from_slice(&o.stdout)
            .unwrap_or_else(|e| panic!("{args:?}: {e}: {}", String::from_utf8_lossy(&o.stdout)));
        let msg = v["error"].as_str().expect("an error string");
        assert!(msg.contains(needle), "{args:?}: {msg}");
    }
    // The whole chain, not only the outermost context.
    let o = xpreempt_in(&dir, &["--json", "sim", "missing.toml"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let msg = v["error"].as_str().unwrap();
    assert!(msg.contains("reading scenario missing.toml: "), "{msg}");
}

/// Train and a Poisson-arriving inference service, small enough for a debug build.
const SMALL: &str = "name = \"small\"\nseed = 5\n\
    [[tasks]]\nname = \"train\"\npriority = 1\nkernels = 8\n\
    kernel = { workgroups = 2560, wg_us = 300.0, jitter = 0.1 }\n\
    [[tasks]]\nname = \"serve\"\npriority = 9\nkernels = 3\n\
    kernel = { workgroups = 80, wg_us = 100.0, jitter = 0.2 }\n\
    arrival = { at_us = 200.0, count = 5, every_us = 1500.0, poisson = true }\n";

#[test]
fn a_seed_sweep_reports_the_spread_per_mode() {
    let dir = tmp("sweep");
    let file = dir.join("small.toml");
    std::fs::write(&file, SMALL).unwrap();
    let f = file.to_str().unwrap();
    let o = xpreempt_in(
        &dir,
        &["--json", "sim", f, "--seeds", "3", "--modes", "none,lv3"],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["seeds"], serde_json::json!([5, 6, 7]));
    let modes = v["modes"].as_array().unwrap();
    assert_eq!(modes.len(), 2);
    for m in modes {
        assert_eq!(m["per_seed"].as_array().unwrap().len(), 3);
        assert_eq!(m["failed_seeds"], serde_json::json!([]));
        for key in ["top_p99_vs_alone", "makespan_us"] {
            let s = &m[key];
            let x = |k: &str| s[k].as_f64().unwrap();
            assert!(x("min") <= x("median") && x("median") <= x("max"), "{m}");
        }
    }
    let ratio = |i: usize| modes[i]["top_p99_vs_alone"]["median"].as_f64().unwrap();
    assert!(
        ratio(1) < ratio(0),
        "lv3 protects the top tier's tail better than none"
    );
    // --seed moves the window; the table has one line per mode.
    let o = xpreempt_in(
        &dir,
        &["sim", f, "--seeds", "2", "--seed", "40", "--modes", "lv1"],
    );
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && table.contains("2 seeds (40..=41)"),
        "{table}"
    );
    assert_eq!(
        table.lines().filter(|l| l.starts_with("lv1")).count(),
        1,
        "{table}"
    );
}

#[test]
fn modes_are_chosen_by_name_and_checked() {
    let dir = tmp("modes");
    let o = xpreempt_in(&dir, &["--json", "sim", "--modes", "lv3,scheme-a"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let names: Vec<&str> = v["modes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["mode"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["lv3", "scheme-a"]);
    let o = xpreempt_in(&dir, &["sim", "--modes", "lv1,lv4"]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("unknown mode `lv4`") && err.contains("scheme-a"),
        "{err}"
    );
    let o = xpreempt_in(&dir, &["sim", "--seeds", "0"]);
    assert_eq!(o.status.code(), Some(2), "zero seeds is not a sweep");
}

/// An eBPF policy from a chosen state directory: the table and JSON show the priority it set.
#[test]
fn sim_shows_the_priorities_an_ebpf_policy_put_in_effect_and_takes_a_state_dir() {
    let dir = tmp("state-dir");
    let object = xpreempt_bpf::built_object("lcbe").expect("clang built the example policies");
    let state = dir.join("state");
    let st = state.to_str().unwrap();
    // Pinned in the chosen directory: train (queue 0) is best-effort whatever its priority.
    for args in [
        vec![
            "policy",
            "--state-dir",
            st,
            "load",
            object.to_str().unwrap(),
        ],
        vec![
            "policy",
            "--state-dir",
            st,
            "map",
            "set",
            "task_type_map",
            "0",
            "0",
        ],
    ] {
        let o = xpreempt_in(&dir, &args);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let o = xpreempt_in(
        &dir,
        &[
            "--json",
            "sim",
            "--policy",
            object.to_str().unwrap(),
            "--state-dir",
            state.to_str().unwrap(),
            "--modes",
            "lv3",
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stdout));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let tasks = v["modes"][0]["tasks"].as_array().unwrap();
    let infer = tasks.iter().find(|t| t["name"] == "infer").unwrap();
    assert_eq!(infer["priority"], 12);
    assert_eq!(infer["effective_priority"], 1012, "{infer}");
    let train = tasks.iter().find(|t| t["name"] == "train").unwrap();
    assert!(
        train.get("effective_priority").is_none(),
        "the pinned map made train BE at its own priority: {train}"
    );
    // The given directory was used (and made private), not the default one.
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&state).unwrap().permissions().mode() & 0o777,
        0o700
    );
    let table = xpreempt_in(
        &dir,
        &[
            "sim",
            "--policy",
            object.to_str().unwrap(),
            "--state-dir",
            state.to_str().unwrap(),
            "--modes",
            "lv3",
        ],
    );
    assert!(String::from_utf8_lossy(&table.stdout).contains("12>1012"));
    let without_policy = xpreempt_in(&dir, &["sim", "--state-dir", state.to_str().unwrap()]);
    assert_eq!(without_policy.status.code(), Some(2));
}
