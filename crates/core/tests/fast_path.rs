//! Local mode's fast paths: a submission to an idle high queue stops the queues it preempts
//! before its own launch, a submission that fails undoes that, and a stop handed to the
//! preemption thread never outlives the scheduler's wish for it.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use xpreempt_core::sched::local::LocalScheduler;
use xpreempt_core::sched::{QueueInfo, QueueReport, Scheduler};
use xpreempt_core::xqueue::QueueOpError;
use xpreempt_core::xqueue::threaded::{Preemptible, SharedXQueue, TrySubmitError};
use xpreempt_core::{
    Command, CommandProps, HalError, HwQueue, Level, QueueConfig, QueueId, Seq, XQueue, policy,
};
use xpreempt_hal::Launched;
use xpreempt_hal::reference::{RefDevice, RefKernel, RefQueue, WallClock};

/// A low queue that only records whether it is suspended; its stop can be made slow.
#[derive(Default)]
struct Low {
    suspended: AtomicBool,
    slow_stop: AtomicBool,
    /// The thread the last stop ran on.
    stopped_on: Mutex<String>,
}

impl Preemptible for Low {
    fn queue_id(&self) -> QueueId {
        QueueId(0)
    }
    fn suspend(&self) -> Result<Option<QueueReport>, QueueOpError> {
        *self.stopped_on.lock().unwrap() = std::thread::current().name().unwrap_or("").into();
        if self.slow_stop.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(40));
        }
        self.suspended.store(true, Ordering::SeqCst);
        Ok(None)
    }
    fn resume(&self) -> Result<Option<QueueReport>, QueueOpError> {
        self.suspended.store(false, Ordering::SeqCst);
        Ok(None)
    }
    fn stats(&self) -> xpreempt_core::stats::QueueStats {
        xpreempt_core::stats::QueueStats::default()
    }
    fn set_refused(&self, _: bool) {}
}

/// The high queue's hardware: notes at each launch whether the low queue was already stopped,
/// and fails the launches it is told to.
struct Probe {
    inner: RefQueue,
    low: Arc<Low>,
    low_stopped_at_launch: Mutex<Vec<bool>>,
    fail_next: AtomicU32,
}

impl HwQueue for Probe {
    type Payload = RefKernel;
    fn max_level(&self) -> Level {
        self.inner.max_level()
    }
    fn launch(
        &self,
        seq: Seq,
        command: &mut Command<RefKernel>,
        sync_point: bool,
    ) -> Result<(), HalError> {
        self.low_stopped_at_launch
            .lock()
            .unwrap()
            .push(self.low.suspended.load(Ordering::SeqCst));
        if self
            .fail_next
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(HalError::WouldBlock("a launch the test fails"));
        }
        self.inner.launch(seq, command, sync_point)
    }
    fn record_sync(&self) -> Result<(), HalError> {
        self.inner.record_sync()
    }
    fn completed(&self) -> Seq {
        self.inner.completed()
    }
    fn synchronize(&self, upto: Seq) -> Result<(), HalError> {
        self.inner.synchronize(upto)
    }
    fn settled(&self) -> bool {
        self.inner.settled()
    }
    fn deactivate(&self) -> Result<(), HalError> {
        self.inner.deactivate()
    }
    fn reactivate(&self, log: &mut [Launched<RefKernel>]) -> Result<(), HalError> {
        self.inner.reactivate(log)
    }
}

fn kernel() -> Command<RefKernel> {
    Command::kernel(RefKernel {
        blocks: 1,
        block_ns: 1_000_000,
    })
    .with_props(CommandProps::new(false, true, false))
}

/// A busy low queue and an idle high one, under a scheduler whose suspensions run inline (so
/// that what happens before a launch is deterministic).
fn setup(fail_next: u32) -> (Harness, Arc<Low>, Arc<SharedXQueue<Probe>>) {
    let sched = LocalScheduler::start_with(
        Scheduler::new(policy::by_name("hpf").unwrap()),
        Duration::ZERO,
    )
    .unwrap();
    let low = Arc::new(Low::default());
    sched
        .register(QueueInfo::new(QueueId(0), 1), low.clone())
        .unwrap();
    sched.sink().report(
        QueueId(0),
        QueueReport::Ready {
            pending: 1,
            generation: 1,
        },
    );
    let dev = RefDevice::new();
    let clock = WallClock::start(&dev);
    let probe = Probe {
        inner: dev.create_queue(Level::Lv2),
        low: low.clone(),
        low_stopped_at_launch: Mutex::new(Vec::new()),
        fail_next: AtomicU32::new(fail_next),
    };
    let config = QueueConfig::new(4, 2, Level::Lv2).unwrap();
    let high = Arc::new(SharedXQueue::new(
        XQueue::new(QueueId(1), config, probe.max_level()),
        probe,
        Some(sched.sink()),
    ));
    sched
        .register(QueueInfo::new(QueueId(1), 9), high.clone())
        .unwrap();
    ((sched, clock), low, high)
}

/// What the queues need alive: the scheduler, and the clock that runs the reference device.
type Harness = (LocalScheduler, WallClock);

#[test]
fn the_low_queue_is_stopped_before_the_high_queues_first_launch() {
    let (_harness, low, high) = setup(0);
    assert!(!low.suspended.load(Ordering::SeqCst), "runs while alone");
    high.submit(kernel()).unwrap();
    high.submit(kernel()).unwrap();
    let seen = high.hal().low_stopped_at_launch.lock().unwrap().clone();
    assert_eq!(seen, [true, true], "stopped before the first launch");
    high.wait_all().unwrap();
    assert!(
        within(|| !low.suspended.load(Ordering::SeqCst)),
        "resumed once the high queue drained"
    );
}

#[test]
fn a_failed_first_submission_lets_the_low_queue_run_again() {
    let (_harness, low, high) = setup(1);
    let err = high.submit(kernel()).expect_err("the launch fails");
    assert!(matches!(err, TrySubmitError::Launch(_)), "{err}");
    assert_eq!(
        *high.hal().low_stopped_at_launch.lock().unwrap(),
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

#[test]
fn a_resume_decided_while_a_handed_off_stop_runs_leaves_the_queue_running() {
    let sched = LocalScheduler::start(Scheduler::new(policy::by_name("hpf").unwrap())).unwrap();
    let low = Arc::new(Low::default());
    sched
        .register(QueueInfo::new(QueueId(0), 1), low.clone())
        .unwrap();
    let high = Arc::new(Low::default());
    sched
        .register(QueueInfo::new(QueueId(1), 9), Arc::new(High(high)))
        .unwrap();
    let sink = sched.sink();
    let ready = |generation| QueueReport::Ready {
        pending: 1,
        generation,
    };
    let idle = |generation| QueueReport::Idle { generation };
    sink.report(QueueId(0), ready(1));
    // A first preemption (inline) makes the preemption thread spin.
    sink.report(QueueId(1), ready(1));
    assert!(low.suspended.load(Ordering::SeqCst));
    sink.report(QueueId(1), idle(2));
    assert!(!low.suspended.load(Ordering::SeqCst));
    std::thread::sleep(Duration::from_millis(5));
    // Handed off: the stop takes 40 ms, and the high queue is done after 10.
    low.slow_stop.store(true, Ordering::SeqCst);
    sink.report(QueueId(1), ready(3));
    std::thread::sleep(Duration::from_millis(10));
    sink.report(QueueId(1), idle(4));
    std::thread::sleep(Duration::from_millis(60));
    assert_eq!(
        *low.stopped_on.lock().unwrap(),
        "xpreempt-preempt",
        "handed off"
    );
    assert!(
        within(|| !low.suspended.load(Ordering::SeqCst)),
        "the low queue was left stopped with nothing above it"
    );
}

/// The high queue of the test above, under its own id.
struct High(Arc<Low>);

impl Preemptible for High {
    fn queue_id(&self) -> QueueId {
        QueueId(1)
    }
    fn suspend(&self) -> Result<Option<QueueReport>, QueueOpError> {
        self.0.suspend()
    }
    fn resume(&self) -> Result<Option<QueueReport>, QueueOpError> {
        self.0.resume()
    }
    fn stats(&self) -> xpreempt_core::stats::QueueStats {
        xpreempt_core::stats::QueueStats::default()
    }
    fn set_refused(&self, _: bool) {}
}

fn within(mut f: impl FnMut() -> bool) -> bool {
    let end = std::time::Instant::now() + Duration::from_secs(5);
    while std::time::Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    false
}
