//! A suspension the test controls: under a real daemon (on a private socket), a high-priority
//! process (`hold`) keeps the device with a gated kernel while a low-priority one (`suspended`)
//! launches. Its launches wait in the buffer for certain; a stream query says not ready though the
//! device has nothing of that stream; a record, a stream synchronize and a context synchronize
//! made meanwhile wait without getting the queue resumed ahead of the holder (no priority
//! inversion); when the holder lets go, everything completes (no deadlock) and a stream waiting
//! for the event waits for the record made behind the buffered launches, not the earlier one.

use crate::harness::{Config, Outcome, Proc, build, native};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use xpreempt_core::sched::protocol::QueueState;
use xpreempt_ipc::msg::QueueRow;
use xpreempt_ipc::operator::Operator;

pub(crate) const PATIENCE: Duration = Duration::from_secs(30);

pub(crate) fn under_daemon(socket: &Path, priority: i32) -> Config {
    Config {
        name: format!("daemon-p{priority}"),
        shim: true,
        queued: true,
        env: vec![
            ("XPREEMPT_INTERCEPT".into(), "1".into()),
            ("XPREEMPT_SOCKET".into(), socket.display().to_string()),
            ("XPREEMPT_PRIORITY".into(), priority.to_string()),
            // Only the suspension holds launches back, never the window.
            ("XPREEMPT_WINDOW".into(), "1000".into()),
        ],
    }
}

fn rows_of(rows: &[QueueRow], pid: u32) -> Vec<&QueueRow> {
    rows.iter().filter(|r| r.process == pid).collect()
}

/// The process's queues are suspended where it matters: in the process (its queues counted
/// more suspensions than resumes), not only in the daemon's view (whose state says whether a
/// queue has work).
pub(crate) fn held(rows: &[QueueRow], pid: u32) -> bool {
    let mine = rows_of(rows, pid);
    !mine.is_empty() && mine.iter().all(|r| r.preemptions > r.resumes)
}

pub(crate) fn holding(rows: &[QueueRow], pid: u32) -> bool {
    rows_of(rows, pid)
        .iter()
        .any(|r| r.state == QueueState::Running)
}

/// A daemon of the test's own on a private socket (named `tag`). A holder's gated kernel makes no
/// progress on purpose: the watchdog must not step in.
pub(crate) fn private_daemon(tag: &str) -> (xpreempt_daemon::Daemon, PathBuf) {
    let dir = build().dir.join(format!("{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("xpreempt.sock");
    let mut config = xpreempt_daemon::Config::new(socket.clone());
    config.watchdog = Duration::from_secs(120);
    let daemon = xpreempt_daemon::Daemon::start(config).expect("the daemon starts");
    (daemon, socket)
}

/// Starts the high-priority `hold` process under the daemon at `socket` and waits until the
/// daemon shows it running and `low` suspended in its own process.
pub(crate) fn hold_off(socket: &Path, low: &Proc) -> (Proc, Operator) {
    let mut holder = Proc::spawn("hold", &under_daemon(socket, 10), &[]);
    holder.expect("@holding");
    let mut op = Operator::connect(socket).expect("the operator connects");
    wait_until_held(&mut op, holder.child.id(), low.child.id());
    (holder, op)
}

/// The holder lets go, then `low` finishes.
pub(crate) fn release(mut holder: Proc, mut low: Proc) -> Outcome {
    holder.send("release");
    holder.finish();
    low.send("finish");
    low.finish()
}

fn wait_until_held(op: &mut Operator, holder: u32, low: u32) {
    let t = Instant::now();
    loop {
        let rows = op.list().expect("list");
        if holding(&rows, holder) && held(&rows, low) {
            return;
        }
        assert!(
            t.elapsed() < PATIENCE,
            "the low process was never suspended: {rows:#?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn submitted(log: &Path, id: i64) -> bool {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .any(|l| l.starts_with("submit ") && l.split(' ').any(|f| f == format!("id={id}")))
}

#[test]
fn launches_held_by_a_suspension_are_waited_for_without_inversion_or_deadlock() {
    let (daemon, socket) = private_daemon("daemon");

    let mut low = Proc::spawn("suspended", &under_daemon(&socket, 0), &[]);
    low.expect("@ready");
    let (holder, mut op) = hold_off(&socket, &low);
    let (low_pid, holder_pid) = (low.child.id(), holder.child.id());

    low.send("go");
    low.expect("@blocked");
    // While the holder holds, the low process's blocked record and synchronizes leave its queue
    // suspended and its buffered kernels off the device.
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(300) {
        let rows = op.list().expect("list");
        assert!(
            held(&rows, low_pid) && holding(&rows, holder_pid),
            "the low process's queue ran while the holder held the device: {rows:#?}"
        );
        assert!(
            !submitted(&low.log, 2) && !submitted(&low.log, 3),
            "a suspended queue's kernel reached the driver (log {})",
            low.log.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    low.send("check");
    low.expect("@checked");
    let o = release(holder, low);
    assert!(o.buffered >= 2, "{}: nothing was buffered", o.label);
    o.log.assert_in_order(&[1, 2, 3]);
    o.log.assert_before(3, 4);
    drop(daemon);
}

/// A queue's work stops lower queues once its application waits for it, not at its launch:
/// the holder's gated kernel leaves the low process running until the holder queries its
/// stream, queries an event behind it, or asks for a host function behind it; so too on a
/// per-thread stream, and in pass-through mode.
#[test]
fn work_stops_lower_queues_once_it_is_waited_for() {
    for how in ["query", "event", "callback"] {
        once_waited_for(how, &[]);
    }
    once_waited_for("query", &[("HOLD_STREAM", "per-thread")]);
    once_waited_for("query", &[("XPREEMPT_PASS_THROUGH", "1")]);
}

fn once_waited_for(how: &str, env: &[(&str, &str)]) {
    let tag: String = env
        .iter()
        .map(|(k, _)| format!("-{}", k.to_lowercase()))
        .collect();
    let (daemon, socket) = private_daemon(&format!("waited-{how}{tag}"));
    let mut low = Proc::spawn("suspended", &under_daemon(&socket, 0), &[]);
    low.expect("@ready");
    let mut holder_env = vec![("HOLD_WAIT", how)];
    holder_env.extend_from_slice(env);
    let mut holder = Proc::spawn("hold-late", &under_daemon(&socket, 10), &holder_env);
    holder.expect("@launched");
    let mut op = Operator::connect(&socket).expect("the operator connects");
    let (low_pid, holder_pid) = (low.child.id(), holder.child.id());
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(300) {
        let rows = op.list().expect("list");
        assert!(
            !rows_of(&rows, holder_pid).is_empty() && !held(&rows, low_pid),
            "{how} {env:?}: the low process was suspended for work nobody waits for: {rows:#?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    holder.send("wait");
    holder.expect("@holding");
    wait_until_held(&mut op, holder_pid, low_pid);
    low.send("go");
    low.expect("@blocked");
    low.send("check");
    low.expect("@checked");
    let o = release(holder, low);
    o.log.assert_in_order(&[1, 2, 3]);
    drop(daemon);
}

/// The same conversation with the simulated driver alone: the application's checks are CUDA's.
#[test]
fn the_suspension_scenario_holds_on_the_driver_alone() {
    let mut low = Proc::spawn("suspended", &native(), &[]);
    low.expect("@ready");
    low.send("go");
    low.expect("@blocked");
    low.send("check");
    low.expect("@checked");
    low.send("finish");
    let o = low.finish();
    o.log.assert_in_order(&[1, 2, 3]);
    o.log.assert_before(3, 4);
}

/// A per-thread default stream is gated like any other: while the holder holds the device, a
/// launch on the low process's per-thread stream neither reaches the driver nor returns (its
/// thread alone can name the stream, so the launch waits there); when the holder lets go it runs.
#[test]
fn a_suspended_per_thread_stream_launches_nothing() {
    let (daemon, socket) = private_daemon("per-thread");
    let mut low = Proc::spawn("per-thread-held", &under_daemon(&socket, 0), &[]);
    low.expect("@ready");
    let (holder, _op) = hold_off(&socket, &low);
    low.send("go");
    low.expect("@blocked");
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        !submitted(&low.log, 22),
        "a suspended per-thread stream's kernel reached the driver (log {})",
        low.log.display()
    );
    low.send("check");
    low.expect("@checked");
    let o = release(holder, low);
    o.log.assert_in_order(&[21, 22]);
    drop(daemon);
}

/// The same conversation with the simulated driver alone.
#[test]
fn the_per_thread_scenario_holds_on_the_driver_alone() {
    let mut low = Proc::spawn("per-thread-held", &native(), &[]);
    low.expect("@ready");
    low.send("go");
    low.expect("@blocked");
    low.send("check");
    low.expect("@checked");
    low.send("finish");
    low.finish().log.assert_in_order(&[21, 22]);
}
