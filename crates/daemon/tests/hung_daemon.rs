//! A daemon that is stopped (SIGSTOP) never holds an application: an agent starts and
//! registers its queues within its timeout and runs them locally; a queue the stopped daemon
//! holds suspended runs again; operator requests fail with a clear timeout. When the daemon
//! continues, the agents join it again.

mod common;

use common::*;
use std::sync::mpsc;
use std::time::{Duration, Instant};
use xpreempt_agent::Declaration;
use xpreempt_core::xqueue::threaded::Preemptible;
use xpreempt_core::{Hints, HwQueue, Level, QueueConfig};
use xpreempt_ipc::msg::Role;
use xpreempt_ipc::operator::{Operator as Op, OperatorError};

/// Runs `f` on a thread and gives up on it after `limit` (a hung call fails the test instead of
/// hanging it).
fn bounded<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit)
        .expect("the call was still waiting on the stopped daemon")
}

fn run_to_completion(
    q: &xpreempt_core::xqueue::threaded::SharedXQueue<xpreempt_hal::reference::RefQueue>,
    dev: &Device,
    n: u64,
) {
    for _ in 0..n {
        q.submit(kernel(1, 1_000_000)).unwrap();
    }
    q.wait_all().unwrap();
    assert_eq!(q.hal().completed(), n);
    for s in 0..n {
        assert_eq!(dev.dev.block_runs(q.hal(), s), vec![1], "command {s}");
    }
}

#[test]
fn an_agent_starts_and_runs_locally_while_the_daemon_is_stopped_then_joins_it() {
    let sock = socket("stopped-start");
    let d = DaemonProcess::start(&sock, &[]);
    d.signal(libc::SIGSTOP);
    let s = sock.clone();
    let t = Instant::now();
    let a = bounded(Duration::from_secs(5), move || agent(&s, "starter"));
    let took = t.elapsed();
    eprintln!("agent start with the daemon stopped: {took:?}");
    assert!(took < Duration::from_millis(500), "{took:?}");
    assert!(!a.is_remote());
    let dev = Device::new();
    let q = queue(&a, &dev, 5);
    run_to_completion(&q, &dev, 5);
    d.signal(libc::SIGCONT);
    assert!(
        within(Duration::from_secs(8), || a.is_remote()).is_some(),
        "the agent did not join the daemon once it continued"
    );
}

#[test]
fn a_queue_registered_while_the_daemon_is_stopped_runs_locally_then_moves_to_it() {
    let sock = socket("stopped-register");
    let d = DaemonProcess::start(&sock, &[]);
    let a = std::sync::Arc::new(agent(&sock, "registrar"));
    assert!(a.is_remote());
    d.signal(libc::SIGSTOP);
    let dev = std::sync::Arc::new(Device::new());
    let (a2, dev2) = (a.clone(), dev.clone());
    let t = Instant::now();
    let q = bounded(Duration::from_secs(5), move || queue(&a2, &dev2, 5));
    let took = t.elapsed();
    eprintln!("registration with the daemon stopped: {took:?}");
    assert!(took < Duration::from_millis(500), "{took:?}");
    run_to_completion(&q, &dev, 5);
    d.signal(libc::SIGCONT);
    assert!(
        within(Duration::from_secs(8), || a.is_remote()
            && a.remote_id(xpreempt_core::QueueId(0)).is_some())
        .is_some(),
        "the queue did not move to the daemon once it continued"
    );
}

#[test]
fn a_queue_a_stopped_daemon_holds_suspended_runs_again() {
    let sock = socket("stopped-hold");
    // EDF has no preemptive order for agents to act on by themselves (no fast path): only the
    // daemon's word suspends the low queue, and only its word could end that suspension.
    let d = DaemonProcess::start(&sock, &["--policy", "edf"]);
    let dev = Device::new();
    let (a, b) = (agent(&sock, "low"), agent(&sock, "high"));
    let low = queue(&a, &dev, 1);
    let urgent = Declaration {
        hints: Hints {
            deadline_ns: Some(1),
            ..Hints::default()
        },
        ..decl(10)
    };
    let high = b
        .queue(
            urgent,
            QueueConfig::new(4, 2, Level::Lv2).unwrap(),
            dev.dev.create_queue(Level::Lv2),
        )
        .expect("queue registers");
    for _ in 0..20 {
        low.submit(kernel(1, 1_000_000)).unwrap();
    }
    high.submit(kernel(1, 300_000_000)).unwrap();
    assert!(
        within(Duration::from_secs(3), || low.is_suspended()).is_some(),
        "the daemon never suspended the low queue"
    );
    d.signal(libc::SIGSTOP);
    high.wait_all().unwrap();
    let resumed = within(Duration::from_secs(5), || !low.is_suspended());
    eprintln!("the low queue ran again {resumed:?} after the high one finished");
    assert!(
        resumed.is_some(),
        "the low queue stayed suspended by a stopped daemon"
    );
    low.wait_all().unwrap();
    assert_eq!(low.hal().completed(), 20);
    for s in 0..20 {
        assert_eq!(dev.dev.block_runs(low.hal(), s), vec![1], "command {s}");
    }
    assert!(Preemptible::stats(&*low).preemptions > 0);
    d.signal(libc::SIGCONT);
}

#[test]
fn an_operator_request_to_a_stopped_daemon_fails_with_a_clear_timeout() {
    let sock = socket("stopped-operator");
    let d = DaemonProcess::start(&sock, &[]);
    // Connected before the stop: the request itself runs out of time.
    let mut before = Op::connect(&sock).unwrap();
    before
        .set_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    d.signal(libc::SIGSTOP);
    let t = Instant::now();
    let s = sock.clone();
    let err = bounded(Duration::from_secs(5), move || {
        Op::connect_within(&s, Role::Operator, "t", Duration::from_millis(300))
            .err()
            .expect("a stopped daemon cannot answer hello")
    });
    assert!(matches!(err, OperatorError::Timeout { .. }), "{err}");
    assert!(
        err.to_string().contains("did not answer within 300 ms"),
        "{err}"
    );
    let err = bounded(Duration::from_secs(5), move || before.list().unwrap_err());
    assert!(err.to_string().contains("did not answer"), "{err}");
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    d.signal(libc::SIGCONT);
}
