//! The binary as a user runs it: tables, JSON, and clear errors for bad input.

use std::process::{Command, Output};

fn xpreempt(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xpreempt"))
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("run xpreempt")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn version_prints_as_text_and_json() {
    let o = xpreempt(&["version"]);
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("xpreempt "));
    let o = xpreempt(&["--json", "version"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["name"], "xpreempt");
    assert_eq!(v["policies"].as_array().unwrap().len(), 6);
}

#[test]
fn the_demo_shows_preemption_paying_off_at_every_level() {
    let o = xpreempt(&["demo", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let modes = v["modes"].as_array().unwrap();
    let latency = |m: &str| {
        modes.iter().find(|x| x["mode"] == m).unwrap()["lc_latency_us"]
            .as_f64()
            .unwrap()
    };
    assert!(latency("lv1") < latency("none") / 5.0);
    assert!(latency("lv2") < latency("lv1"));
    assert!(latency("lv3") <= latency("lv2"));
    assert!(modes.iter().all(|m| m["exactly_once"] == true));
}

#[test]
fn bad_input_gets_a_clear_error() {
    for (args, needle) in [
        (&["demo", "--batch", "0"][..], "batch must be at least 1"),
        (
            &["demo", "--threshold", "0"][..],
            "threshold must be at least 1",
        ),
        (
            &["demo", "--threshold", "4", "--batch", "8"][..],
            "batch 8 is larger than threshold 4",
        ),
        (
            &["demo", "--policy", "lottery"][..],
            "unknown policy `lottery`; known policies: hpf",
        ),
        (
            &["bench-request", "--paths", "native,gpu"][..],
            "unknown path \"gpu\" (known: native, queue",
        ),
        (
            &["bench-request", "--launches", "0"][..],
            "--requests and --launches must be at least 1",
        ),
    ] {
        let o = xpreempt(args);
        assert!(!o.status.success(), "{args:?} succeeded");
        let err = stderr(&o);
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

#[test]
fn a_huge_threshold_does_not_allocate_in_proportion() {
    let o = xpreempt(&["--json", "demo", "--threshold", "1000000000"]);
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn bench_request_runs_every_path_of_the_product() {
    let o = xpreempt(&["--json", "bench-request", "--requests", "30"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let paths = v["paths"].as_array().unwrap();
    let names: Vec<&str> = paths.iter().map(|p| p["path"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "native",
            "queue",
            "local-alone",
            "local",
            "daemon-alone",
            "daemon"
        ]
    );
    for p in paths {
        assert_eq!(p["requests"], 30);
        // Ten 5 µs stand-in kernels one after another: no request is done sooner.
        assert!(p["request_us"]["p50"].as_f64().unwrap() >= 50.0, "{p}");
        let with_be = p["path"] == "local" || p["path"] == "daemon";
        assert_eq!(p["be_not_stopped"].is_number(), with_be, "{p}");
    }
    // In one process the scheduler stops the best-effort queue while the request runs; its
    // preemption thread may get no CPU before a request ends on a loaded machine.
    let local = &paths[3];
    assert!(local["be_not_stopped"].as_u64().unwrap() < 30, "{local}");
    assert!(
        local["be_stop_us"]["p50"].as_f64().unwrap() < local["request_us"]["p50"].as_f64().unwrap()
    );
}
