//! Driver-API interception without a GPU: a fake libcuda (tests/fake/libcuda.c) stands in for
//! the driver, and an application (tests/fake/app.c) reaches it as the CUDA runtime does
//! (dlopen, dlsym of cuGetProcAddress_v2, entry points through it). Under the shim its launches
//! go through xpreempt's queues, arrive at the driver in order with the arguments they were made
//! with (even when a random suspension holds them and the application has overwritten its
//! copies), and copies never overtake the launches before them.

use std::path::{Path, PathBuf};
use std::process::Command;

/// One directory per test: tests run in parallel and each builds its own fake driver and app.
fn build_dir(test: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("xpreempt-intercept-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn gcc(args: &[&str]) {
    let st = Command::new("gcc").args(args).status().expect("gcc runs");
    assert!(st.success(), "gcc {args:?}");
}

/// Builds the fake driver and the application once per test.
fn build(dir: &Path) -> (PathBuf, PathBuf) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake");
    let lib = dir.join("libcuda.so.1");
    let app = dir.join("app");
    gcc(&[
        "-shared",
        "-fPIC",
        // Like the real libcuda, the entry points it hands out are its own, not whatever an
        // LD_PRELOAD exports under the same name.
        "-Wl,-Bsymbolic",
        "-O1",
        "-o",
        lib.to_str().unwrap(),
        src.join("libcuda.c").to_str().unwrap(),
        "-lpthread",
    ]);
    gcc(&[
        "-O1",
        "-o",
        app.to_str().unwrap(),
        src.join("app.c").to_str().unwrap(),
        "-ldl",
    ]);
    (lib, app)
}

fn shim() -> PathBuf {
    // The cdylib is built beside the test binary (deps/); `cargo build` also copies it up.
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    let so = deps.join("libxpreempt_shim.so");
    assert!(so.is_file(), "{} (built with the crate)", so.display());
    so
}

struct Run {
    printed: u64,
    log: Vec<String>,
}

fn run(dir: &Path, app: &Path, tag: &str, env: &[(&str, &str)]) -> Run {
    let log = dir.join(format!("{tag}.log"));
    let mut c = Command::new(app);
    c.arg("50")
        .env("LD_LIBRARY_PATH", dir)
        .env("LD_PRELOAD", shim())
        .env("FAKE_CUDA_LOG", &log)
        .env("XPREEMPT_SOCKET", dir.join("no-daemon.sock"))
        .env_remove("XPREEMPT_INTERCEPT");
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().unwrap();
    assert!(
        out.status.success(),
        "{tag}: {:?} {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Run {
        printed: String::from_utf8_lossy(&out.stdout).trim().parse().unwrap(),
        log: std::fs::read_to_string(&log)
            .unwrap()
            .lines()
            .map(String::from)
            .collect(),
    }
}

/// The driver saw launch i with (i, 10 i), copies after launches 9, 19, …, then the sync.
fn check_order(r: &Run) {
    let calls: Vec<&str> = r
        .log
        .iter()
        .map(|l| l.rsplit_once(' ').unwrap().0)
        .filter(|l| !l.starts_with("record"))
        .collect();
    let mut want = Vec::new();
    for i in 0..50 {
        want.push(format!("launch s=10 a={i} b={}", 10 * i));
        if i % 10 == 9 {
            want.push(format!("copy s=10 v={i}"));
        }
    }
    want.push("sync s=10".into());
    assert_eq!(calls, want.iter().map(String::as_str).collect::<Vec<_>>());
}

#[test]
fn launches_go_through_the_queues_in_order_with_their_own_arguments() {
    let dir = build_dir("order");
    let (_, app) = build(&dir);

    let off = run(&dir, &app, "off", &[]);
    assert_eq!(off.printed, 0, "interception is off unless asked for");
    check_order(&off);

    let on = run(&dir, &app, "on", &[("XPREEMPT_INTERCEPT", "1")]);
    assert_eq!(on.printed, 50, "every launch went through a queue");
    check_order(&on);

    // Random suspensions: some launches wait in the buffer and leave from another thread (the
    // completion watcher; the application's thread launches from the buffer too).
    let mut deferred = 0;
    for seed in 1..=4 {
        let r = run(
            &dir,
            &app,
            &format!("chaos{seed}"),
            &[
                ("XPREEMPT_INTERCEPT", "1"),
                ("XPREEMPT_CHAOS", &format!("{seed}:50")),
                ("XPREEMPT_WINDOW", "2"),
            ],
        );
        assert_eq!(r.printed, 50);
        check_order(&r);
        deferred += r
            .log
            .iter()
            .filter(|l| l.starts_with("launch") && l.ends_with("other"))
            .count();
    }
    assert!(
        deferred > 0,
        "no launch was ever held back: the chaos runs did not test buffering"
    );
}

#[test]
fn pass_through_forwards_every_launch_as_made_and_watches_the_stream() {
    let dir = build_dir("pass");
    let (_, app) = build(&dir);
    let r = run(
        &dir,
        &app,
        "pass",
        &[
            ("XPREEMPT_INTERCEPT", "1"),
            ("XPREEMPT_PASS_THROUGH", "1"),
            ("FAKE_APP_LINGER_MS", "300"),
        ],
    );
    assert_eq!(r.printed, 0, "no launch went through a queue");
    check_order(&r);
    assert!(
        r.log
            .iter()
            .filter(|l| l.starts_with("launch"))
            .all(|l| !l.ends_with("other")),
        "every launch left from the application's thread"
    );
    assert!(
        r.log.iter().any(|l| l.starts_with("record s=10")),
        "the observer recorded no event on the stream: the scheduler never heard of its work"
    );
}

#[test]
fn pass_through_watches_a_stream_that_only_copies() {
    let dir = build_dir("pass-copies");
    let (_, app) = build(&dir);
    let r = run(
        &dir,
        &app,
        "pass-copies",
        &[
            ("XPREEMPT_INTERCEPT", "1"),
            ("XPREEMPT_PASS_THROUGH", "1"),
            ("FAKE_APP_COPIES_ONLY", "1"),
            ("FAKE_APP_LINGER_MS", "300"),
        ],
    );
    let copies = r.log.iter().filter(|l| l.starts_with("copy s=10")).count();
    assert_eq!(copies, 50, "every copy reached the driver: {:?}", r.log);
    assert!(
        r.log.iter().any(|l| l.starts_with("record s=10")),
        "the observer recorded no event on the stream: its copies were not seen as work"
    );
}

#[test]
fn a_process_that_never_touches_cuda_is_unchanged() {
    let out = Command::new("sh")
        .args(["-c", "echo ok"])
        .env("LD_PRELOAD", shim())
        .env("XPREEMPT_INTERCEPT", "1")
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ok\n");
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
