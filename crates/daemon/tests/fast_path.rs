//! The fast path: agents of one user stop and restart each other's queues through their board
//! while the daemon cannot answer at all (stopped with SIGSTOP), and not without the fast path;
//! a queue alone on its device does not wake the daemon for its Ready/Idle.

mod common;

use common::*;
use std::time::Duration;
use xpreempt_core::HwQueue;
use xpreempt_core::xqueue::threaded::Preemptible;
use xpreempt_ipc::msg::{ClientMsg, DaemonMsg};

/// Gives `low` `n` commands of 4 ms (enough that a loaded CI machine still sees it busy), and
/// stops the daemon once it has seen the queues (its list shows the low one busy).
fn stop_the_daemon_once_busy(
    d: &DaemonProcess,
    sock: &std::path::Path,
    low: &xpreempt_core::xqueue::threaded::SharedXQueue<xpreempt_hal::reference::RefQueue>,
    n: usize,
) {
    for _ in 0..n {
        low.submit(kernel(2, 2_000_000)).unwrap();
    }
    let mut op = Operator::connect(sock);
    assert!(
        within(Duration::from_secs(5), || op
            .list()
            .iter()
            .any(|r| r.in_flight > 0))
        .is_some()
    );
    d.signal(libc::SIGSTOP);
}

/// A low queue kept busy, a high queue in another agent submits while the daemon is stopped:
/// returns whether the low queue was suspended meanwhile, and whether it then ran again (both
/// before the daemon continues). Every command still runs exactly once.
fn high_submits_while_the_daemon_is_stopped(name: &str, args: &[&str]) -> (bool, bool) {
    let sock = socket(name);
    let d = DaemonProcess::start(&sock, args);
    let dev = Device::new();
    let (a, b) = (agent(&sock, "low"), agent(&sock, "high"));
    assert!(a.is_remote() && b.is_remote());
    let low = queue(&a, &dev, 1);
    let high = queue(&b, &dev, 10);
    stop_the_daemon_once_busy(&d, &sock, &low, 100);
    let preemptions = || Preemptible::stats(&*low).preemptions;
    high.submit(kernel(1, 20_000_000)).unwrap();
    // Counted, not read from the state: a thread that gets no CPU for the high kernel's 20 ms
    // could miss the whole suspension.
    let suspended = within(Duration::from_millis(300), || preemptions() > 0).is_some();
    high.wait_all().unwrap();
    let resumed = suspended && within(Duration::from_millis(300), || !low.is_suspended()).is_some();
    d.signal(libc::SIGCONT);
    low.wait_all().unwrap();
    assert_eq!(low.hal().completed(), 100);
    for s in 0..100 {
        assert_eq!(dev.dev.block_runs(low.hal(), s), vec![1, 1], "command {s}");
    }
    (suspended, resumed)
}

#[test]
fn a_higher_queue_stops_and_restarts_a_lower_one_through_the_board_without_the_daemon() {
    let (suspended, resumed) = high_submits_while_the_daemon_is_stopped("board", &[]);
    assert!(suspended, "the board did not stop the low queue");
    assert!(
        resumed,
        "the low queue did not run again when the high one went idle"
    );
}

fn wakeups(op: &mut Operator) -> u64 {
    match op.ask(&ClientMsg::Stats) {
        DaemonMsg::Stats(s) => s.fast_path_wakeups,
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_queue_alone_on_its_device_reports_without_waking_the_daemon() {
    let sock = socket("quiet");
    let _d = daemon(&sock);
    let dev = Device::new();
    let a = agent(&sock, "alone");
    let q = queue(&a, &dev, 5);
    let mut op = Operator::connect(&sock);
    // Registration's own wake-ups are over.
    std::thread::sleep(Duration::from_millis(50));
    let before = wakeups(&mut op);
    for _ in 0..20 {
        q.submit(kernel(1, 10_000)).unwrap();
        q.wait_all().unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
    let quiet = wakeups(&mut op) - before;
    assert!(
        quiet < 10,
        "{quiet} wake-ups for 20 requests of a queue alone on its device"
    );
    // The operator still sees what it does (reports are read on demand): busy, then idle.
    for _ in 0..20 {
        q.submit(kernel(4, 1_000_000)).unwrap();
    }
    assert!(
        within(Duration::from_secs(2), || op.list()[0].state
            != xpreempt_core::sched::protocol::QueueState::Idle)
        .is_some()
    );
    q.wait_all().unwrap();
    // A second queue on the device: both ring again, and the first one's work is decided on.
    let b = agent(&sock, "second");
    let other = queue(&b, &dev, 1);
    // Request by request: a daemon that gets no CPU for a while takes several rings in one
    // wake-up.
    for request in 0..10 {
        let seen = wakeups(&mut op);
        q.submit(kernel(1, 10_000)).unwrap();
        q.wait_all().unwrap();
        assert!(
            within(Duration::from_secs(2), || wakeups(&mut op) > seen).is_some(),
            "request {request}: a queue that shares its device must wake the daemon"
        );
    }
    for _ in 0..10 {
        other.submit(kernel(2, 500_000)).unwrap();
    }
    q.submit(kernel(1, 5_000_000)).unwrap();
    assert!(
        within(Duration::from_secs(2), || Preemptible::stats(&*other)
            .preemptions
            > 0)
        .is_some(),
        "the higher queue did not preempt the lower one"
    );
    q.wait_all().unwrap();
    other.wait_all().unwrap();
}

/// A connected agent's queue whose first launch fails: its bit went up on the board before the
/// launch, so the queue it preempts in another agent may have been stopped; the bit must come
/// down again (the failed submission takes it down, and the agent's sweep of stale bits would
/// within two heartbeats), or that queue stays stopped with nobody running. The daemon is
/// stopped, so only the board can restart it.
#[test]
fn a_failed_first_launch_takes_the_bit_down_and_the_low_queue_runs_again() {
    use xpreempt_hal::faulty::Faults;
    use xpreempt_hal::observed::Observed;
    let sock = socket("failed-launch");
    let d = DaemonProcess::start(&sock, &[]);
    let dev = Device::new();
    let (a, b) = (agent(&sock, "low"), agent(&sock, "high"));
    assert!(a.is_remote() && b.is_remote());
    let low = queue(&a, &dev, 1);
    let faults = Faults::default();
    faults.fail_next(1);
    let high = b
        .queue(
            decl(10),
            xpreempt_core::QueueConfig::new(4, 2, xpreempt_core::Level::Lv2).unwrap(),
            Observed::new(dev.dev.create_queue(xpreempt_core::Level::Lv2), faults),
        )
        .expect("queue registers");
    stop_the_daemon_once_busy(&d, &sock, &low, 150);

    assert!(
        high.submit(kernel(1, 1_000_000)).is_err(),
        "the launch fails"
    );
    assert!(
        within(Duration::from_millis(300), || !low.is_suspended()).is_some(),
        "the low queue stayed stopped for a high queue with no work"
    );
    let before = low.hal().completed();
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        low.hal().completed() > before && !low.is_suspended(),
        "the low queue did not run after the failed launch ({before} completed before)"
    );

    // The next submission goes through, and stops and restarts the low queue as usual.
    let preemptions = Preemptible::stats(&*low).preemptions;
    high.submit(kernel(1, 20_000_000)).unwrap();
    assert!(
        within(Duration::from_millis(300), || Preemptible::stats(&*low)
            .preemptions
            > preemptions)
        .is_some()
    );
    high.wait_all().unwrap();
    assert!(within(Duration::from_millis(300), || !low.is_suspended()).is_some());
    d.signal(libc::SIGCONT);
    low.wait_all().unwrap();
    for s in 0..150 {
        assert_eq!(dev.dev.block_runs(low.hal(), s), vec![1, 1], "command {s}");
    }
}

/// A queue above every other queue of its device, all on its board, rings the daemon for its
/// reports from its completion watcher instead of the application's threads (and its waiter
/// reports its Idle): the daemon must still hear of its work and of its end, and decide on
/// them (nothing here asks the daemon to read the reports).
#[test]
fn a_queue_whose_reports_ring_late_is_still_decided_on() {
    let sock = socket("late");
    let _d = daemon(&sock);
    let dev = Device::new();
    let (a, b) = (agent(&sock, "low"), agent(&sock, "high"));
    let low = queue(&a, &dev, 1);
    let high = queue(&b, &dev, 10);
    let mut op = Operator::connect(&sock);
    let decided = |op: &mut Operator| match op.ask(&ClientMsg::Stats) {
        DaemonMsg::Stats(s) => s.devices.iter().fold((0, 0), |(p, r), d| {
            (p + d.scheduler.preemptions, r + d.scheduler.resumes)
        }),
        other => panic!("{other:?}"),
    };
    for _ in 0..30 {
        low.submit(kernel(2, 20_000_000)).unwrap();
    }
    for round in 0..5 {
        let (preempted, resumed) = decided(&mut op);
        high.submit(kernel(1, 50_000_000)).unwrap();
        assert!(
            within(Duration::from_secs(2), || decided(&mut op).0 > preempted).is_some(),
            "round {round}: the daemon did not decide on the high queue's work"
        );
        high.wait_all().unwrap();
        assert!(
            within(Duration::from_secs(2), || decided(&mut op).1 > resumed).is_some(),
            "round {round}: the daemon did not decide on the high queue's end"
        );
    }
    low.wait_all().unwrap();
    for s in 0..30 {
        assert_eq!(dev.dev.block_runs(low.hal(), s), vec![1, 1], "command {s}");
    }
}

/// Two threads that spin until dropped: a loaded machine, as the benches see on two cores.
struct Load(
    std::sync::Arc<std::sync::atomic::AtomicBool>,
    Vec<std::thread::JoinHandle<()>>,
);

impl Load {
    fn start(threads: usize) -> Self {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let hogs = (0..threads)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                })
            })
            .collect();
        Self(stop, hogs)
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
        for h in self.1.drain(..) {
            let _ = h.join();
        }
    }
}

/// Whether a Ready can be lost on the daemon path, or only be late: on a loaded machine, a
/// higher queue whose work lasts long enough for the lower queue's agent to get a core always
/// stops the lower queue while it still has work. (A stop that comes after the higher queue's
/// work is done is no longer needed and is not made: `xpreempt bench-request`'s "not stopped".)
#[test]
fn a_ready_is_never_lost_under_load_only_late() {
    let sock = socket("not-lost");
    let _d = DaemonProcess::start(&sock, &[]);
    let dev = Device::new();
    let (a, b) = (agent(&sock, "be"), agent(&sock, "lc"));
    let low = queue(&a, &dev, 0);
    let high = queue(&b, &dev, 10);
    let _load = Load::start(2);
    let rounds = std::env::var("XPREEMPT_TEST_NOT_LOST_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40u64);
    let mut latencies = Vec::new();
    for round in 0..rounds {
        for _ in 0..30 {
            low.submit(kernel(1, 2_000_000)).unwrap();
        }
        // The low queue runs again before the next Ready.
        assert!(within(Duration::from_secs(5), || !low.is_suspended()).is_some());
        let before = Preemptible::stats(&*low).preemptions;
        let t = std::time::Instant::now();
        high.submit(kernel(1, 100_000_000)).unwrap();
        let stopped = within(Duration::from_secs(5), || {
            Preemptible::stats(&*low).preemptions > before
        });
        let done_before_stop = high.hal().completed() == round + 1;
        let Some(_) = stopped else {
            panic!("round {round}: the Ready was lost: the low queue was never stopped");
        };
        latencies.push(t.elapsed());
        assert!(
            !done_before_stop,
            "round {round}: the stop came only after the high queue's 100 ms of work ({:?})",
            t.elapsed()
        );
        high.wait_all().unwrap();
    }
    low.wait_all().unwrap();
    latencies.sort();
    eprintln!(
        "{rounds} Readies under load, every one stopped the low queue: median {:?}, max {:?}",
        latencies[latencies.len() / 2],
        latencies[latencies.len() - 1]
    );
}
