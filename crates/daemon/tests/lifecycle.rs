//! The daemon's life as a system service: a start that fails leaves no socket behind; a second
//! daemon on the same socket refuses clearly, even while the first is stopped; SIGTERM and
//! SIGINT remove the socket and stop the MPS control daemon it owns.

mod common;

use common::*;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// `xpreemptd ARGS` on `sock`, run to its end (bounded): its exit code and stderr.
fn run_to_end(sock: &Path, args: &[&str]) -> (Option<i32>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_xpreemptd"))
        .arg("--socket")
        .arg(sock)
        .args(args)
        .env("XPREEMPT_LOG", "warn")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            let mut err = String::new();
            std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
            return (st.code(), err);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("xpreemptd {args:?} did not exit");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_start_that_fails_leaves_no_socket_behind() {
    let sock = socket("failed-start");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().to_string();
    let (code, err) = run_to_end(&sock, &["--metrics", &port]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("metrics listener"), "{err}");
    assert!(!sock.exists(), "a failed start left its socket");
    match xpreempt_ipc::operator::Operator::connect(&sock) {
        Err(e) => assert!(e.to_string().contains("no xpreempt daemon"), "{e}"),
        Ok(_) => panic!("nothing should answer"),
    }
}

#[test]
fn a_second_daemon_on_the_same_socket_refuses_even_while_the_first_is_stopped() {
    let sock = socket("second");
    let first = DaemonProcess::start(&sock, &[]);
    let (code, err) = run_to_end(&sock, &[]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("another xpreemptd serves"), "{err}");
    first.signal(libc::SIGSTOP);
    let t = Instant::now();
    let (code, err) = run_to_end(&sock, &[]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("another xpreemptd serves"), "{err}");
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    first.signal(libc::SIGCONT);
    // The first still serves, on a socket the second did not remove.
    assert!(Operator::connect(&sock).list().is_empty());
}

/// `-d` writes the pid file and serves `quit` on the control FIFO in the background, like
/// `nvidia-cuda-mps-control`; otherwise it passes stdin to the FIFO.
const FAKE_MPS: &str = r#"#!/bin/bash
pipe=$CUDA_MPS_PIPE_DIRECTORY
if [ "$1" = "-d" ]; then
  mkfifo "$pipe/control" || exit 1
  (
    echo $BASHPID > "$pipe/nvidia-cuda-mps-control.pid"
    while true; do
      if read -r cmd < "$pipe/control"; then
        if [ "$cmd" = quit ]; then rm -f "$pipe/control" "$pipe/nvidia-cuda-mps-control.pid"; exit 0; fi
      fi
    done
  ) </dev/null >/dev/null 2>&1 &
  exit 0
fi
cat > "$pipe/control"
"#;

fn alive(pid: i32) -> bool {
    // SAFETY: reaping an adopted child without blocking, then probing with signal 0.
    unsafe {
        libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG);
        libc::kill(pid, 0) == 0
    }
}

#[test]
fn sigterm_and_sigint_remove_the_socket_and_stop_the_owned_mps_daemon() {
    // The fake's loop is orphaned when its parent exits: adopted here, its exit can be seen.
    // SAFETY: prctl on this process.
    assert_eq!(unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1) }, 0);
    for (sig, name) in [(libc::SIGTERM, "term"), (libc::SIGINT, "int")] {
        let sock = socket(&format!("signal-{name}"));
        let dir = sock.parent().unwrap();
        let fake = dir.join("fake-mps-control");
        std::fs::write(&fake, FAKE_MPS).unwrap();
        std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_xpreemptd"))
            .arg("--socket")
            .arg(&sock)
            .arg("--mps")
            .env("XPREEMPT_LOG", "warn")
            .env("XPREEMPT_MPS_CONTROL", &fake)
            .spawn()
            .unwrap();
        let pid_file = dir.join("xpreempt.sock.mps/pipe/nvidia-cuda-mps-control.pid");
        assert!(
            within(Duration::from_secs(10), || std::fs::read_to_string(
                &pid_file
            )
            .is_ok_and(|s| s.ends_with('\n'))
                && std::os::unix::net::UnixStream::connect(&sock).is_ok())
            .is_some(),
            "the daemon and its MPS did not come up"
        );
        let mps: i32 = std::fs::read_to_string(&pid_file)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(alive(mps));
        // SAFETY: kill(2) on our own child.
        assert_eq!(unsafe { libc::kill(child.id() as i32, sig) }, 0);
        let st = child.wait().unwrap();
        assert_eq!(st.code(), Some(0), "{name}: {st:?}");
        assert!(!sock.exists(), "{name}: the socket stayed");
        assert!(
            within(Duration::from_secs(5), || !alive(mps)).is_some(),
            "{name}: the MPS control daemon outlived xpreemptd"
        );
    }
}
