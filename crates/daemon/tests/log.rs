//! `xpreemptd` as a service runs it, its stderr a log file: plain text, no colour codes.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn the_log_file_holds_no_colour_codes() {
    let dir = std::env::temp_dir().join(format!("xpreemptd-log-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("xpreempt.sock");
    let log = dir.join("xpreemptd.log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_xpreemptd"))
        .arg("--socket")
        .arg(&sock)
        .env("XPREEMPT_LOG", "info")
        // Colour must stay off because stderr is a file, whatever NO_COLOR says.
        .env_remove("NO_COLOR")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let t = Instant::now();
    while std::os::unix::net::UnixStream::connect(&sock).is_err() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "xpreemptd did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: kill(2) on our own child, not yet waited for.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert!(child.wait().unwrap().success());
    let text = std::fs::read_to_string(&log).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(text.contains("xpreemptd serving"), "{text}");
    assert!(
        !text.contains('\u{1b}'),
        "ANSI codes in the log file:\n{text:?}"
    );
}
