//! `--mps`: the daemon starts an MPS control daemon in private directories, reports its pipe
//! directory, and stops it on exit; when MPS cannot start it says why and serves time-sliced.
//! A fake control program (a shell script with the real one's start/quit protocol) stands in for
//! `nvidia-cuda-mps-control`, which needs a GPU.

use std::path::Path;
use std::time::{Duration, Instant};
use xpreempt_daemon::{Config, Daemon};
use xpreempt_ipc::operator::Operator;

/// `-d`: write the pid file and serve `quit` on the control FIFO in the background, like the real
/// program; otherwise: pass stdin to the FIFO, like `echo quit | nvidia-cuda-mps-control`.
const FAKE: &str = r#"#!/bin/bash
pipe=$CUDA_MPS_PIPE_DIRECTORY
if [ "$1" = "-d" ]; then
  mkfifo "$pipe/control" || exit 1
  (
    echo $BASHPID > "$pipe/nvidia-cuda-mps-control.pid"
    echo started >> "$CUDA_MPS_LOG_DIRECTORY/control.log"
    while true; do
      if read -r cmd < "$pipe/control"; then
        echo "$cmd" >> "$CUDA_MPS_LOG_DIRECTORY/control.log"
        if [ "$cmd" = quit ]; then rm -f "$pipe/control" "$pipe/nvidia-cuda-mps-control.pid"; exit 0; fi
      fi
    done
  ) </dev/null >/dev/null 2>&1 &
  exit 0
fi
cat > "$pipe/control"
"#;

fn alive(pid: i32) -> bool {
    // SAFETY: reaping our own (adopted) child without blocking, then probing with signal 0.
    unsafe {
        libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG);
        libc::kill(pid, 0) == 0
    }
}

fn mps_pipe(socket: &Path) -> Option<String> {
    Operator::connect(socket)
        .expect("operator connects")
        .stats()
        .expect("stats")
        .mps_pipe
}

/// One test: it sets XPREEMPT_MPS_CONTROL for the whole process.
#[test]
fn the_daemon_owns_an_mps_control_daemon_and_falls_back_when_it_cannot_start() {
    // The fake's background loop is orphaned when its parent exits; adopting orphans lets this
    // process see it exit (no zombie left for an init that may not reap).
    // SAFETY: prctl on this process.
    assert_eq!(unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1) }, 0);
    let dir = std::env::temp_dir().join(format!("xpreempt-mps-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let fake = dir.join("fake-mps-control");
    std::fs::write(&fake, FAKE).unwrap();
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    // SAFETY: no other thread of this test binary reads the environment now.
    unsafe { std::env::set_var("XPREEMPT_MPS_CONTROL", &fake) };

    let socket = dir.join("xpreempt.sock");
    let mps_dir = dir.join("xpreempt.sock.mps");
    let mut config = Config::new(socket.clone());
    config.mps = Some(mps_dir.clone());
    let daemon = Daemon::start(config.clone()).expect("daemon starts");
    let pipe = mps_pipe(&socket).expect("the daemon reports its MPS pipe directory");
    assert_eq!(Path::new(&pipe), mps_dir.join("pipe"));
    let pid: i32 = std::fs::read_to_string(mps_dir.join("pipe/nvidia-cuda-mps-control.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(alive(pid), "the control daemon runs");
    let mode = std::fs::metadata(mps_dir.join("pipe")).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
        0o700,
        "private pipe directory"
    );

    daemon.stop();
    let deadline = Instant::now() + Duration::from_secs(5);
    while alive(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!alive(pid), "the control daemon quit with xpreemptd");
    assert!(!mps_dir.exists(), "its directories are removed");

    // A control program that fails: the daemon serves anyway, time-sliced, and says so.
    // SAFETY: as above.
    unsafe { std::env::set_var("XPREEMPT_MPS_CONTROL", "/bin/false") };
    let daemon = Daemon::start(config.clone()).expect("daemon starts without MPS");
    assert_eq!(mps_pipe(&socket), None);
    daemon.stop();
    let err = xpreempt_daemon::mps::Mps::start(&mps_dir).unwrap_err();
    assert!(err.to_string().contains("exited with"), "{err}");

    // SAFETY: as above.
    unsafe { std::env::set_var("XPREEMPT_MPS_CONTROL", dir.join("no-such-program")) };
    let err = xpreempt_daemon::mps::Mps::start(&mps_dir).unwrap_err();
    assert!(err.to_string().contains("could not run"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
