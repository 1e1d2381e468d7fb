//! `xpreempt run`: the program runs with the shim preloaded and xpreempt's settings, finds the
//! daemon (or says there is none), and its exit status and signals come back unchanged.

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

const SHOW_ENV: &str = r#"echo "$XPREEMPT_INTERCEPT $XPREEMPT_PRIORITY $XPREEMPT_LEVEL ${CUDA_MPS_PIPE_DIRECTORY:-none}"; echo "$LD_PRELOAD""#;

fn dir(test: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("xpreempt-run-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A stand-in shim (an empty shared library): what `run` does with the environment is under
/// test here, not the shim, which this crate does not build. Built once: the tests run on
/// parallel threads of one process.
fn shim() -> PathBuf {
    static SHIM: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    SHIM.get_or_init(|| {
        let dir = dir("shim");
        let so = dir.join("libxpreempt_shim.so");
        let src = dir.join("empty.c");
        std::fs::write(&src, "int xpreempt_test_shim;\n").unwrap();
        let st = Command::new("gcc")
            .args(["-shared", "-fPIC", "-o"])
            .arg(&so)
            .arg(&src)
            .status()
            .unwrap();
        assert!(st.success());
        so
    })
    .clone()
}

fn run(socket: &Path, args: &[&str]) -> Output {
    let mut shim_arg = vec!["--shim".to_string(), shim().display().to_string()];
    if args.contains(&"--shim") {
        shim_arg.clear();
    }
    Command::new(env!("CARGO_BIN_EXE_xpreempt"))
        .arg("run")
        .arg("--socket")
        .arg(socket)
        .args(shim_arg)
        .args(args)
        .env_remove("LD_PRELOAD")
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

struct Daemon(Child);

impl Daemon {
    fn start(socket: &Path) -> Self {
        let child = Command::new(env!("CARGO_BIN_EXE_xpreempt"))
            .args(["daemon", "--socket"])
            .arg(socket)
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::os::unix::net::UnixStream::connect(socket).is_err() {
            assert!(Instant::now() < deadline, "the daemon did not come up");
            std::thread::sleep(Duration::from_millis(20));
        }
        Self(child)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn without_a_daemon_the_program_runs_locally_with_the_shim_and_its_status_comes_back() {
    let d = dir("local");
    let out = run(
        &d.join("none.sock"),
        &[
            "--priority",
            "5",
            "--",
            "sh",
            "-c",
            &format!("{SHOW_ENV}; exit 7"),
        ],
    );
    assert_eq!(out.status.code(), Some(7), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let mut lines = stdout.lines();
    assert_eq!(lines.next(), Some("1 5 3 none"), "time-sliced: Lv3");
    let preload = lines.next().unwrap();
    assert!(preload.ends_with("/libxpreempt_shim.so"), "{preload}");
    assert!(Path::new(preload).is_absolute());
    let expected = if xpreempt_cuda::driver_present() {
        "no daemon"
    } else {
        "nothing will be intercepted: no CUDA driver found"
    };
    assert!(
        text(&out.stderr).contains(expected),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn with_a_daemon_the_program_is_pointed_at_it() {
    let d = dir("daemon");
    let socket = d.join("xpreempt.sock");
    let _daemon = Daemon::start(&socket);
    let out = run(&socket, &["--level", "1", "--", "sh", "-c", SHOW_ENV]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).starts_with("1 0 1 none"),
        "{}",
        text(&out.stdout)
    );
    // Without a CUDA driver nothing can be intercepted, and it says so instead.
    let expected = if xpreempt_cuda::driver_present() {
        "scheduling through the daemon"
    } else {
        "nothing will be intercepted: no CUDA driver found"
    };
    assert!(
        text(&out.stderr).contains(expected),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn signals_and_launch_failures_are_reported_like_a_shell_would() {
    let d = dir("status");
    let socket = d.join("none.sock");
    let out = run(&socket, &["-q", "--", "sh", "-c", "kill -TERM $$"]);
    assert_eq!(out.status.signal(), Some(libc_sigterm()));
    assert!(out.stderr.is_empty(), "--quiet: {}", text(&out.stderr));
    let out = run(&socket, &["--", "/no/such/program"]);
    assert_eq!(out.status.code(), Some(127));
    assert!(text(&out.stderr).contains("could not run /no/such/program"));
    let out = run(&socket, &["--shim", "/no/such/shim.so", "--", "true"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("the shim /no/such/shim.so is missing"));
}

fn libc_sigterm() -> i32 {
    15
}

/// SIGSTOP (or SIGCONT) to the daemon.
fn signal(d: &Daemon, sig: i32) {
    let st = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(d.0.id().to_string())
        .status()
        .unwrap();
    assert!(st.success());
    // A stop takes effect when the kernel next schedules the daemon's threads.
    std::thread::sleep(Duration::from_millis(50));
}

#[test]
fn a_stopped_daemon_does_not_delay_the_program_and_operator_commands_time_out() {
    let d = dir("stopped");
    let socket = d.join("xpreempt.sock");
    let daemon = Daemon::start(&socket);
    signal(&daemon, 19); // SIGSTOP
    // The program prints when it starts; `run` is timed from its own start to that line.
    let t = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_xpreempt"))
        .arg("run")
        .arg("--socket")
        .arg(&socket)
        .arg("--shim")
        .arg(shim())
        .args(["--", "echo", "started"])
        .env_remove("LD_PRELOAD")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let reader = std::thread::spawn(move || {
        std::io::BufRead::read_line(&mut out, &mut line).unwrap();
        (line, t.elapsed())
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while !reader.is_finished() {
        if Instant::now() > deadline {
            let _ = child.kill();
            signal(&daemon, 18);
            panic!("the program did not start while the daemon was stopped");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let (line, took) = reader.join().unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(line.trim(), "started");
    eprintln!("the program started {took:?} after `run` did");
    assert!(took < Duration::from_millis(600), "{took:?}");
    // Where no CUDA driver loads, `run` says only that nothing will be intercepted (a note about
    // the daemon would read as if the program were scheduled); it looked for the daemon all the
    // same, within the same bound.
    let said = text(&out.stderr);
    assert!(
        said.contains("did not answer within 100 ms")
            || said.contains("nothing will be intercepted"),
        "{said}"
    );
    // An operator command fails with a clear message rather than hanging.
    let t = Instant::now();
    let list = Command::new(env!("CARGO_BIN_EXE_xpreempt"))
        .args(["list", "--socket"])
        .arg(&socket)
        .output()
        .unwrap();
    assert!(!list.status.success());
    assert!(
        text(&list.stderr).contains("did not answer within"),
        "{}",
        text(&list.stderr)
    );
    assert!(t.elapsed() < Duration::from_secs(8), "{:?}", t.elapsed());
    signal(&daemon, 18); // SIGCONT
}
