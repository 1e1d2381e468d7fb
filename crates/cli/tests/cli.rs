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
fn the_help_lists_what_users_run_and_no_benchmark() {
    let o = xpreempt(&["--help"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let help = String::from_utf8_lossy(&o.stdout);
    let commands: Vec<&str> = help
        .split("Commands:")
        .nth(1)
        .expect("a command list")
        .split("Options:")
        .next()
        .unwrap()
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    for user in [
        "run",
        "daemon",
        "list",
        "top",
        "set-priority",
        "stats",
        "policy",
        "sim",
        "demo",
    ] {
        assert!(commands.contains(&user), "{user} missing: {commands:?}");
    }
    assert!(
        commands.iter().all(|c| !c.contains("bench")),
        "a benchmark in the user's help: {commands:?}"
    );
    // The benchmarks are another binary: this one does not know them.
    for gone in ["bench", "bench-daemon", "bench-request", "bench-client"] {
        let o = xpreempt(&[gone, "--help"]);
        assert!(!o.status.success(), "`xpreempt {gone}` still runs");
    }
}

/// Runs xpreempt with its stdout a pipe whose reader has already gone, as under `… | head`
/// once head has read its lines.
fn into_closed_pipe(args: &[&str]) -> Output {
    use std::os::fd::{FromRawFd, OwnedFd};
    let mut fds = [0; 2];
    // SAFETY: pipe(2) fills the two-element array it is given.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: both descriptors were just created and are owned here alone.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    drop(read);
    Command::new(env!("CARGO_BIN_EXE_xpreempt"))
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .stdout(std::process::Stdio::from(write))
        .output()
        .expect("run xpreempt")
}

#[test]
fn a_closed_pipe_ends_the_program_quietly() {
    for args in [
        &["version"][..],
        &["--json", "version"][..],
        &["sim", "--modes", "lv1"][..],
        &["--json", "demo"][..],
    ] {
        let o = into_closed_pipe(args);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}", stderr(&o));
        assert!(o.stderr.is_empty(), "{args:?}: {}", stderr(&o));
    }
}
