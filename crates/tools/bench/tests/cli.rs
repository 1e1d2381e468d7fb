//! The `xpreempt-bench` binary as it is run: its command line, and the CPU benchmarks that need
//! no GPU (the GPU ones are in `gpu.rs`, ignored without a device).

use std::process::{Command, Output};

fn bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xpreempt-bench"))
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("run xpreempt-bench")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn the_help_lists_every_benchmark() {
    let o = bench(&["--help"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let help = String::from_utf8_lossy(&o.stdout);
    for cmd in ["info", "latency", "lcbe", "lv3-probe", "daemon", "request"] {
        assert!(
            help.lines().any(|l| l.trim_start().starts_with(cmd)),
            "{cmd} missing: {help}"
        );
    }
    // The internal roles stay out of the list.
    for hidden in ["role", "client", "xpreemptd"] {
        assert!(
            !help.lines().any(|l| l.trim_start().starts_with(hidden)),
            "{hidden} listed: {help}"
        );
    }
}

#[test]
fn bad_input_gets_a_clear_error() {
    for (args, needle) in [
        (
            &["request", "--paths", "native,gpu"][..],
            "unknown path \"gpu\" (known: native, queue",
        ),
        (
            &["request", "--launches", "0"][..],
            "--requests and --launches must be at least 1",
        ),
        (
            &["daemon", "--clients", "1"][..],
            "--clients must be at least 2",
        ),
    ] {
        let o = bench(args);
        assert!(!o.status.success(), "{args:?} succeeded");
        let err = stderr(&o);
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    let o = bench(&["--json", "request", "--launches", "0"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("one JSON object");
    assert!(v["error"].as_str().unwrap().contains("--launches"), "{v}");
}

#[test]
fn a_gpu_benchmark_without_a_gpu_says_so() {
    if std::path::Path::new("/dev/nvidiactl").exists() {
        return;
    }
    let o = bench(&["info"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("no CUDA driver"), "{}", stderr(&o));
}

#[test]
fn bench_request_runs_every_path_of_the_product() {
    let o = bench(&["--json", "request", "--requests", "30"]);
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
