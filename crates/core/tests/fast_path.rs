//! Local mode's fast paths: a submission to an idle high queue stops the queues it preempts
//! before its own launch (or, while the preemption thread spins, has that thread stop them as the
//! stop plan says and then decide, during the launch), a submission that fails undoes that, neither an announcement nor
//! a stop handed to the preemption thread outlives the scheduler's wish for it, and no queue's
//! resumption keeps the scheduler from deciding meanwhile.

mod common;

use common::{ThreadProbe, ready, within};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use xpreempt_core::policy::{Decision, Policy, QueueView, View};
use xpreempt_core::sched::local::LocalScheduler;
use xpreempt_core::sched::{DEFAULT_HOT, QueueInfo, QueueReport, Scheduler};
use xpreempt_core::xqueue::threaded::{ReportSink, SharedXQueue, TrySubmitError};
use xpreempt_core::{Command, CommandProps, HwQueue, Level, QueueConfig, QueueId, XQueue, policy};
use xpreempt_hal::faulty::Faults;
use xpreempt_hal::observed::Observed;
use xpreempt_hal::reference::{RefDevice, RefKernel, RefQueue, WallClock};

fn kernel() -> Command<RefKernel> {
    Command::kernel(RefKernel {
        blocks: 1,
        block_ns: 1_000_000,
    })
    .with_props(CommandProps::new(false, true, false))
}

/// The high queue's hardware, noting at each launch whether the low queue was already stopped.
type Probe = Observed<RefQueue, Faults>;
type Seen = Arc<Mutex<Vec<bool>>>;

/// A busy low queue and an idle high one, under a scheduler whose suspensions run inline (so
/// that what happens before a launch is deterministic).
fn setup(fail_next: u32) -> (Harness, Arc<ThreadProbe>, Arc<SharedXQueue<Probe>>, Seen) {
    let sched = LocalScheduler::start_with(
        Scheduler::new(policy::by_name("hpf").unwrap()),
        Duration::ZERO,
    )
    .unwrap();
    let low = Arc::new(ThreadProbe::default());
    sched
        .register(QueueInfo::new(QueueId(0), 1), low.clone())
        .unwrap();
    sched.sink().report(QueueId(0), ready(1));
    let dev = RefDevice::new();
    let clock = WallClock::start(&dev);
    let seen = Seen::default();
    let (watched, noted) = (low.clone(), seen.clone());
    let faults = Faults::default().before_launch(move || {
        let stopped = watched.suspended.load(Ordering::SeqCst);
        noted.lock().unwrap().push(stopped);
    });
    faults.fail_next(fail_next);
    let probe = Observed::new(dev.create_queue(Level::Lv2), faults);
    let config = QueueConfig::new(4, 2, Level::Lv2).unwrap();
    let high = Arc::new(SharedXQueue::new(
        XQueue::new(QueueId(1), config, probe.max_level()),
        probe,
        Some(sched.sink()),
    ));
    sched
        .register(QueueInfo::new(QueueId(1), 9), high.clone())
        .unwrap();
    ((sched, clock), low, high, seen)
}

/// What the queues need alive: the scheduler, and the clock that runs the reference device.
type Harness = (LocalScheduler, WallClock);

#[test]
fn the_low_queue_is_stopped_before_the_high_queues_first_launch() {
    let (_harness, low, high, seen) = setup(0);
    assert!(!low.suspended.load(Ordering::SeqCst), "runs while alone");
    high.submit(kernel()).unwrap();
    high.submit(kernel()).unwrap();
    assert_eq!(
        *seen.lock().unwrap(),
        [true, true],
        "stopped before the first launch"
    );
    high.wait_all().unwrap();
    assert!(
        within(|| !low.suspended.load(Ordering::SeqCst)),
        "resumed once the high queue drained"
    );
}

#[test]
fn a_failed_first_submission_lets_the_low_queue_run_again() {
    let (_harness, low, high, seen) = setup(1);
    let err = high.submit(kernel()).expect_err("the launch fails");
    assert!(matches!(err, TrySubmitError::Launch(_)), "{err}");
    assert_eq!(
        *seen.lock().unwrap(),
        [true],
        "it was stopped ahead of the launch"
    );
    assert!(
        !low.suspended.load(Ordering::SeqCst),
        "the high queue has no work, so the low one runs again"
    );
    // The next submission goes through and stops it again.
    high.submit(kernel()).unwrap();
    assert!(low.suspended.load(Ordering::SeqCst));
    high.wait_all().unwrap();
    assert!(within(|| !low.suspended.load(Ordering::SeqCst)));
}

/// A low queue (0, priority 1, returned) and a high one (1, priority 9) under HPF, whose
/// preemption thread spins for `hot` after a preemption.
fn low_and_high(hot: Duration) -> (LocalScheduler, Arc<ThreadProbe>) {
    let low = Arc::new(ThreadProbe::default());
    let sched = low_and_high_under(policy::by_name("hpf").unwrap(), hot, low.clone());
    (sched, low)
}

/// `low` (queue 0, priority 1) and a high queue (1, priority 9) under `policy`.
fn low_and_high_under(
    policy: Box<dyn Policy>,
    hot: Duration,
    low: Arc<ThreadProbe>,
) -> LocalScheduler {
    let sched = LocalScheduler::start_with(Scheduler::new(policy), hot).unwrap();
    sched
        .register(QueueInfo::new(QueueId(0), 1), low.clone())
        .unwrap();
    sched
        .register(
            QueueInfo::new(QueueId(1), 9),
            Arc::new(ThreadProbe {
                id: 1,
                ..ThreadProbe::default()
            }),
        )
        .unwrap();
    sched
}

/// The low queue busy and running, and the preemption thread spinning after a first request of
/// the high queue.
fn busy_low_spinning(sched: &LocalScheduler, low: &ThreadProbe) {
    let sink = sched.sink();
    sink.report(QueueId(0), ready(1));
    sink.report(QueueId(1), ready(1));
    sink.report(QueueId(1), QueueReport::Idle { generation: 2 });
    assert!(within(|| sched.preemption_thread_spins()));
    assert!(within(|| !low.suspended.load(Ordering::SeqCst)));
}

#[test]
fn a_resume_decided_while_a_handed_off_stop_runs_leaves_the_queue_running() {
    let (sched, low) = low_and_high(DEFAULT_HOT);
    let sink = sched.sink();
    let idle = |generation| QueueReport::Idle { generation };
    sink.report(QueueId(0), ready(1));
    // A first preemption (inline) makes the preemption thread spin.
    sink.report(QueueId(1), ready(1));
    assert!(low.suspended.load(Ordering::SeqCst));
    sink.report(QueueId(1), idle(2));
    assert!(!low.suspended.load(Ordering::SeqCst));
    assert!(
        within(|| sched.preemption_thread_spins()),
        "the preemption thread spins"
    );
    // Handed off: the stop takes 40 ms, and the high queue is done after 10.
    low.slow_stop.store(true, Ordering::SeqCst);
    sink.report(QueueId(1), ready(3));
    std::thread::sleep(Duration::from_millis(10));
    sink.report(QueueId(1), idle(4));
    std::thread::sleep(Duration::from_millis(60));
    assert_eq!(
        low.suspended_on.lock().unwrap().last().map(String::as_str),
        Some("xpreempt-preempt"),
        "handed off"
    );
    assert!(
        within(|| !low.suspended.load(Ordering::SeqCst)),
        "the low queue was left stopped with nothing above it"
    );
}

#[test]
fn a_resumption_under_way_does_not_hold_up_the_high_queues_next_ready() {
    let (sched, low) = low_and_high(Duration::ZERO);
    let sink = sched.sink();
    sink.report(QueueId(0), ready(1));
    sink.report(QueueId(1), ready(1));
    assert!(low.suspended.load(Ordering::SeqCst));
    // The high queue's Idle resumes the low one, and that resumption hangs (a driver call
    // waiting behind the low queue's own launch).
    low.hold_resume.store(true, Ordering::SeqCst);
    let (idle_sink, idle_done) = (sink.clone(), std::sync::mpsc::channel());
    let idle_thread = std::thread::spawn(move || {
        idle_sink.report(QueueId(1), QueueReport::Idle { generation: 2 });
        idle_done.0.send(()).ok();
    });
    assert!(within(|| low.resuming.load(Ordering::SeqCst)));
    // The next request's Ready is decided meanwhile: it must not wait for the resumption.
    let (ready_sink, ready_done) = (sink.clone(), std::sync::mpsc::channel());
    let ready_thread = std::thread::spawn(move || {
        ready_sink.report(QueueId(1), ready(3));
        ready_done.0.send(()).ok();
    });
    let decided = ready_done.1.recv_timeout(Duration::from_secs(5));
    low.hold_resume.store(false, Ordering::SeqCst);
    assert!(
        decided.is_ok(),
        "the Ready waited for the low queue's resumption"
    );
    idle_done.1.recv_timeout(Duration::from_secs(5)).unwrap();
    idle_thread.join().unwrap();
    ready_thread.join().unwrap();
    // The resumption landed after the Ready's decision; the low queue ends stopped again.
    assert!(
        within(|| low.suspended.load(Ordering::SeqCst) && !low.resuming.load(Ordering::SeqCst)),
        "the low queue runs beside the high queue's work"
    );
}

#[test]
fn a_stop_the_busy_preemption_thread_could_not_take_is_made_by_the_next_ready() {
    let (sched, [a, b, _], _) = spinning_trio();
    let sink = sched.sink();
    keep_the_preemption_thread_busy(&a, &*sink);
    // ...while the high queue's announcement waits for it.
    let stops_before = b.suspended_on.lock().unwrap().len();
    sink.submitting(QueueId(2));
    assert!(
        !b.suspended.load(Ordering::SeqCst),
        "nothing stopped `b` yet"
    );
    // The high queue's Ready after its first launch makes that stop itself.
    sink.report(QueueId(2), ready(3));
    assert!(
        b.suspended.load(Ordering::SeqCst),
        "`b` kept running behind the high queue's launches"
    );
    std::thread::sleep(Duration::from_millis(60));
    let on = b.suspended_on.lock().unwrap()[stops_before..].to_vec();
    assert_eq!(on.len(), 1, "stopped once: {on:?}");
    assert_ne!(on[0], "xpreempt-preempt", "made by the reporting thread");
}

/// The names of the threads decisions ran on, in order.
type Threads = Arc<Mutex<Vec<String>>>;

/// HPF that notes the thread each decision ran on.
struct NotingThreads {
    hpf: Box<dyn Policy>,
    threads: Threads,
}

impl Policy for NotingThreads {
    fn name(&self) -> &'static str {
        "hpf-noting-threads"
    }
    fn decide(&mut self, view: &View<'_>) -> Decision {
        let name = std::thread::current().name().unwrap_or("").to_string();
        self.threads.lock().unwrap().push(name);
        self.hpf.decide(view)
    }
    fn preemption_rank(&self, queue: &QueueView) -> Option<i64> {
        self.hpf.preemption_rank(queue)
    }
}

/// Queues `a` (priority 1), `b` (2) and a high one (9) under a scheduler whose decisions note
/// their threads, with the preemption thread made to spin by a first preemption.
fn spinning_trio() -> (LocalScheduler, [Arc<ThreadProbe>; 3], Threads) {
    let threads = Arc::new(Mutex::new(Vec::new()));
    let policy = NotingThreads {
        hpf: policy::by_name("hpf").unwrap(),
        threads: threads.clone(),
    };
    let sched = LocalScheduler::start(Scheduler::new(Box::new(policy))).unwrap();
    let probe = |id| {
        Arc::new(ThreadProbe {
            id,
            ..ThreadProbe::default()
        })
    };
    let (a, b, high) = (probe(0), probe(1), probe(2));
    for (q, priority) in [(&a, 1), (&b, 2), (&high, 9)] {
        sched
            .register(QueueInfo::new(QueueId(q.id), priority), q.clone())
            .unwrap();
    }
    let sink = sched.sink();
    sink.report(QueueId(0), ready(1));
    sink.report(QueueId(2), ready(1));
    assert!(a.suspended.load(Ordering::SeqCst));
    sink.report(QueueId(2), QueueReport::Idle { generation: 2 });
    assert!(!a.suspended.load(Ordering::SeqCst));
    assert!(
        within(|| sched.preemption_thread_spins()),
        "the preemption thread spins"
    );
    (sched, [a, b, high], threads)
}

#[test]
fn while_the_preemption_thread_spins_it_decides_on_an_announcement_itself() {
    let (sched, [a, _, _], threads) = spinning_trio();
    let sink = sched.sink();
    threads.lock().unwrap().clear();
    sink.submitting(QueueId(2));
    assert!(
        within(|| a.suspended.load(Ordering::SeqCst)),
        "the announcement stopped `a`"
    );
    let me = std::thread::current().name().unwrap_or("").to_string();
    // The stop plan stops `a` before the decision.
    assert!(
        within(|| !threads.lock().unwrap().is_empty()),
        "no decision"
    );
    let seen = threads.lock().unwrap().clone();
    assert!(
        seen.iter().all(|t| t == "xpreempt-preempt" && *t != me),
        "decided on {seen:?}"
    );
    sink.report(QueueId(2), ready(3));
    sink.report(QueueId(2), QueueReport::Idle { generation: 4 });
    assert!(within(|| !a.suspended.load(Ordering::SeqCst)));
}

/// Makes the preemption thread take a stop of `a` (queue 0) that lasts 40 ms, for `b`'s Ready.
fn keep_the_preemption_thread_busy(a: &ThreadProbe, sink: &dyn ReportSink) {
    a.slow_stop.store(true, Ordering::SeqCst);
    sink.report(QueueId(1), ready(1));
    assert!(within(|| a.suspended_on.lock().unwrap().len() == 2));
    assert_eq!(
        a.suspended_on.lock().unwrap()[1],
        "xpreempt-preempt",
        "handed off"
    );
}

/// The preemption thread busy with a 40 ms stop of `a` while the high queue announces a
/// submission, then `take_back` on the high queue; `b` must never be stopped.
fn announcement_taken_back(take_back: impl FnOnce(&dyn ReportSink)) {
    let (sched, [a, b, _], _) = spinning_trio();
    let sink = sched.sink();
    keep_the_preemption_thread_busy(&a, &*sink);
    let stops_before = b.suspended_on.lock().unwrap().len();
    sink.submitting(QueueId(2));
    take_back(&*sink);
    std::thread::sleep(Duration::from_millis(60));
    let stops = b.suspended_on.lock().unwrap()[stops_before..].to_vec();
    assert!(
        stops.is_empty(),
        "`b` was stopped for an announcement taken back, on {stops:?}"
    );
    assert!(!b.suspended.load(Ordering::SeqCst));
}

#[test]
fn a_failed_submission_takes_back_an_announcement_not_decided_on() {
    announcement_taken_back(|sink| sink.submit_failed(QueueId(2)));
}

#[test]
fn the_queues_idle_supersedes_an_announcement_not_decided_on() {
    announcement_taken_back(|sink| sink.report(QueueId(2), QueueReport::Idle { generation: 4 }));
}

/// HPF that notes, at each decision, whether queue `a` was already stopped.
struct NotingStops {
    hpf: Box<dyn Policy>,
    a: Arc<ThreadProbe>,
    seen: Arc<Mutex<Vec<bool>>>,
}

impl Policy for NotingStops {
    fn name(&self) -> &'static str {
        "hpf-noting-stops"
    }
    fn decide(&mut self, view: &View<'_>) -> Decision {
        self.seen
            .lock()
            .unwrap()
            .push(self.a.suspended.load(Ordering::SeqCst));
        self.hpf.decide(view)
    }
    fn preemption_rank(&self, queue: &QueueView) -> Option<i64> {
        self.hpf.preemption_rank(queue)
    }
}

#[test]
fn the_spinning_preemption_thread_stops_the_low_queue_before_it_decides_on_the_announcement() {
    let a = Arc::new(ThreadProbe::default());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let policy = NotingStops {
        hpf: policy::by_name("hpf").unwrap(),
        a: a.clone(),
        seen: seen.clone(),
    };
    let sched = low_and_high_under(Box::new(policy), DEFAULT_HOT, a.clone());
    busy_low_spinning(&sched, &a);
    let sink = sched.sink();
    seen.lock().unwrap().clear();
    sink.submitting(QueueId(1));
    assert!(within(|| a.suspended.load(Ordering::SeqCst)));
    assert!(within(|| !seen.lock().unwrap().is_empty()));
    assert!(
        seen.lock().unwrap()[0],
        "the announcement was decided on before the low queue's stop"
    );
    let stops = a.suspended_on.lock().unwrap().clone();
    assert_eq!(
        stops.last().map(String::as_str),
        Some("xpreempt-preempt"),
        "stopped on {stops:?}"
    );
    assert_eq!(stops.len(), 2, "one stop per request: {stops:?}");
    // The decision confirmed the stop: the Idle lets the low queue go, and nothing stops it again.
    sink.report(QueueId(1), ready(3));
    sink.report(QueueId(1), QueueReport::Idle { generation: 4 });
    assert!(within(|| !a.suspended.load(Ordering::SeqCst)));
    std::thread::sleep(Duration::from_millis(30));
    assert!(!a.suspended.load(Ordering::SeqCst));
    assert_eq!(a.suspended_on.lock().unwrap().len(), 2);
}

/// HPF whose decisions wait while `gate` is shut.
struct Gated {
    hpf: Box<dyn Policy>,
    gate: Arc<std::sync::atomic::AtomicBool>,
    waited: Arc<std::sync::atomic::AtomicBool>,
}

impl Policy for Gated {
    fn name(&self) -> &'static str {
        "hpf-gated"
    }
    fn decide(&mut self, view: &View<'_>) -> Decision {
        while self.gate.load(Ordering::SeqCst) {
            self.waited.store(true, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(1));
        }
        self.hpf.decide(view)
    }
    fn preemption_rank(&self, queue: &QueueView) -> Option<i64> {
        self.hpf.preemption_rank(queue)
    }
}

#[test]
fn the_high_queues_ready_does_not_wait_for_the_decision_on_its_announcement() {
    let gate = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let waited = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let policy = Gated {
        hpf: policy::by_name("hpf").unwrap(),
        gate: gate.clone(),
        waited: waited.clone(),
    };
    let a = Arc::new(ThreadProbe::default());
    let sched = low_and_high_under(Box::new(policy), DEFAULT_HOT, a.clone());
    busy_low_spinning(&sched, &a);
    let sink = sched.sink();
    // The preemption thread stops `a` and then sits in the decision until the gate opens.
    let checks = sched.stats().checks;
    gate.store(true, Ordering::SeqCst);
    sink.submitting(QueueId(1));
    assert!(
        within(|| a.suspended.load(Ordering::SeqCst)),
        "the stop comes first"
    );
    assert!(within(|| waited.load(Ordering::SeqCst)), "deciding");
    let (tx, rx) = std::sync::mpsc::channel();
    let reporter = sink.clone();
    std::thread::spawn(move || {
        reporter.report(QueueId(1), ready(3));
        tx.send(()).ok();
    });
    let returned = rx.recv_timeout(Duration::from_secs(5)).is_ok();
    gate.store(false, Ordering::SeqCst);
    assert!(returned, "the Ready waited for the decision");
    // Applied after the decision: the announcement's decision and the Ready's.
    assert!(
        within(|| sched.stats().checks >= checks + 2),
        "the queued Ready was not decided on"
    );
    // In order: the Idle after them lets `a` go.
    sink.report(QueueId(1), QueueReport::Idle { generation: 4 });
    assert!(within(|| !a.suspended.load(Ordering::SeqCst)));
    std::thread::sleep(Duration::from_millis(30));
    assert!(!a.suspended.load(Ordering::SeqCst), "stopped again");
}
