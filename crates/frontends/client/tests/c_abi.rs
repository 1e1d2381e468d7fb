//! The C ABI against a real daemon: a process raises its own priority and sets hints; errors come
//! back as -1 with a reason; the header compiles and matches the struct layout.

use std::ffi::CStr;
use std::sync::Mutex;
use std::time::Duration;
use xpreempt::{XpreemptHints, xpreempt_last_error, xpreempt_set_hints, xpreempt_set_priority};
use xpreempt_core::{Hints, Level, QueueConfig};
use xpreempt_hal::reference::RefDevice;

/// The library reads the socket path from the environment: one test at a time sets it.
static ENV: Mutex<()> = Mutex::new(());

fn last_error() -> String {
    // SAFETY: the library returns a valid, NUL-terminated string owned by this thread.
    unsafe { CStr::from_ptr(xpreempt_last_error()) }
        .to_string_lossy()
        .into_owned()
}

#[test]
fn a_process_changes_its_own_priority_and_hints_through_the_daemon() {
    let _env = ENV.lock().unwrap();
    let dir = std::env::temp_dir().join(format!("xpreempt-capi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("xpreempt.sock");
    // SAFETY: no other thread reads the environment while the lock is held.
    unsafe { std::env::set_var("XPREEMPT_SOCKET", &sock) };
    assert_eq!(xpreempt_set_priority(5), -1, "no daemon yet");
    assert!(
        last_error().contains("no xpreempt daemon"),
        "{}",
        last_error()
    );

    let daemon =
        xpreempt_daemon::Daemon::start(xpreempt_daemon::Config::new(sock.clone())).unwrap();
    let agent = xpreempt_agent::Agent::start(xpreempt_agent::Options {
        socket: sock.clone(),
        ..Default::default()
    })
    .unwrap();
    let dev = RefDevice::new();
    let decl = xpreempt_agent::Declaration {
        device: 0,
        priority: 1,
        hints: Hints::default(),
        interleave: None,
        level: Level::Lv2,
    };
    let _q = agent
        .queue(decl, QueueConfig::default(), dev.create_queue(Level::Lv2))
        .unwrap();
    assert_eq!(xpreempt_set_priority(42), 1, "{}", last_error());
    let mut op = xpreempt_ipc::operator::Operator::connect(&sock).unwrap();
    assert_eq!(op.list().unwrap()[0].logical_priority, 42);

    let hints = XpreemptHints {
        timeslice_ns: 2_000_000,
        latency_critical: 1,
        ..XpreemptHints::default()
    };
    // SAFETY: a valid pointer to a local struct.
    assert_eq!(unsafe { xpreempt_set_hints(&hints) }, 1, "{}", last_error());
    let bad = XpreemptHints {
        utilization_share: 1.5,
        latency_critical: -1,
        ..XpreemptHints::default()
    };
    // SAFETY: as above; and NULL is allowed.
    assert_eq!(unsafe { xpreempt_set_hints(&bad) }, -1);
    assert!(last_error().contains("1.5"), "{}", last_error());
    assert_eq!(unsafe { xpreempt_set_hints(std::ptr::null()) }, -1);

    // A restarted daemon is found again on the next call.
    drop(agent);
    daemon.stop();
    std::thread::sleep(Duration::from_millis(50));
    let _d2 = xpreempt_daemon::Daemon::start(xpreempt_daemon::Config::new(sock.clone())).unwrap();
    assert_eq!(
        xpreempt_set_priority(3),
        -1,
        "no queues of this process on the new daemon"
    );
    assert!(last_error().contains("has no queues"), "{}", last_error());
}

#[test]
fn the_header_compiles_and_its_struct_matches() {
    let include = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../include");
    let dir = std::env::temp_dir().join(format!("xpreempt-capi-h-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("t.c");
    std::fs::write(
        &src,
        r#"#include <xpreempt.h>
#include <stddef.h>
#include <stdio.h>
int main(void) {
    printf("%zu %zu %zu %zu %zu\n", sizeof(struct xpreempt_hints),
        offsetof(struct xpreempt_hints, deadline_ns), offsetof(struct xpreempt_hints, utilization_share),
        offsetof(struct xpreempt_hints, timeslice_ns), offsetof(struct xpreempt_hints, latency_critical));
    int (*f)(int) = xpreempt_set_priority; (void)f;
    return 0;
}
"#,
    )
    .unwrap();
    let exe = dir.join("t");
    // Only the layout is run; the functions are declared, not called, so no link is needed.
    let cc = std::process::Command::new("gcc")
        .args([
            "-std=c11",
            "-Wall",
            "-Werror",
            "-Wno-unused-variable",
            "-I",
            include,
        ])
        .arg(&src)
        .arg("-Wl,--unresolved-symbols=ignore-all")
        .arg("-o")
        .arg(&exe)
        .output()
        .expect("gcc");
    assert!(
        cc.status.success(),
        "{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let out = std::process::Command::new(&exe).output().unwrap();
    let got = String::from_utf8(out.stdout).unwrap();
    let want = format!(
        "{} {} {} {} {}\n",
        size_of::<XpreemptHints>(),
        std::mem::offset_of!(XpreemptHints, deadline_ns),
        std::mem::offset_of!(XpreemptHints, utilization_share),
        std::mem::offset_of!(XpreemptHints, timeslice_ns),
        std::mem::offset_of!(XpreemptHints, latency_critical)
    );
    assert_eq!(got, want);
}
